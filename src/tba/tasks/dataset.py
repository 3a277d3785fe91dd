"""`dataset`: any dataset of prompts, scored by plain reward functions — what TRL's GRPOTrainer trains on.

The data: a `datasets.Dataset`, a Hub name, a local .jsonl/.json/.parquet file, or a list of dicts, with a
`prompt` column holding plain text or chat messages ([{"role": "user", "content": …}], rendered with the
tokenizer's chat template), and any other columns. Held out for evaluation: `test_source` if given, else the
last `test_size` rows, at most a tenth of the data (which are then not trained on).

The reward: one function or a list, each with TRL's signature — keyword arguments only, one list entry per
completion —, so that a reward function written for TRL runs unchanged:

    def f(prompts, completions, completion_ids, **columns) -> list[float | None]

`prompts` as the dataset holds them, `completions` strings (or, for chat prompts, [{"role": "assistant",
"content": …}] each), `completion_ids` the tokens, and every other column by its name; a function that does not
take **kwargs gets only what it names. A function may be a callable or a `tba.plugins` target
(`path/to/file.py:fn`, `package.module:fn`: how the CLI names them); `async` functions are awaited. The reward
is Σ weight_i·f_i over the functions that returned a number (None skips that function for that completion, as
TRL does); when none did, the completion is dropped and counted. Each function's mean over the last batch is
logged (`reward/<name>`), as TRL logs `rewards/<name>/mean`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from pathlib import Path

from tba.errors import ConfigError
from tba.plugins import load_object
from tba.tasks.base import Prompt, RewardError
from tba.tasks.data import DataLoadError, quiet


def train_and_test_rows(source, split: str, test_source, test_split: str, test_size: int | None
                        ) -> tuple[list[dict], list[dict], tuple[str, int]]:
    """(train rows, test rows, where the test rows start: the option and the index of the first, for messages):
    `test_source` whole, or else the last rows of `source`, at most a tenth of them."""
    rows = _rows(source, split, "source")
    if test_source is not None:
        return rows, _rows(test_source, test_split, "test_source"), ("test_source", 0)
    held = min(test_size or 0, max(len(rows) // 10, 1))
    return rows[:len(rows) - held], rows[len(rows) - held:], ("source", len(rows) - held)


def _rows(source, split: str, what: str) -> list[dict]:
    """Rows of a Dataset, a list of dicts, a local file or a Hub dataset."""
    if isinstance(source, list):
        return source
    if hasattr(source, "to_list") and hasattr(source, "column_names"):  # a datasets.Dataset
        return source.to_list()
    if not isinstance(source, str | Path):
        raise ConfigError(f"task.options.{what}: a datasets.Dataset, a list of dicts, a file or a Hub name, "
                          f"got {type(source).__name__}")
    if str(source).startswith("<python:"):
        raise ConfigError(f"task.options.{what}: {source} was a Python object, which config.yaml cannot hold: "
                          "resume this run from Python, with the same TBATrainer (trainer.train(resume=True))")
    import datasets  # deferred: ≈ 1 s, only a dataset task reading a file or the Hub needs it

    path = Path(source).expanduser()
    builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
    try:
        if path.exists():
            with quiet(datasets):
                return datasets.load_dataset(builder or "parquet", data_files=str(path), split="train").to_list()
        return datasets.load_dataset(str(source), split=split).to_list()
    except Exception as e:
        raise DataLoadError(f"task.options.{what}: could not read {str(source)!r} ({type(e).__name__}: {e}); a "
                            "local .jsonl, .json or .parquet file works offline") from e


def _is_chat(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def named_and_weighted(functions: list[Callable], reward_weights) -> tuple[list[str], list[float]]:
    """Each reward function's metric name (its own, numbered where two share one) and its weight (default 1)."""
    names = [getattr(f, "__name__", type(f).__name__) for f in functions]
    weights = list(reward_weights) if reward_weights is not None else [1.0] * len(functions)
    if len(weights) != len(functions):
        raise ConfigError(f"task.options.reward_weights: {len(weights)} weights for {len(functions)} reward functions")
    return [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)], weights


def reward_functions(reward) -> list[Callable]:
    """Callables from what task.options.reward holds: a callable, a target, a comma list of targets, a list."""
    if reward is None:
        raise ConfigError("task.options.reward: the dataset task needs at least one reward function "
                          "(task.options.reward=path/to/rewards.py:fn, or reward_funcs=[fn] in Python)")
    items = reward.split(",") if isinstance(reward, str) else reward if isinstance(reward, list | tuple) else [reward]
    return [load_object(r.strip(), "task.options.reward") if isinstance(r, str) else r for r in items]


