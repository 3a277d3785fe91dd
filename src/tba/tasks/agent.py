"""`agent`: episodes produced by the user's own code — an agent, a harness, an environment loop written against the
`openai` client — run against an endpoint in front of each searcher's sampler (tba.rollout.agents).

Why a task kind and not an environment: such code drives the model itself (it decides when to call, with which
messages, tools and sampling settings), so tba cannot step it turn by turn. It only needs a URL: the searcher serves
its policy (tba.serve, loopback, a bearer token), the function runs once per episode with a dataset row, and the
ids the server rendered and sampled for that episode's session are stitched into samples (tba.serve.stitch).

    def my_agent(row, base_url, api_key, model):          # any subset of these, by name; async works too
        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        ...                                                 # as many calls as it likes
        return 1.0 if solved else 0.0                       # its reward, or None: the reward functions decide

`api_key` carries the episode's session (`<token>.<session>`, tba.serve.sessions), so a harness that can only set an
API key still separates its episodes; `client` (an `openai.OpenAI` on them) is passed if the function names it.

The data and the reward functions are the dataset task's (TRL's signature): `prompts` the row's prompt, `completions`
the episode's last response (text, special tokens removed), the row's other columns by name. The reward is the
function's number (logged as `reward/agent`) plus Σ weight·f over the reward functions, over those that returned a
number; None from every source drops the episode, counted.
"""

from __future__ import annotations

import inspect
import math

from tba.errors import ConfigError
from tba.plugins import load_object
from tba.tasks.dataset import DatasetTask, _call, _checked, named_and_weighted, reward_functions, train_and_test_rows
from tba.tasks.factory import ScoreLog

ON_BREAK = ("new_sample", "drop")
"""What a call that does not extend its session's ids does: start another sample of the episode, or be dropped."""


def check_episode_options(on_break: str, concurrency, timeout_s) -> None:
    """The options every task whose episodes come from outside shares (the agent task, verifiers)."""
    if on_break not in ON_BREAK:
        raise ConfigError(f"task.options.on_break: one of {', '.join(ON_BREAK)}, not {on_break!r}")
    if concurrency is not None and int(concurrency) < 1:
        raise ConfigError(f"task.options.concurrency: at least 1 episode at a time, not {concurrency}")
    if not float(timeout_s) > 0:
        raise ConfigError(f"task.options.timeout_s: a positive number of seconds, not {timeout_s}")


class AgentTask:
    name = "agent"

    def __init__(self, agent=None, source=None, reward=None, reward_weights: list[float] | None = None,
                 prompt_column: str = "prompt", test_source=None, split: str = "train", test_split: str = "test",
                 train_size: int | None = None, test_size: int | None = 100, concurrency: int | None = None,
                 timeout_s: float = 300.0, on_break: str = "new_sample"):
        """agent: the function (or a target `file.py:fn`, `module:fn`) run once per episode; concurrency: episodes
        running at once per searcher (None: search.prompts_per_batch × search.generations_per_prompt, one batch);
        timeout_s: an episode running longer is abandoned, counted as `timeout`; on_break: what a call that does not
        extend its session's ids does — "new_sample" (it starts another sample of the episode) or "drop" (it is
        counted and left out). The rest as the dataset task's."""
        if agent is None:
            raise ConfigError("task.options.agent: the agent task needs the function that runs an episode "
                              "(task.options.agent=path/to/agent.py:fn)")
        if source is None:
            raise ConfigError("task.options.source: the agent task needs data; each row is handed to the agent")
        check_episode_options(on_break, concurrency, timeout_s)
        self.agent = load_object(agent, "task.options.agent") if isinstance(agent, str) else agent
        self.agent_name = agent if isinstance(agent, str) else getattr(agent, "__qualname__", repr(agent))
        self.concurrency = None if concurrency is None else int(concurrency)
        self.timeout_s, self.on_break = float(timeout_s), on_break
        self.functions = reward_functions(reward) if reward is not None else []
        self.reward_names, self.weights = named_and_weighted(self.functions, reward_weights)
        rows, test_rows, held_from = train_and_test_rows(source, split, test_source, test_split, test_size)
        self.train = self._prompts(rows[:train_size], prompt_column, ("source", 0))
        self.test = self._prompts(test_rows[:test_size] if test_size else test_rows, prompt_column, held_from)
        self._scored = ScoreLog()

    @staticmethod
    def _prompts(rows, column, where):
        out = DatasetTask._prompts(rows, column, where)
        for p in out:
            p.meta["row"] = {column: p.meta["prompt"], **p.meta["columns"]}
        return out

    def run_agent(self, prompt, *, base_url: str, api_key: str, model: str):
        """One episode of `prompt`'s row: the function's return value (run in a harness thread)."""
        kwargs = {"row": dict(prompt.meta["row"]), "base_url": base_url, "api_key": api_key, "model": model}
        if "client" in _parameters(self.agent):
            import openai

            kwargs["client"] = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        return _call(self.agent, kwargs)

    def score(self, prompt, value, completion: str) -> tuple[float | None, dict[str, float]]:
        """The episode's reward (None: no source scored it) and each source's value."""
        values: dict[str, float] = {}
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"returned {value!r} ({type(value).__name__}); an agent returns its reward (a "
                                "number) or None")
            if math.isfinite(value):
                values["agent"] = float(value)
        total = values.get("agent")
        meta = prompt.meta
        kwargs = {"prompts": [meta["prompt"]], "completions": [completion], **{k: [v] for k, v in
                                                                                meta["columns"].items()}}
        for fn, name, weight in zip(self.functions, self.reward_names, self.weights, strict=True):
            try:
                (v,) = _checked(_call(fn, kwargs), name, 1)
            except Exception as e:
                e.raised_in = f"reward function {name}"
                raise
            if v is not None and math.isfinite(v):
                values[name], total = v, (total or 0.0) + weight * v
        self._scored.add(values)
        return total, values

    def reward_metrics(self) -> dict[str, float]:
        """Each reward source's mean over the episodes scored since the last call (`reward/<name>`)."""
        return self._scored.means()


def _parameters(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()
