"""The task registry: each built-in task declared once, with the factory that builds it from `task.*`.

Config validation (which names exist, which can train the builtin tiny model), the run builder, the CLI
and the benchmarks all read `TASKS`. Factories import their task module on first use, so validating a
config imports no torch or datasets. A name with a colon (`module:factory`, `file.py:factory`) is a
custom task (docs/tasks.md) and is not in the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    name: str
    factory: Callable  # TaskConfig → Task
    builtin_model: bool  # provides demonstrations() and corpus(): the builtin tiny model can be SFT'd on it
    summary: str


def _arith(t):
    from tba.tasks.arith import ArithTask

    return ArithTask(digits=t.digits, train_size=t.train_size, test_size=t.test_size, slip_prob=t.teacher_slip_prob,
                     template=t.prompt_template or "{a}+{b}=")


def _gsm8k(t):
    from tba.tasks.gsm8k import PROMPT_TEMPLATE, GSM8KTask

    return GSM8KTask(source=t.source or "openai/gsm8k", train_size=t.train_size, test_size=t.test_size,
                     template=t.prompt_template or PROMPT_TEMPLATE)


def _reasoning_gym(t):
    from tba.errors import ConfigError
    from tba.tasks.reasoning_gym import ReasoningGymTask

    options = dict(t.options or {})
    if "dataset" not in options:
        raise ConfigError("task.options.dataset: task reasoning_gym needs a dataset name, e.g. "
                          "'task.options={dataset: chain_sum}'")
    unknown = sorted(set(options) - {"dataset", "options", "seed", "instruction", "extract"})
    if unknown:
        raise ConfigError(f"task.options: reasoning_gym takes dataset, options, seed, instruction, extract; "
                          f"not {unknown} (the dataset's own settings go under task.options.options)")
    return ReasoningGymTask(train_size=t.train_size, test_size=t.test_size, **options)


def _enumerable(t):
    from tba.errors import ConfigError
    from tba.tasks.enumerable import EnumerableTask

    options = dict(t.options or {})
    allowed = {"symbols", "length", "modes", "seed", "decay", "height_step", "junk_reward"}
    if set(options) - allowed:
        raise ConfigError(f"task.options: enumerable takes {', '.join(sorted(allowed))}; "
                          f"not {sorted(set(options) - allowed)}")
    try:
        return EnumerableTask(**options)
    except ValueError as e:
        raise ConfigError(f"task.options: {e}") from None


def _redteam(t):
    """task.options → RedTeamOptions (unknown keys named). By module name, like the model-scored tasks below:
    the task loads models, whose module reads the config, which reads this registry."""
    import dataclasses
    import importlib

    from tba.errors import ConfigError

    redteam = importlib.import_module("tba.tasks.redteam")
    options = dict(t.options or {})
    known = {f.name for f in dataclasses.fields(redteam.RedTeamOptions)}
    if unknown := sorted(set(options) - known):
        raise ConfigError(f"task.options: redteam does not take {unknown}; it takes {sorted(known)}")
    return redteam.RedTeamTask(redteam.RedTeamOptions(**options))


def _from_options(spec: str) -> Callable:
    """Tasks whose reward is a model take the data settings (if set) plus `task.options` as arguments."""

    def factory(t):
        from tba.tasks.base import load_custom_task

        sizes = {"source": t.source, "train_size": t.train_size, "test_size": t.test_size}
        return load_custom_task(spec, {**{k: v for k, v in sizes.items() if v is not None}, **(t.options or {})})

    return factory


TASKS: dict[str, TaskSpec] = {s.name: s for s in (
    TaskSpec("arith", _arith, True, "a+b from reasoning-gym with a noisy-teacher SFT start (the default)"),
    TaskSpec("reasoning_gym", _reasoning_gym, False,
             "any reasoning-gym dataset (task.options: dataset, options), its own verifier, for pretrained models"),
    TaskSpec("enumerable", _enumerable, True,
             "a few thousand responses and a seeded multi-mode reward: KL to the exact target π* is evaluated"),
    TaskSpec("gsm8k", _gsm8k, False, "GSM8K math word problems, exact-match reward on the final number"),
    TaskSpec("tldr", _from_options("tba.tasks.tldr:TLDRTask"), False,
             "TL;DR summarisation scored by a reward model"),
    TaskSpec("redteam", _redteam, False,
             "red-teaming: attack prompts scored by a toxicity classifier on a victim's answers"),
)}


def make_task(t):
    """The task `t` (a TaskConfig) names: a registered one, or a custom `module:factory` given `t.options`."""
    if t.name in TASKS:
        return TASKS[t.name].factory(t)
    from tba.tasks.base import load_custom_task

    return load_custom_task(t.name, dict(t.options or {}))


__all__ = ["TASKS", "TaskSpec", "make_task"]
