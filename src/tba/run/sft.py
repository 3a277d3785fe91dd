"""SFT warm start: the paper starts RL from an SFT model, so `tba` makes one when the policy is built in.

Completion-only cross-entropy on task demonstrations, AdamW with linear warmup and cosine decay to 10 % of
the peak LR (so the run ends converged rather than mid-climb). The result is cached on disk keyed by
everything that determines it, so a second `tba train` starts RL at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tba.config.schema import EvalConfig, SFTConfig, TaskConfig, TinyModelConfig
from tba.errors import ConfigError
from tba.models import save_checkpoint
from tba.models.builtin import build_tiny_model, train_tokenizer
from tba.models.sources import cache_dir
from tba.rollout.evaluate import greedy_accuracy
from tba.tasks.base import TaskAdapter

logger = logging.getLogger(__name__)


def cache_root(sft: SFTConfig) -> Path:
    return Path(sft.cache_dir) if sft.cache_dir else cache_dir()


def cache_key(task: TaskConfig, tiny: TinyModelConfig, sft: SFTConfig, seed: int) -> str:
    """Hash of every setting that changes the warm-start checkpoint."""
    ignored = ("max_prompt_tokens", "long_prompts")  # applied after the warm start, at RL time
    unkeyed = ("cache_dir", "log_every_steps", "seed")  # the seed is the argument (sft.seed or the run's)
    keyed = {"task": {k: v for k, v in dataclasses.asdict(task).items() if k not in ignored},
             "tiny": dataclasses.asdict(tiny),
             "sft": {k: v for k, v in dataclasses.asdict(sft).items() if k not in unkeyed},
             "seed": seed, "format": 1}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def _encode(tokenizer, prompts: list[str], completions: list[str]) -> list[tuple[list[int], list[int]]]:
    """Each demonstration's (prompt ids, completion ids + EOS), tokenized once for the whole run: a step then only
    pads its batch (per-step tokenization was a large share of a small model's SFT step)."""
    p_ids = tokenizer(prompts)["input_ids"]
    c_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    return [(p, c + [tokenizer.eos_token_id]) for p, c in zip(p_ids, c_ids, strict=True)]


def _batch(pad_id: int, pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [prompt; completion; EOS] ids and labels with the prompt and padding masked (-100)."""
    length = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), length), pad_id)  # [N, L]
    lab = torch.full((len(pairs), length), -100)  # [N, L]
    for i, (p, c) in enumerate(pairs):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        lab[i, len(p): len(p) + len(c)] = torch.tensor(c)
    return ids, lab


def train_sft(model, tokenizer, task, sft: SFTConfig, *, seed: int, evaluation: EvalConfig, steps: int | None = None,
              time_budget_s: float | None = None, constant_lr: float | None = None) -> dict:
    """Run SFT in place on `model`. Returns a small history (step, loss, accuracy) for reporting; held-out
    accuracy is greedy, at `evaluation`'s generation budget and batch size.

    `constant_lr` replaces the warmup+cosine schedule (used to *continue* a finished SFT run at its final LR).
    """
    task = TaskAdapter.of(task)
    if task.episodic:
        raise ConfigError(f"sft.enabled: the warm start is single-turn and task {task.name} is multi-turn; give its "
                          "demonstrations to TB instead (data.source=task), or sft.enabled=false")
    steps = steps if steps is not None else sft.steps
    rng = random.Random(seed)
    prompts = task.train
    demos = task.demonstrations(prompts, seed=seed)
    pairs = _encode(tokenizer, [p.text for p in prompts], demos)
    opt = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    history, t0, step = [], time.perf_counter(), 0
    model.train()
    for step in range(1, steps + 1):
        warm = min(1.0, step / max(sft.warmup_steps, 1))
        progress = (step - sft.warmup_steps) / max(steps - sft.warmup_steps, 1)
        decay = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
        for g in opt.param_groups:
            g["lr"] = constant_lr if constant_lr is not None else sft.lr * warm * decay
        idx = [rng.randrange(len(prompts)) for _ in range(sft.batch_size)]
        ids, labels = _batch(tokenizer.pad_token_id, [pairs[i] for i in idx])
        logits = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long()).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % sft.log_every_steps == 0 or step == steps:
            model.eval()
            acc = greedy_accuracy(model, tokenizer, task, task.test, evaluation.max_new_tokens, evaluation.batch_size)
            model.train()
            history.append({"step": step, "loss": loss.item(), "test_accuracy": acc,
                            "elapsed_s": time.perf_counter() - t0})
            logger.info(f"sft step {step}/{steps}  loss {loss.item():.3f}  test acc {acc:.3f}  "
                f"({time.perf_counter() - t0:.0f}s)")
        if time_budget_s is not None and time.perf_counter() - t0 >= time_budget_s:
            break
    model.eval()
    return {"history": history, "steps": step, "seconds": time.perf_counter() - t0}


def plateau_warning(history: list[dict], window: int = 4, rise: float = 0.02) -> str | None:
    """A message when the warm start's held-out accuracy was still rising over its last `window` evaluations.

    Why it matters: the noisy-teacher design assumes a *plateaued* start, whose remaining errors are the
    teacher's slips that sampling sometimes avoids. From a start still mid-curve RL can barely move, so the arith
    recipes' sft.steps are set so that every seed's warm start plateaus. A warning, not an error: it is a
    heuristic."""
    accs = [h["test_accuracy"] for h in history[-window:]]
    if len(accs) < window or accs[-1] - accs[0] <= rise:
        return None
    steps = [h["step"] for h in history[-window:]]
    return (f"WARNING: the SFT warm start had not plateaued: held-out accuracy still rose {accs[0]:.1%} → "
            f"{accs[-1]:.1%} over SFT steps {steps[0]}–{steps[-1]}; RL from a start still mid-curve can fail to "
            "learn. Raise sft.steps.")


SHIPPED = Path(__file__).resolve().parent.parent / "recipes" / "warm_starts"
"""Warm starts shipped with the package (the embedded default's, a few MB): a first run starts RL at once on any
CPU instead of spending most of its minutes on SFT. Found by the same key as the cache, so any other setting
(another seed, sft.steps, task size) trains and caches its own."""


def warm_start(task, sft: SFTConfig, tiny: TinyModelConfig, *, seed: int, key: str, evaluation: EvalConfig) -> Path:
    """Return a directory holding the SFT'd built-in model and tokenizer: shipped, cached, or trained now (then
    cached). `key`: `cache_key` of the settings that made it."""
    name = f"sft-{task.name}-{key}"
    for path, where in ((SHIPPED / name, "shipped with tba"), (cache_root(sft) / name, "cached")):
        if (path / "config.json").is_file() and (path / "sft.json").is_file():
            logger.info(f"SFT warm start: using the {where} checkpoint {path}")
            if warning := plateau_warning(json.loads((path / "sft.json").read_text()).get("history", [])):
                logger.warning(warning)
            return path
    path = cache_root(sft) / name
    logger.info(f"SFT warm start: no cached checkpoint, training one ({sft.steps} steps) → {path}")
    tokenizer = train_tokenizer(task.corpus(), tiny.vocab_size)
    model = build_tiny_model(tokenizer, tiny, seed=seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # nothing else runs yet: SFT gets every core
    try:
        result = train_sft(model, tokenizer, task, sft, seed=seed, evaluation=evaluation)
    finally:
        torch.set_num_threads(threads)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    save_checkpoint(model, tokenizer, tmp)
    (tmp / "sft.json").write_text(json.dumps(result, indent=1))
    if path.exists():  # a stale partial entry (no sft.json): replace it
        shutil.rmtree(path)
    tmp.rename(path)
    if warning := plateau_warning(result["history"]):
        logger.warning(warning)
    return path
