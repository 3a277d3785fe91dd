"""GSM8K: grade-school math word problems with a 0/1 final-number reward, as in the TBA paper.

The reward follows the paper exactly (delete commas, take the last number, compare as floats) rather than a
stricter "#### N" parser, so that pass@1 numbers are comparable with the paper's. The data can come from the
Hub (`openai/gsm8k`, config `main`) or, since training machines are often offline, from a local copy.
"""

from __future__ import annotations

import re
from pathlib import Path

from tba.tasks.base import Prompt

PROMPT_TEMPLATE = "[MATH TASK] Problem:\n{question}\n\nSolution:\n"

# Ints, decimals ("3.", ".5", "2.25") and exponents ("1e5"), each with an optional sign. The decimal
# alternatives come first so "2.25" is one number, not "2" then ".25".
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
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


def _local_file(source: str, split: str) -> Path | None:
    """The local file holding `split`, None if `source` names no local path (then it is a Hub name).

    A directory is searched for `{split}.jsonl`/`.json`/`.parquet` (or a Hub snapshot's
    `**/{split}-*.parquet`); a single file is used for whatever split is asked, so pass a directory when
    train and test must differ.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        candidates = [path / f"{split}{suffix}" for suffix in _LOCAL_SUFFIXES]
        found = [c for c in candidates if c.is_file()] or sorted(path.glob(f"**/{split}-*.parquet"))
        if not found:
            names = ", ".join(c.name for c in candidates)
            raise FileNotFoundError(f"gsm8k: no {names} (or {split}-*.parquet) in directory {path}")
        return found[0]
    if path.suffix in _LOCAL_SUFFIXES:
        if not path.is_file():
            raise FileNotFoundError(f"gsm8k: data file {path} does not exist")
        return path
    return None


def _validate(rows: list[dict], where: str) -> None:
    """Fail loudly on a malformed row rather than train on empty prompts or an ungradeable answer."""
    for i, row in enumerate(rows):
        for name in _FIELDS:
            value = row.get(name)
            if value is None:
                raise ValueError(f"gsm8k row {i} of {where}: missing field {name!r}")
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"gsm8k row {i} of {where}: field {name!r} must be a non-empty string")
        if extract_answer(row["answer"]) is None:
            raise ValueError(f"gsm8k row {i} of {where}: gold answer has no number: {row['answer']!r}")


def load_rows(source: str, split: str) -> list[dict]:
    """Rows (dicts with `question` and `answer`) of `split` from a local file/directory or a Hub dataset.

    An offline Hub load becomes a RuntimeError that says how to point at a local copy instead, since the
    raw `datasets` error does not.
    """
    import datasets  # deferred: importing datasets costs ~1 s, which callers of the reward need not pay

    local = _local_file(source, split)
    if local is not None:
        builder = _LOCAL_SUFFIXES.get(local.suffix, "parquet")
        rows = datasets.load_dataset(builder, data_files=str(local), split="train").to_list()
        where = str(local)
    else:
        try:
            rows = datasets.load_dataset(source, "main", split=split).to_list()
        # ConnectionError, OfflineModeIsEnabled, FileNotFoundError...: to the user they all mean the same.
        except Exception as e:
            raise RuntimeError(
                f"gsm8k: could not load {source!r} (split {split!r}) from the Hugging Face Hub, which "
                f"looks unreachable ({type(e).__name__}: {e}); no local path {source!r} exists either. "
                "Pass a local copy instead, e.g. task.source=/path/to/gsm8k_dir_or_file.jsonl (a directory "
                "holding train.jsonl and test.jsonl, or .parquet). Set HF_HUB_OFFLINE=1 to skip Hub retries."
            ) from e
        where = f"{source} ({split})"
    _validate(rows, where)
    return rows


class GSM8KTask:
    """The GSM8K `Task`: prompts in the paper's template, gold solutions as SFT demonstrations."""

    name = "gsm8k"

    def __init__(
        self,
        source: str = "openai/gsm8k",
        train_size: int | None = None,
        test_size: int | None = None,
        template: str = PROMPT_TEMPLATE,
    ) -> None:
        self.source = source
        self.template = template
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
