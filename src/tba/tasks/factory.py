"""`factory`: TRL's `environment_factory` — a dataset played as episodes against a fresh instance of the user's
environment class, whose public methods the policy calls as tools (`TBATrainer(environment_factory=Cls)`).

What TRL's `GRPOTrainer(environment_factory=Cls)` does, and tba here:

- one instance per episode (`Cls()`), reset with the episode's dataset row: `reset(**row)` (every column, the prompt
  included). A string it returns is appended to the prompt's last message, as TRL appends it to the last user message;
- every public method but `reset` and `get_reward` is a tool, its JSON schema from its signature and Google-style
  docstring (`transformers.utils.get_json_schema`), given to the chat template as `tools=`;
- the policy calls a tool in its template's format, `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
  (Hermes/Qwen: tba.tasks.tools); each call runs with `tool_timeout_s`, and its result — or `error: …` when the tool
  raised, hung, or the call was malformed — comes back as a `tool` message rendered by the chat template. The first
  turn without a call ends the episode, as does the turn limit (search.max_turns, TRL's max_tool_calling_iterations);
- the reward: Σ weight·f over `reward` (TRL's `reward_funcs`, TRL's signature) called with `environments=[the
  episode's instance]` besides `prompts`, `completions` (the episode's messages: assistant turns, with their
  `tool_calls`, and tool results) and the row's columns; plus the instance's `get_reward()` when it has one (weight
  1, logged under the class's name), reward functions then optional. None from every source drops the episode.

One difference: the prompt is tokenized once for all episodes of a row (a TB group shares its prompt), so reset's
text is taken once per row when the task is built, from one instance reset with each row in turn (TRL reuses an
instance across rows the same way); each episode's own instance is then reset with its row again. An environment
whose reset text depends on more than the row (randomness) has its first text in the prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import threading
from collections.abc import Callable

from tba.errors import ConfigError, UserError, raised
from tba.plugins import load_object
from tba.tasks.base import Prompt
from tba.tasks.dataset import DatasetTask, _call, _checked, named_and_weighted, reward_functions, train_and_test_rows
from tba.tasks.tools import ToolCallError, chat_messages, parse_tool_calls

NOT_TOOLS = ("reset", "get_reward")


class FactoryError(UserError):
    """The environment class cannot be used: it has no reset, a method cannot be a tool, reset raised."""

    label = "environment error"


def tool_methods(instance) -> list[Callable]:
    """An instance's tools, as TRL picks them: its public bound methods but reset and get_reward."""
    return [m for name, m in inspect.getmembers(instance, predicate=inspect.ismethod)
            if name not in NOT_TOOLS and not name.startswith("_")]


def tool_schema(method) -> dict:
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(method)
    except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
        owner = type(method.__self__).__name__
        raise FactoryError(f"{owner}.{method.__name__} is public, so it is a tool, but it has no schema ({e}): "
                                "give it type hints and a Google-style docstring (Args: …), or make it private "
                                f"(_{method.__name__})") from None


def run_tool(fn: Callable, args: dict, timeout_s: float) -> str:
    """`fn(**args)` as the policy's tool call, in a daemon thread: its result as text, or `error: …` when it raised or
    did not return within `timeout_s` (the thread is then abandoned: Python cannot kill it). Async tools are awaited."""
    box, done = {}, threading.Event()

    def work():
        try:
            value = fn(**args)
            box["value"] = asyncio.run(value) if inspect.isawaitable(value) else value
        except Exception as e:
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=work, daemon=True, name="tba-tool").start()
    if not done.wait(timeout_s):
        return f"error: {fn.__name__} did not return within {timeout_s} s"
    if "error" in box:
        return f"error: {raised(fn.__name__, box['error'])}"
    return str(box.get("value"))


class FactoryEnv:
    """One episode: the user's instance, its tools, the episode's messages (what reward functions get as the
    completion) and counts of tool calls, failed calls and malformed ones."""

    def __init__(self, task: FactoryTask, prompt: Prompt):
        self.task, self.prompt = task, prompt
        self.instance = task.factory()
        self.tools = {m.__name__: m for m in tool_methods(self.instance)}
        self.messages: list[dict] = []
        self.calls = self.failures = self.malformed = 0
        self.values: dict[str, float] = {}

    def reset(self, prompt: Prompt) -> None:
        self.instance.reset(**self.prompt.meta["row"])

    def step(self, action: str) -> str | None:
        try:
            calls = parse_tool_calls(action, self.tools)
        except ToolCallError as e:
            self.malformed += 1
            self.messages.append({"role": "assistant", "content": action})
            return self._results([{"role": "tool", "content": str(e)}])
        if not calls:
            self.messages.append({"role": "assistant", "content": action})
            return None
        self.messages.append({"role": "assistant", "content": action, "tool_calls": [
            {"type": "function", "function": {"name": fn.__name__, "arguments": args}} for fn, args in calls]})
        results = []
        for fn, args in calls:
            text = run_tool(fn, args, self.task.tool_timeout_s)
            self.calls += 1
            self.failures += text.startswith("error: ")
            results.append({"role": "tool", "name": fn.__name__, "content": text})
        return self._results(results)

    def _results(self, messages: list[dict]) -> str:
        self.messages += messages
        return chat_messages(self.task.tokenizer, messages)

    def get_reward(self) -> float | None:
        return self.task.score(self)


