"""A task made ready for a model: built from its spec, prompts wrapped in the chat template, and prompts that
do not fit the model's context dropped or truncated.

Here rather than in tba.run.build because searcher workers (tba.runtime) prepare their own copy of the task from a
`TaskSpec`, and the runtime must not import the module that builds the runtimes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tba.errors import ConfigError
from tba.plugins import call_with_options, load_object
from tba.tasks.base import TaskAdapter


@dataclass(frozen=True)
class TaskSpec:
    """How to build the run's task: `target(**options, train_size=…, test_size=…)` (the sizes where the
    factory takes them), then its prompts wrapped in the tokenizer's chat template if asked."""

    target: str
    options: dict
    train_size: int | None
    test_size: int | None
    chat_template: bool = False


SIZES = ("train_size", "test_size")


def build_task(spec: TaskSpec, tokenizer=None) -> TaskAdapter:
    """The task `spec` describes: its factory called with its options (and the sizes where it takes them),
    checked to be a Task or an EpisodicTask and adapted once (tba.tasks.base.TaskAdapter); with
    `spec.chat_template` its prompts are wrapped by `tokenizer`'s template."""
    options = dict(spec.options)
    if clash := [k for k in SIZES if k in options]:
        raise ConfigError(f"task.options.{clash[0]}: set task.{clash[0]} instead")
    task = TaskAdapter(call_with_options(load_object(spec.target, "task.name"), options, "task.options",
                                         train_size=spec.train_size, test_size=spec.test_size))
    if missing := task.missing():
        raise ConfigError(f"task.name: {spec.target} returned {type(task.task).__name__}, which lacks "
                          f"{', '.join(missing)} (a task scores completions with `reward`, or episodes with "
                          "`environment`: tba.tasks.base)")
    if not task.train or not task.test:
        raise ConfigError(f"task.name: {spec.target} returned no train or no test prompts")
    if tokenizer is not None:
        apply_chat_template(task, tokenizer, every_prompt=spec.chat_template)
    return task


def apply_chat_template(task, tokenizer, every_prompt: bool = True) -> None:
    """Rewrite prompts as `tokenizer`'s chat rendering, ready for the assistant reply: prompts given as chat
    messages (`meta["messages"]`, e.g. the dataset task's conversational rows) always, and with `every_prompt`
    (task.chat_template) every other prompt too, as one user turn. A task with `use_tokenizer` gets this
    tokenizer (a multi-turn task renders its environment's turns with it: tba.tasks.tools.chat_turn)."""
    task = TaskAdapter.of(task)  # its train/test lists are the task's own: rewritten in place
    task.use_tokenizer(tokenizer)
    chat = any("messages" in p.meta for p in task.train + task.test)
    if not every_prompt and not chat:
        return
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("task.chat_template: the prompts are chat messages or task.chat_template is true, but "
                          "the tokenizer has no chat template")

    def wrap(p):
        if "messages" not in p.meta and not every_prompt:
            return p
        messages = p.meta.get("messages") or [{"role": "user", "content": p.text}]
        tools = {"tools": p.meta["tools"]} if p.meta.get("tools") else {}  # JSON schemas the template renders
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **tools)
        return dataclasses.replace(p, text=text)

    task.train = [wrap(p) for p in task.train]
    task.test = [wrap(p) for p in task.test]


def fit_prompts(task, tokenizer, limit: int, mode: str) -> dict[str, int]:
    """Enforce the prompt-length limit on train and test prompts: drop (skip) or keep the last `limit`
    tokens (truncate — the end holds the question and the answer cue). Returns the counts, for the summary."""
    counts = {"prompts_too_long": 0, "prompts_truncated": 0}

    def n_tokens(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    def fit(p):
        ids = tokenizer(p.text)["input_ids"]
        if len(ids) <= limit:
            return p
        counts["prompts_too_long"] += 1
        if mode == "skip":
            return None
        cut = len(ids) - limit
        text = tokenizer.decode(ids[cut:], skip_special_tokens=True)
        while n_tokens(text) > limit and cut < len(ids):  # re-encoding may add special tokens
            cut += 1
            text = tokenizer.decode(ids[cut:], skip_special_tokens=True)
        counts["prompts_truncated"] += 1
        return dataclasses.replace(p, text=text)

    task.train = [q for q in (fit(p) for p in task.train) if q is not None]
    task.test = [q for q in (fit(p) for p in task.test) if q is not None]
    if not task.train:
        raise ConfigError(f"task.max_prompt_tokens: every train prompt is longer than {limit} tokens (the limit is "
                          "the model's context minus the generation budget unless set)")
    return counts


def prompt_limit(max_prompt_tokens: int | None, config, generation_budget: int) -> int:
    """`max_prompt_tokens` (task.max_prompt_tokens), or the context length of the model `config` describes minus
    the generation budget (the longer of the search and evaluation budgets)."""
    if max_prompt_tokens is not None:
        return max_prompt_tokens
    context = getattr(config, "max_position_embeddings", None) or 10**9
    return max(1, context - generation_budget)
