"""The task interface: what a verifiable task gives the rest of `tba`, declared once.

A task is data plus a verifier. The searcher needs train prompts and a reward; the evaluator needs test prompts
and the reward again (greedy pass@1 is the mean reward of greedy completions); the SFT warm start needs
`demonstrations`. Nothing else in the package knows what the task is about, so a new task is one file that
returns a `Task` (single-turn: `reward`), an `EpisodicTask` (multi-turn: `environment`) or an `AgentTask` (episodes
the user's own code runs against an endpoint: `run_agent`), named in the config as
`task.name: path/to/file.py:factory` or `package.module:factory` (docs/tasks.md, docs/environments.md).

Every optional hook is listed in `OPTIONAL_HOOKS`, with what it is for. `TaskAdapter` is the task as the rest of
tba uses it: made once (tba.tasks.prepare.build_task), it looks each hook up once and gives the default where a
task has none, so no other module asks a task what it can do.
"""

from __future__ import annotations

import inspect
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tba.errors import ConfigError, UserError, raised


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
    """A single-turn task: each completion is scored by `reward`."""

    name: str
    train: list[Prompt]
    test: list[Prompt]

    def reward(self, prompt: Prompt, completion: str) -> float:
        """Scalar reward of `completion` (the decoded response, special tokens removed) for `prompt`."""


class Environment(Protocol):
    """One episode of a multi-turn task (tba's protocol: docs/environments.md); `reset(prompt)` is optional."""

    def step(self, action: str) -> str | None:
        """The text after the policy's turn `action` (decoded, special tokens removed), or None to end."""

    def get_reward(self) -> float:
        """The episode's reward, once it is over."""


class EpisodicTask(Protocol):
    """A multi-turn task: each sample is an episode against a fresh environment (tba.rollout.episodes)."""

    name: str
    train: list[Prompt]
    test: list[Prompt]

    def environment(self, prompt: Prompt) -> Environment:
        """A fresh environment for one episode of `prompt`."""


class AgentTask(Protocol):
    """Episodes from outside: the user's code drives the policy through an endpoint in front of the searcher's
    sampler, and the ids it served become the samples (tba.tasks.agent, tba.rollout.outside, tba.serve.agents)."""

    name: str
    train: list[Prompt]
    test: list[Prompt]
    concurrency: int | None
    """Episodes running at once per searcher (None: one search batch's worth)."""
    timeout_s: float
    """An episode running longer is abandoned (`timeout`)."""
    on_break: str
    """A call that does not extend its session's ids: "new_sample" or "drop"."""

    def run_agent(self, prompt: Prompt, *, base_url: str, api_key: str, model: str) -> object:
        """Run one episode of `prompt`; returns what the user's function returned."""

    def score(self, prompt: Prompt, value, completion: str) -> tuple[float | None, dict[str, float]]:
        """The episode's reward from the function's `value` and its last response `completion` (None: unscored),
        and each reward source's value."""


OPTIONAL_HOOKS = {
    "rewards": "rewards(prompts, completions, finished[, completion_ids]) -> list[float | None]: the whole batch "
               "at once (a reward model's one forward pass); used instead of `reward`",
    "demonstrations": "demonstrations(prompts, seed) -> list[str] (episodic: list[list[str]], the policy's turns): "
                      "the SFT warm start and data.source=task",
    "corpus": "corpus() -> list[str]: text the builtin model's tokenizer is trained on",
    "eval_metrics": "eval_metrics(prompts, completions, finished) -> dict: held-out metrics besides the mean reward",
    "exact_metrics": "exact_metrics(policy, reference, tokenizer, scoring) -> dict: metrics of the whole "
                     "distribution π_θ, every response enumerated",
    "reward_metrics": "reward_metrics() -> dict: metrics of the last batch scored (each reward function's mean)",
    "episode_metrics": "episode_metrics(episodes) -> dict: held-out metrics of an episodic task's episodes",
    "use_tokenizer": "use_tokenizer(tokenizer): the run's tokenizer, once prompts are rendered (an environment "
                     "that writes chat turns needs it)",
}
"""Every hook a task may define besides its kind's required ones, and what it is for."""


