"""Build the run's task and models from a validated config (no training logic here)."""

from __future__ import annotations

import copy

from tba.config import RunConfig
from tba.models import build_tiny_model, load_model, load_tokenizer, train_tokenizer


def build_task(cfg: RunConfig):
    t = cfg.task
    if t.name == "arith":
        from tba.tasks.arith import ArithTask

        return ArithTask(digits=t.digits, train_size=t.train_size, test_size=t.test_size,
                         slip_prob=t.teacher_slip_prob)
    from tba.tasks.gsm8k import GSM8KTask

    return GSM8KTask(source=t.source or "openai/gsm8k", train_size=t.train_size, test_size=t.test_size)


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
        source = m.policy
        tokenizer, policy = load_tokenizer(m.policy), load_model(m.policy, m.dtype)
    reference = load_model(m.reference, m.dtype) if m.reference else copy.deepcopy(policy)
    reference.eval().requires_grad_(False)
    return tokenizer, policy, reference, source
