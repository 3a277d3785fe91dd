"""Build the run's task and models from a validated config (no training logic here)."""

from __future__ import annotations

import copy
import dataclasses

from tba.config import RunConfig
from tba.models import apply_lora, build_tiny_model, load_model, load_tokenizer, resolve_source, train_tokenizer

FACTORIES = {"tldr": "tba.tasks.tldr:TLDRTask", "redteam": "tba.tasks.redteam:RedTeamTask"}


def build_task(cfg: RunConfig, tokenizer=None):
    """The configured task; with `task.chat_template` its prompts are wrapped by `tokenizer`'s chat template."""
    t = cfg.task
    if t.name in FACTORIES or ":" in t.name:
        from tba.tasks.base import load_custom_task

        # built-in tasks whose reward is a model are factories too, given the data settings besides the options
        sizes = {"source": t.source, "train_size": t.train_size, "test_size": t.test_size}
        given = {k: v for k, v in sizes.items() if v is not None} if t.name in FACTORIES else {}
        task = load_custom_task(FACTORIES.get(t.name, t.name), {**given, **(t.options or {})})
    elif t.name == "arith":
        from tba.tasks.arith import ArithTask

        task = ArithTask(digits=t.digits, train_size=t.train_size, test_size=t.test_size,
                         slip_prob=t.teacher_slip_prob, template=t.prompt_template or "{a}+{b}=")
    else:
        from tba.tasks.gsm8k import PROMPT_TEMPLATE, GSM8KTask

        task = GSM8KTask(source=t.source or "openai/gsm8k", train_size=t.train_size, test_size=t.test_size,
                         template=t.prompt_template or PROMPT_TEMPLATE)
    if t.chat_template and tokenizer is not None:
        apply_chat_template(task, tokenizer)
    return task


def apply_chat_template(task, tokenizer) -> None:
    """Rewrite every prompt as `tokenizer`'s chat rendering of one user turn, ready for the assistant reply."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("task.chat_template=true but the tokenizer has no chat template")

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
        raise ValueError(f"every train prompt is longer than task.max_prompt_tokens={limit} tokens")
    return counts


def prompt_limit(cfg: RunConfig, policy) -> int:
    """task.max_prompt_tokens, or the model's context length minus the generation budget."""
    if cfg.task.max_prompt_tokens is not None:
        return cfg.task.max_prompt_tokens
    context = getattr(policy.config, "max_position_embeddings", None) or 10**9
    return max(1, context - max(cfg.search.max_new_tokens, cfg.eval.max_new_tokens))


def build_models(cfg: RunConfig, task, log=print):
    """(tokenizer, policy, reference, source). The reference is frozen; by default it is the policy's start.

    `source` is where the starting policy can be loaded from again (hub name or directory), so that searchers
    in other processes or on other nodes load the same weights; None when the policy exists only in memory.
    """
    m = cfg.model
    source = None
    if m.policy == "builtin":
        if cfg.sft.enabled:
            from tba.sft import warm_start

            source = str(warm_start(cfg, task, log=log))
            tokenizer, policy = load_tokenizer(source), load_model(source, m.dtype)
        else:
            tokenizer = train_tokenizer(task.corpus(), m.tiny.vocab_size)
            policy = build_tiny_model(tokenizer, m.tiny, seed=cfg.seed)
    else:
        source = resolve_source(m.policy)
        tokenizer, policy = load_tokenizer(source), load_model(source, m.dtype)
    reference = load_model(m.reference, m.dtype) if m.reference else copy.deepcopy(policy)
    reference.eval().requires_grad_(False)
    if m.lora.enabled:
        policy = apply_lora(policy, m.lora)
    return tokenizer, policy, reference, source