class RewardError(UserError, ValueError):
    """A reward function broke its contract (what it returned, not a failure on one completion): every batch
    would fail the same way, so the run stops, naming the function."""

    label = "reward error"


def raised_in(who: str, e: Exception) -> str:
    """What raised, on the first line — `e.raised_in` where the code that called it named the function (the dataset
    task names the reward function), else `who` — and the traceback after it, for the log file."""
    return f"{raised(getattr(e, 'raised_in', who), e)}\n{traceback.format_exc(limit=-2).strip()}"


def _finite(value, who: str, what: str) -> float | None:
    """`value` as a float, None where it is None or not finite; RewardError where it is not a number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) and not hasattr(value, "__float__"):
        raise RewardError(f"{who} returned {value!r} ({type(value).__name__}) {what}; it must return a number "
                          "(or None to skip)")
    value = float(value)
    return value if math.isfinite(value) else None


class TaskAdapter:
    """A task as tba uses it: its hooks looked up once, each with its default (`OPTIONAL_HOOKS`).

    `train`/`test` are the task's own lists (rendering and length limits replace them on the task itself, so a
    task's methods see what the searchers see)."""

    def __init__(self, task):
        self.task = task
        self.name = getattr(task, "name", type(task).__name__)
        self.episodic = callable(getattr(task, "environment", None))
        self.agentic = callable(getattr(task, "run_agent", None))
        self.hooks: dict[str, Callable] = {h: fn for h in OPTIONAL_HOOKS if callable(fn := getattr(task, h, None))}
        self._reward = getattr(task, "reward", None)
        self._rewards_take_ids = ("rewards" in self.hooks
                                  and "completion_ids" in inspect.signature(self.hooks["rewards"]).parameters)

    @classmethod
    def of(cls, task) -> TaskAdapter:
        return task if isinstance(task, TaskAdapter) else cls(task)

    def missing(self) -> list[str]:
        """What the task lacks of its kind's required surface."""
        scored = self.episodic or self.agentic or self._reward is not None or "rewards" in self.hooks
        return [a for a in ("name", "train", "test") if not hasattr(self.task, a)] + (
            [] if scored else ["reward (or environment, or run_agent)"])

    @property
    def train(self) -> list[Prompt]:
        return self.task.train

    @train.setter
    def train(self, prompts: list[Prompt]) -> None:
        self.task.train = prompts

    @property
    def test(self) -> list[Prompt]:
        return self.task.test

    @test.setter
    def test(self, prompts: list[Prompt]) -> None:
        self.task.test = prompts

    def has(self, hook: str) -> bool:
        return hook in self.hooks

    # ---- the hooks, with their defaults ------------------------------------------------------------------------
    def environment(self, prompt: Prompt) -> Environment:
        return self.task.environment(prompt)

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list:
        if "demonstrations" not in self.hooks:
            raise ConfigError(f"task {self.name} has no demonstrations(): it cannot warm-start the builtin model "
                              "or give data.source=task")
        return self.hooks["demonstrations"](prompts, seed=seed)

    def corpus(self) -> list[str]:
        if "corpus" not in self.hooks:
            raise ConfigError(f"task {self.name} has no corpus() to train the builtin model's tokenizer on; give "
                              "it a real model (model.policy=...)")
        return self.hooks["corpus"]()

    def eval_metrics(self, prompts, completions, finished) -> dict[str, float]:
        hook = self.hooks.get("eval_metrics")
        return {k: float(v) for k, v in hook(prompts, completions, finished).items()} if hook else {}

    def exact_metrics(self, policy, reference, tokenizer, scoring: Scoring) -> dict[str, float]:
        hook = self.hooks.get("exact_metrics")
        return {k: float(v) for k, v in hook(policy, reference, tokenizer, scoring).items()} if hook else {}

    def reward_metrics(self) -> dict[str, float]:
        hook = self.hooks.get("reward_metrics")
        return hook() if hook else {}

    def episode_metrics(self, episodes) -> dict[str, float]:
        hook = self.hooks.get("episode_metrics")
        return {k: float(v) for k, v in hook(episodes).items()} if hook else {}

    def use_tokenizer(self, tokenizer) -> None:
        if "use_tokenizer" in self.hooks:
            self.hooks["use_tokenizer"](tokenizer)

    # ---- rewards ----------------------------------------------------------------------------------------------
    def reward(self, prompt: Prompt, completion: str) -> float | None:
        """One completion's reward (None: not finite); what `batch_rewards` computes for a batch of one."""
        return self.batch_rewards([prompt], [completion], [True])[0][0]

    def batch_rewards(self, prompts: list[Prompt], completions: list[str], finished: list[bool],
                      completion_ids: list[list[int]] | None = None) -> tuple[list[float | None], str | None]:
        """Rewards of a batch: the task's `rewards` if it has one, else `reward` one by one.

        Returns (values, last error): a value is None where the reward raised, was not finite or was None (a batched
        reward that raises fails the whole batch), and the error text says which prompt and why, for the log. A
        reward function that returns the wrong number of values or something that is not a number raises
        RewardError instead: that is a broken contract, not a bad completion."""
        n = len(completions)
        if not len(prompts) == n == len(finished):
            raise ValueError(f"batch_rewards: {len(prompts)} prompts, {n} completions, {len(finished)} flags")
        batched = self.hooks.get("rewards")
        if batched is None:
            who = f"{type(self.task).__name__}.reward"
            values, error = [], None
            for p, c in zip(prompts, completions, strict=True):
                try:
                    raw = self._reward(p, c)
                except Exception as e:
                    values.append(None)
                    error = f"prompt {p.id}: {raised_in(who, e)}"
                    continue
                value = _finite(raw, who, f"for prompt {p.id}")
                values.append(value)
                if value is None:
                    error = f"prompt {p.id}: reward returned {raw}"
            return values, error
        who = f"{type(self.task).__name__}.rewards"
        try:
            raw = batched(prompts, completions, finished,
                          **({"completion_ids": completion_ids} if self._rewards_take_ids else {}))
        except RewardError:
            raise
        except Exception as e:
            ids = sorted({p.id for p in prompts})
            return [None] * n, f"prompts {ids[:8]}: {raised_in(who, e)}"
        if not isinstance(raw, list | tuple) or len(raw) != n:
            got = f"{len(raw)} values" if isinstance(raw, list | tuple) else f"{type(raw).__name__} {raw!r:.60}"
            raise RewardError(f"{who} returned {got} for {n} completions; it must return a list of {n} numbers "
                              "(None to skip one)")
        values = [_finite(v, who, f"for completion {i}") for i, v in enumerate(raw)]
        bad = [i for i, v in enumerate(values) if v is None and raw[i] is not None]
        error = f"prompt {prompts[bad[-1]].id}: reward returned {raw[bad[-1]]}" if bad else None
        return values, error

    def accuracy(self, prompts: list[Prompt], completions: list[str], finished: list[bool] | None = None,
                 completion_ids: list[list[int]] | None = None) -> float:
        """Mean reward over prompts, i.e. pass@1 when the completions are greedy and the reward is 0/1.
        A reward that raises or is not finite scores 0 here (evaluation must not stop a run). `finished` (did
        each completion end with EOS) matters to rewards that penalise unfinished ones; None = all finished."""
        if not prompts:
            return float("nan")
        values, _ = self.batch_rewards(prompts, completions, finished or [True] * len(completions), completion_ids)
        return sum(v or 0.0 for v in values) / len(prompts)


def batch_rewards(task, prompts: list[Prompt], completions: list[str], finished: list[bool],
                  completion_ids: list[list[int]] | None = None) -> tuple[list[float | None], str | None]:
    """`TaskAdapter.batch_rewards` of any task (what a task's own code calls on itself)."""
    return TaskAdapter.of(task).batch_rewards(prompts, completions, finished, completion_ids)


def accuracy(task, prompts: list[Prompt], completions: list[str], finished: list[bool] | None = None,
             completion_ids: list[list[int]] | None = None) -> float:
    """`TaskAdapter.accuracy` of any task."""
    return TaskAdapter.of(task).accuracy(prompts, completions, finished, completion_ids)
