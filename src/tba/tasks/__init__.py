"""The task registry: each built-in task declared once, by the `tba.plugins` target that builds it.

Config validation (which names exist, which can train the builtin tiny model), the run builder and the CLI
read `TASKS`. A target is a name, not an import, so validating a config imports no torch or datasets. A task
is built one way, registered or not: its target is called with `task.options` as keyword arguments (checked
against its signature) plus `train_size`/`test_size` where it declares them (tba.tasks.prepare.build_task).
A name with a colon (`module:factory`, `file.py:factory`) is a custom task (docs/tasks.md), built the same way,
except where the part before the colon is a prefix of `PREFIXED` (`verifiers:<env id>`): the rest is then an option
of that prefix's task.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskEntry:
    name: str
    target: str
    """The task's factory, `module:function` (or a class): its keyword parameters are the task's options."""
    builtin_model: bool
    """It provides demonstrations() and corpus(): the builtin tiny model can be SFT'd on it."""
    summary: str


TASKS: dict[str, TaskEntry] = {e.name: e for e in (
    TaskEntry("arith", "tba.tasks.arith:ArithTask", True,
              "a+b from reasoning-gym with a noisy-teacher SFT start (the default)"),
    TaskEntry("reasoning_gym", "tba.tasks.reasoning_gym:ReasoningGymTask", False,
              "any reasoning-gym dataset (task.options: dataset, options), its own verifier, for pretrained models"),
    TaskEntry("enumerable", "tba.tasks.enumerable:EnumerableTask", True,
              "a few thousand responses and a seeded multi-mode reward: KL to the exact target π* is evaluated"),
    TaskEntry("enumerable_turns", "tba.tasks.enumerable_turns:EnumerableTurnsTask", True,
              "two policy turns with a random observation between them: KL to the exact optimum is evaluated"),
    TaskEntry("guess_number", "tba.tasks.guess_number:GuessNumberTask", True,
              "find a hidden number from higher/lower feedback over several turns (multi-turn, tiny model)"),
    TaskEntry("tool_arith", "tba.tasks.tool_arith:ToolArithTask", False,
              "multiplication with a calculator tool the policy calls (multi-turn, for chat models)"),
    TaskEntry("gsm8k", "tba.tasks.gsm8k:GSM8KTask", False,
              "GSM8K math word problems, exact-match reward on the final number"),
    TaskEntry("tldr", "tba.tasks.tldr:TLDRTask", False, "TL;DR summarisation scored by a reward model"),
    TaskEntry("redteam", "tba.tasks.redteam:redteam_task", False,
              "red-teaming: attack prompts scored by a toxicity classifier on a victim's answers"),
    TaskEntry("dataset", "tba.tasks.dataset:DatasetTask", False,
              "any dataset with a prompt column, scored by reward functions with TRL's signature"),
    TaskEntry("factory", "tba.tasks.factory:FactoryTask", False,
              "TRL's environment_factory: dataset rows played against an environment class, its methods as tools"),
    TaskEntry("openenv", "tba.tasks.openenv:OpenEnvTask", False,
              "an OpenEnv environment server (task.options.url, or app= to serve one locally) as a multi-turn task"),
    TaskEntry("agent", "tba.tasks.agent:AgentTask", False,
              "episodes run by your own code (task.options.agent=file.py:fn) against the policy's OpenAI endpoint"),
)}

PREFIXED: dict[str, tuple[str, str]] = {
    "verifiers": ("tba.tasks.verifiers:VerifiersTask", "env_id"),
}
"""`prefix:<value>` task names → (the task's target, the option the value is): `verifiers:<env id>` is a verifiers
v1 environment run by verifiers itself against the policy's endpoint (the `verifiers` extra)."""


def task_target(name: str) -> tuple[str, dict]:
    """The factory `name` builds its task with, and the options its name carries."""
    if name in TASKS:
        return TASKS[name].target, {}
    prefix, _, value = name.partition(":")
    if prefix in PREFIXED:
        target, option = PREFIXED[prefix]
        return target, {option: value}
    return name, {}


__all__ = ["PREFIXED", "TASKS", "TaskEntry", "task_target"]
