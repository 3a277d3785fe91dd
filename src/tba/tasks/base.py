"""The Task interface: what a verifiable task gives the rest of `tba`.

A task is data plus a verifier. The searcher needs train prompts and `reward`; the evaluator needs test
prompts and `reward` again (greedy pass@1 is the mean reward of greedy completions); the SFT warm start
needs `demonstrations`. Nothing else in the package knows what the task is about, so a new task is one
file that returns a `Task`, named in the config as `task.name: path/to/file.py:factory` or
`package.module:factory` (see docs/tasks.md); tba.tasks.prepare.build_task builds every task, registered or not.

Two optional methods serve rewards that are models rather than rules (a reward model, a victim LM plus a
toxicity classifier): `rewards(prompts, completions, finished)` scores a whole batch at once (one forward
pass instead of N) and sees whether each response ended with EOS (the TL;DR reward penalises those that did
not); `eval_metrics(prompts, completions, finished)` adds held-out metrics (win rate, attack success rate,
diversity) to the mean reward that evaluation always reports. A task whose response space is small enough
to enumerate may define `exact_metrics(policy, reference, tokenizer, scoring)`: evaluation then hands it the
models and the run's `Scoring` (how responses are sampled and scored), and it reports properties of the
whole distribution π_θ rather than of sampled completions (the `enumerable` task: KL to π*).
"""

from __future__ import annotations

import inspect
import math
import traceback
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Prompt:
    """One problem. `id` is its index in the task's train (or test) list; `answer` is the gold answer text."""

    id: int
    text: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Scoring:
    """How a run samples and scores responses, for a task's `exact_metrics`: log π is of logits ÷ `temperature`
    (the trainer's log π_θ and the searchers' log π_ref alike), a response has at most `max_new_tokens` tokens
    (EOS included when it stops), the sampler keeps the `top_p` nucleus, and `beta` is the β of the run's last
    update (its target π* ∝ π_ref·exp(r/β))."""

    temperature: float
    max_new_tokens: int
    beta: float
    top_p: float = 1.0


class Task(Protocol):
    name: str
    train: list[Prompt]
    test: list[Prompt]

    def reward(self, prompt: Prompt, completion: str) -> float:
        """Scalar reward of `completion` (the decoded response, special tokens removed) for `prompt`."""
        ...

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        """One demonstration completion per prompt, used by the SFT warm start."""
        ...

    # Optional (looked up with getattr; a task may define neither):
    #   def rewards(self, prompts: list[Prompt], completions: list[str], finished: list[bool]) -> list[float]
    #       Batched reward; used instead of `reward` when present. finished[i]: response i ended with EOS.
    #   def eval_metrics(self, prompts: list[Prompt], completions: list[str], finished: list[bool]) -> dict
    #       Extra held-out metrics {name: float} of the evaluation completions.
    #   def exact_metrics(self, policy, reference, tokenizer, scoring: Scoring) -> dict
    #       Metrics of the whole distribution π_θ, computed exactly (every response enumerated).


def checked_reward(task: Task, prompt: Prompt, completion: str) -> float:
    """`task.reward` as a finite float; raises ValueError if the reward function returns NaN/inf."""
    value = float(task.reward(prompt, completion))
    if not math.isfinite(value):
        raise ValueError(f"reward returned {value}")
    return value


def batch_rewards(task: Task, prompts: list[Prompt], completions: list[str], finished: list[bool],
                  completion_ids: list[list[int]] | None = None) -> tuple[list[float | None], str | None]:
    """Rewards of a batch: `task.rewards` if the task has it, else `task.reward` one by one. A `rewards` that
    names a `completion_ids` parameter also gets the responses' token ids.

    Returns (values, last error): a value is None where the reward raised, was not finite or was None (a
    batched reward that raises fails the whole batch), and the error text says which prompt and why, for the log.
    """
    n = len(completions)
    if not len(prompts) == n == len(finished):
        raise ValueError(f"batch_rewards: {len(prompts)} prompts, {n} completions, {len(finished)} flags")
    batched = getattr(task, "rewards", None)
    if batched is None:
        values, error = [], None
        for p, c in zip(prompts, completions, strict=True):
            try:
                values.append(checked_reward(task, p, c))
            except Exception:
                values.append(None)
                error = f"prompt {p.id}: {traceback.format_exc(limit=-2).strip()}"
        return values, error
    try:
        extra = {"completion_ids": completion_ids} if "completion_ids" in inspect.signature(batched).parameters else {}
        raw = [math.nan if v is None else float(v) for v in batched(prompts, completions, finished, **extra)]
        if len(raw) != n:
            raise ValueError(f"task.rewards returned {len(raw)} values for {n} completions")
    except Exception:
        ids = sorted({p.id for p in prompts})
        return [None] * n, f"prompts {ids[:8]}: {traceback.format_exc(limit=-2).strip()}"
    bad = [i for i, v in enumerate(raw) if not math.isfinite(v)]
    error = f"prompt {prompts[bad[-1]].id}: reward returned {raw[bad[-1]]}" if bad else None
    return [v if math.isfinite(v) else None for v in raw], error


def accuracy(task: Task, prompts: list[Prompt], completions: list[str], finished: list[bool] | None = None,
             completion_ids: list[list[int]] | None = None) -> float:
    """Mean reward over prompts, i.e. pass@1 when the completions are greedy and the reward is 0/1.
    A reward that raises or is not finite scores 0 here (evaluation must not stop a run). `finished` (did
    each completion end with EOS) matters to rewards that penalise unfinished ones; None = all finished."""
    if not prompts:
        return float("nan")
    values, _ = batch_rewards(task, prompts, completions, finished or [True] * len(completions), completion_ids)
    return sum(v or 0.0 for v in values) / len(prompts)
