"""A task made ready for a model: built from the config, prompts wrapped in the chat template, and prompts
that do not fit the model's context dropped or truncated.

Here rather than in tba.build because searcher workers (tba.runtime) prepare their own copy of the task, and
the runtime must not import the module that builds the runtimes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tba.errors import ConfigError

if TYPE_CHECKING:
    from tba.config import RunConfig


def build_task(cfg: RunConfig, tokenizer=None):
    """The configured task (tba.tasks.TASKS, or a custom factory); with `task.chat_template` its prompts are
    wrapped by `tokenizer`'s chat template."""
    from tba.tasks import make_task

    task = make_task(cfg.task)
    if cfg.task.chat_template and tokenizer is not None:
        apply_chat_template(task, tokenizer)
    return task


def apply_chat_template(task, tokenizer) -> None:
    """Rewrite every prompt as `tokenizer`'s chat rendering of one user turn, ready for the assistant reply."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("task.chat_template: true, but the tokenizer has no chat template")

    def wrap(p):
        text = tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                             add_generation_prompt=True)
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


def prompt_limit(cfg: RunConfig, policy) -> int:
    """task.max_prompt_tokens, or the model's context length minus the generation budget."""
    if cfg.task.max_prompt_tokens is not None:
        return cfg.task.max_prompt_tokens
    context = getattr(policy.config, "max_position_embeddings", None) or 10**9
    return max(1, context - max(cfg.search.max_new_tokens, cfg.eval.max_new_tokens))
