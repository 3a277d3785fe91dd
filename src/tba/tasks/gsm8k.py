"""GSM8K: grade-school math word problems with a 0/1 final-number reward, as in the TBA paper.

The reward follows the paper exactly (delete commas, take the last number, compare as floats) rather than a
stricter "#### N" parser, so that pass@1 numbers are comparable with the paper's. The data can come from the
Hub (`openai/gsm8k`, config `main`) or, since training machines are often offline, from a local copy.
"""

from __future__ import annotations

import re

from tba.tasks.base import Prompt
from tba.tasks.data import DataLoadError, load_split

PROMPT_TEMPLATE = "[MATH TASK] Problem:\n{question}\n\nSolution:\n"

# Ints, decimals ("3.", ".5", "2.25") and exponents ("1e5"), each with an optional sign. The decimal
# alternatives come first so "2.25" is one number, not "2" then ".25".
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_FIELDS = ("question", "answer")


def extract_answer(text: str) -> float | None:
    """The last number in `text` (commas deleted first, so "1,234" is 1234), or None if there is none.

    The gold solutions end with "#### N", so the same function reads both gold answers and completions.
    """
    numbers = _NUMBER.findall(text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def gsm8k_reward(completion: str, answer: str) -> float:
    """1.0 iff the completion's last number equals the gold answer's last number (as floats), else 0.0."""
    predicted = extract_answer(completion)
    return 1.0 if predicted is not None and predicted == extract_answer(answer) else 0.0


def load_rows(source: str, split: str) -> list[dict]:
    """Rows (dicts with `question` and `answer`) of `split` from a local file/directory or a Hub dataset;
    a malformed row, or a gold answer without a number, fails naming the row."""
    rows, where = load_split(source, split, task="gsm8k", fields=_FIELDS, hub_config="main", local_hint=(
        "task.options.source=/path/to/gsm8k_dir_or_file.jsonl (a directory holding train.jsonl and test.jsonl, "
        "or .parquet)"))
    for i, row in enumerate(rows):
        if extract_answer(row["answer"]) is None:
            raise DataLoadError(f"gsm8k row {i} of {where}: gold answer has no number: {row['answer']!r}")
    return rows


class GSM8KTask:
    """The GSM8K `Task`: prompts in the paper's template, gold solutions as SFT demonstrations."""

    name = "gsm8k"

    def __init__(
        self,
        source: str = "openai/gsm8k",
        train_size: int | None = None,
        test_size: int | None = None,
        prompt_template: str | None = None,
    ) -> None:
        """source: a Hub name or a local jsonl/parquet file or directory; prompt_template: field {question}
        (None = the paper's `[MATH TASK] Problem:...`)."""
        self.source = source
        self.template = prompt_template or PROMPT_TEMPLATE
        self.train = self._prompts(load_rows(source, "train")[:train_size])
        self.test = self._prompts(load_rows(source, "test")[:test_size])

    def _prompts(self, rows: list[dict]) -> list[Prompt]:
        return [
            Prompt(id=i, text=self.template.format(question=row["question"]), answer=row["answer"], meta={})
            for i, row in enumerate(rows)
        ]

    def reward(self, prompt: Prompt, completion: str) -> float:
        return gsm8k_reward(completion, prompt.answer)

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        """The gold solutions (reasoning with <<calc>> notes, ending "#### N"); `seed` is unused: one each."""
        return [p.answer for p in prompts]