class FactoryTask:
    name = "factory"

    def __init__(self, environment_factory=None, source=None, reward=None, reward_weights: list[float] | None = None,
                 prompt_column: str = "prompt", test_source=None, split: str = "train", test_split: str = "test",
                 train_size: int | None = None, test_size: int | None = 100, tool_timeout_s: float = 10.0):
        """environment_factory: the class (or a target `file.py:Cls`, `module:Cls`) made once per episode;
        tool_timeout_s: the longest a tool call may take before the policy gets `error: … did not return` (keep it
        under search.env_timeout_s, which bounds the whole turn). The rest as the dataset task's."""
        if environment_factory is None:
            raise ConfigError("task.options.environment_factory: the factory task needs an environment class "
                              "(environment_factory=Cls in Python)")
        if source is None:
            raise ConfigError("task.options.source: the factory task needs data (train_dataset= in Python); each "
                              "row is handed to reset(**row)")
        self.factory = (load_object(environment_factory, "task.options.environment_factory")
                        if isinstance(environment_factory, str) else environment_factory)
        self.tool_timeout_s = float(tool_timeout_s)
        probe = self.factory()
        who = type(probe).__name__
        if not callable(getattr(probe, "reset", None)):
            raise FactoryError(f"{who}: an environment_factory's instance must define a callable reset(**row)")
        self.schemas = [tool_schema(m) for m in tool_methods(probe)]
        self.functions = reward_functions(reward) if reward is not None else []
        self.reward_names, self.weights = named_and_weighted(self.functions, reward_weights)
        self.env_reward = who if callable(getattr(probe, "get_reward", None)) else None
        if not self.functions and self.env_reward is None:
            raise ConfigError(f"task.options.reward: no reward source — pass reward_funcs, or give {who} a "
                              "get_reward() method")
        rows, test_rows, held_from = train_and_test_rows(source, split, test_source, test_split, test_size)
        self.train = self._prompts(probe, rows[:train_size], prompt_column, ("source", 0))
        self.test = self._prompts(probe, test_rows[:test_size] if test_size else test_rows, prompt_column, held_from)
        self.tokenizer = None
        self._scored: list[dict[str, float]] = []

    def _prompts(self, probe, rows: list[dict], column: str, where: tuple[str, int]) -> list[Prompt]:
        """The dataset task's prompts, each as chat messages with reset's text appended to the last, the tools'
        schemas and the row that each episode's reset gets."""
        out = []
        for p in DatasetTask._prompts(rows, column, where):
            row = {column: p.meta["prompt"], **p.meta["columns"]}
            try:
                text = probe.reset(**row)
            except Exception as e:
                raise FactoryError(f"task.options.{where[0]} row {where[1] + p.id}: "
                                        f"{raised(type(probe).__name__ + '.reset', e)}") from e
            messages = p.meta.get("messages") or [{"role": "user", "content": p.meta["prompt"]}]
            if isinstance(text, str):
                messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + text}]
            meta = {**p.meta, "messages": messages, "tools": self.schemas, "row": row}
            out.append(dataclasses.replace(p, text="\n".join(m["content"] for m in messages), meta=meta))
        return out

    def use_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def environment(self, prompt: Prompt) -> FactoryEnv:
        return FactoryEnv(self, prompt)

    def score(self, env: FactoryEnv) -> float | None:
        """The episode's reward: Σ weight·f over the reward functions that returned a number, plus get_reward's."""
        meta = env.prompt.meta
        kwargs = {"prompts": [meta["prompt"]], "completions": [env.messages], "environments": [env.instance],
                  **{k: [v] for k, v in meta["columns"].items()}}
        total, scored = 0.0, False
        for fn, name, weight in zip(self.functions, self.reward_names, self.weights, strict=True):
            try:
                out = _call(fn, kwargs)
            except Exception as e:
                e.raised_in = f"reward function {name}"  # the warning names it (tba.rollout.episodes)
                raise
            (value,) = _checked(out, name, 1)
            if value is not None and math.isfinite(value):
                env.values[name], total, scored = value, total + weight * value, True
        if self.env_reward is not None:
            value = env.instance.get_reward()
            if value is not None and math.isfinite(float(value)):
                env.values[self.env_reward], total, scored = float(value), total + float(value), True
        self._scored.append(env.values)
        return total if scored else None

    def reward_metrics(self) -> dict[str, float]:
        """Each reward source's mean over the episodes scored since the last call (`reward/<name>`)."""
        out = _means(self._scored)
        self._scored = []
        return out

    def episode_metrics(self, episodes) -> dict[str, float]:
        """Held-out: each reward source's mean, the share of episodes that called a tool, the share of calls that
        failed (raised, hung) and the share of episodes with a malformed call."""
        envs = [e.env for e in episodes if isinstance(e.env, FactoryEnv)]
        self._scored = []  # these episodes' values are evaluation's, not the next training batch's
        calls = sum(env.calls for env in envs)
        n = max(len(envs), 1)
        return {**_means([env.values for env in envs]),
                "tool/called_share": sum(env.calls > 0 for env in envs) / n,
                "tool/failure_share": sum(env.failures for env in envs) / calls if calls else float("nan"),
                "tool/malformed_share": sum(env.malformed > 0 for env in envs) / n}


class ScoreLog:
    """Each episode's named reward values, kept until the next `means()` (`reward/<name>` metrics): thread-safe, as
    an agent task's episodes are scored on their own threads."""

    def __init__(self):
        self._scored: list[dict[str, float]] = []
        self._lock = threading.Lock()

    def add(self, values: dict[str, float]) -> None:
        with self._lock:
            self._scored.append(values)

    def means(self) -> dict[str, float]:
        with self._lock:
            scored, self._scored = self._scored, []
        return _means(scored)


def _means(values: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({k for v in values for k in v})
    return {f"reward/{k}": sum(v[k] for v in values if k in v) / sum(k in v for v in values) for k in names}