def _checked(values, name: str, n: int) -> list[float | None]:
    """A reward function's values as floats (None kept: it skips that completion); RewardError, naming the function,
    when it returned something else than one number or None per completion."""
    what = f"it must return a list of {n} numbers, one per completion (None to skip one)"
    if not isinstance(values, list | tuple):
        raise RewardError(f"reward function {name} returned {type(values).__name__} {values!r:.60}; {what}")
    if len(values) != n:
        raise RewardError(f"reward function {name} returned {len(values)} values for {n} completions; {what}")
    for i, v in enumerate(values):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) and not hasattr(v, "__float__")):
            raise RewardError(f"reward function {name} returned {v!r} ({type(v).__name__}) for completion {i}; {what}")
    return [None if v is None else float(v) for v in values]


def _call(fn: Callable, kwargs: dict) -> list:
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    out = fn(**kwargs)
    return asyncio.run(out) if inspect.isawaitable(out) else out


class DatasetTask:
    name = "dataset"

    def __init__(self, source=None, reward=None, reward_weights: list[float] | None = None,
                 prompt_column: str = "prompt", test_source=None, split: str = "train", test_split: str = "test",
                 train_size: int | None = None, test_size: int | None = 100):
        if source is None:
            raise ConfigError("task.options.source: the dataset task needs data (a file, a Hub name, or "
                              "train_dataset= in Python)")
        self.functions = reward_functions(reward)
        self.reward_names, self.weights = named_and_weighted(self.functions, reward_weights)
        rows, test_rows, held_from = train_and_test_rows(source, split, test_source, test_split, test_size)
        self.train = self._prompts(rows[:train_size], prompt_column, ("source", 0))
        self.test = self._prompts(test_rows[:test_size] if test_size else test_rows, prompt_column, held_from)
        self._last: dict[str, float] = {}

    @staticmethod
    def _prompts(rows: list[dict], column: str, where: tuple[str, int]) -> list[Prompt]:
        """`where`: which option the rows came from and the index of the first (for messages: its row number)."""
        (what, first), prompts = where, []
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or column not in row:
                found = ", ".join(row) if isinstance(row, dict) else type(row).__name__
                raise DataLoadError(f"task.options.{what} row {first + i}: no {column!r} column "
                                    f"(task.options.prompt_column; it has {found})")
            prompt = row[column]
            chat = _is_chat(prompt)
            if not chat and (not isinstance(prompt, str) or not prompt.strip()):
                raise DataLoadError(f"task.options.{what} row {first + i}: {column!r} must be non-empty text or a list "
                                    f"of chat messages ({{role, content}}), got {str(prompt)!r:.80}")
            text = "\n".join(m["content"] for m in prompt) if chat else prompt
            meta = {"prompt": prompt, "columns": {k: v for k, v in row.items() if k != column}}
            if chat:
                meta["messages"] = prompt  # rendered with the tokenizer's chat template (tba.tasks.prepare)
            prompts.append(Prompt(i, text, str(row.get("answer", "")), meta))
        return prompts

    def rewards(self, prompts: list[Prompt], completions: list[str], finished: list[bool],
                completion_ids: list[list[int]] | None = None) -> list[float | None]:
        """Σ weight_i·f_i(prompts, completions, completion_ids, **columns) per completion (None: no function
        scored it)."""
        chat = [_is_chat(p.meta["prompt"]) for p in prompts]
        keys = sorted({k for p in prompts for k in p.meta["columns"]})
        kwargs = {"prompts": [p.meta["prompt"] for p in prompts],
                  "completions": [[{"role": "assistant", "content": c}] if is_chat else c
                                  for c, is_chat in zip(completions, chat, strict=True)],
                  "completion_ids": completion_ids, **{k: [p.meta["columns"].get(k) for p in prompts] for k in keys}}
        total: list[float | None] = [None] * len(completions)
        self._last = {}
        for fn, name, weight in zip(self.functions, self.reward_names, self.weights, strict=True):
            try:
                out = _call(fn, kwargs)
            except Exception as e:
                e.raised_in = f"reward function {name}"  # the warning names it (tba.tasks.base.raised_in)
                raise
            values = _checked(out, name, len(completions))
            scored = [v for v in values if v is not None and math.isfinite(v)]
            self._last[f"reward/{name}"] = sum(scored) / len(scored) if scored else math.nan
            for i, v in enumerate(values):
                if v is not None and math.isfinite(float(v)):
                    total[i] = (total[i] or 0.0) + weight * float(v)
        return total

    def reward(self, prompt: Prompt, completion: str) -> float:
        value = self.rewards([prompt], [completion], [True])[0]
        return math.nan if value is None else value

    def reward_metrics(self) -> dict[str, float]:
        """Each reward function's mean over the last batch scored (`reward/<name>`)."""
        return dict(self._last)

    def eval_metrics(self, prompts: list[Prompt], completions: list[str], finished: list[bool]) -> dict[str, float]:
        """Each reward function's mean over the evaluation's completions (scored just before, by `accuracy`)."""
        if not self._last:
            self.rewards(prompts, completions, finished)
        return dict(self._last)
