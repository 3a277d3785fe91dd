"""`reasoning_gym`: any reasoning-gym dataset as a verifiable task for a pretrained (instruction) model.

reasoning-gym generates problems offline from a seed and ships a verifier per dataset
(`score_answer`: 1.0 for a correct answer, partial credit for some datasets). This task asks the dataset's
question followed by a short instruction ("Reply with the answer only.") and scores the response's
*final answer*: the text inside `<answer>…</answer>` if the model wrote the tags, else (`extract: line`, the
default) the first non-empty line with a trailing period removed, or (`extract: last_number`, for numeric
datasets) the last number in the response, as GSM8K is scored. Nothing is parsed more cleverly than that
on purpose: with `line`, a response that buries its answer in prose earns only the verifier's partial credit
(for most datasets len(answer) ÷ len(response) when the answer occurs in it), so RL has a format to learn as
well as the task, and a reward that guessed at prose could be gamed.

Held-out problems come from seed + 1; any question that also occurs in train is removed from train. reasoning-gym
draws item i from Random(seed + i), so that stream is the train stream shifted by one: train keeps about
train_size − test_size problems (kept so: a different split would change every recipe's problems and results).
Set `task.chat_template=true` for chat models (the recipes do). This task has no demonstrations, so it
cannot warm-start the builtin tiny model; use a pretrained policy (`recipes/smollm2_rg_cpu.yaml`).
"""

from __future__ import annotations

import re

import reasoning_gym

from tba.errors import ConfigError
from tba.tasks.base import Prompt
from tba.tasks.gsm8k import extract_answer

INSTRUCTION = "Reply with the answer only."
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
EXTRACTORS = ("line", "last_number")


def final_answer(completion: str, extract: str = "line") -> str:
    """The answer a response gives: `<answer>` tags if present; else `line`: its first non-empty line minus a
    final '.'; `last_number`: its last number ("" if none), written as an integer when it is one."""
    tagged = _TAGGED.search(completion)
    if tagged:
        return tagged.group(1).strip()
    if extract == "last_number":
        value = extract_answer(completion)
        return "" if value is None else str(int(value)) if value.is_integer() else str(value)
    line = next((s.strip() for s in completion.splitlines() if s.strip()), "")
    return line[:-1].rstrip() if line.endswith(".") else line


class ReasoningGymTask:
    def __init__(self, dataset: str, train_size: int | None = 2000, test_size: int | None = 200, seed: int = 1234,
                 options: dict | None = None, instruction: str = INSTRUCTION, extract: str = "line"):
        if dataset not in reasoning_gym.factory.DATASETS:
            raise ConfigError(f"task.options.dataset: reasoning-gym has no dataset {dataset!r} "
                              f"(reasoning_gym.factory.DATASETS lists {len(reasoning_gym.factory.DATASETS)})")
        if extract not in EXTRACTORS:
            raise ConfigError(f"task.options.extract: {extract!r} is not one of {list(EXTRACTORS)}")
        self.name, self.extract = f"reasoning_gym/{dataset}", extract
        try:
            test = reasoning_gym.create_dataset(dataset, size=test_size or 200, seed=seed + 1, **(options or {}))
            train = reasoning_gym.create_dataset(dataset, size=train_size or 2000, seed=seed, **(options or {}))
        except (TypeError, ValueError, AssertionError) as e:
            raise ConfigError(f"task.options.options: reasoning-gym rejected the options for {dataset!r}: "
                              f"{type(e).__name__}: {e}") from None
        self._scorer = train  # score_answer depends on the dataset's type and options, not on its seed
        held_out = {e["question"] for e in test}
        suffix = f"\n{instruction}" if instruction else ""
        kept = [e for e in train if e["question"] not in held_out]
        self.train = [Prompt(i, e["question"] + suffix, str(e["answer"]), {"entry": e}) for i, e in enumerate(kept)]
        self.test = [Prompt(i, e["question"] + suffix, str(e["answer"]), {"entry": e}) for i, e in enumerate(test)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        """reasoning-gym's own verifier on the response's final answer (see `final_answer`)."""
        answer = final_answer(completion, self.extract)
        return float(self._scorer.score_answer(answer=answer, entry=prompt.meta["entry"]))

    def eval_metrics(self, prompts: list[Prompt], completions: list[str], finished: list[bool]) -> dict[str, float]:
        """`exact`: the share of responses with full credit. `eval/score` is the mean reward, which counts
        reasoning-gym's partial credit (e.g. 0.67 for "690" when the answer is 69: the answer occurs in it)."""
        full = sum(self.reward(p, c) == 1.0 for p, c in zip(prompts, completions, strict=True))
        return {"exact": full / len(prompts) if prompts else float("nan")}
