"""Build everything a run trains with from a validated config: task, models, trainer, buffer, runtime.

No training logic here (that is tba.loop), and the only place that turns config names into objects —
including the runtime, so the loop never asks which runtime it has. `build_run` is the entry point; the
pieces are separate so benchmarks and workers can build just what they need.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tba.config import RunConfig
from tba.models import (
    apply_lora,
    build_tiny_model,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_source,
    save_checkpoint,
    train_tokenizer,
)
from tba.tasks.prepare import apply_chat_template, build_task, fit_prompts, prompt_limit

if TYPE_CHECKING:  # for the annotations only: building imports these lazily, where they are used
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tba.buffer import ReplayBuffer
    from tba.runtime.base import Runtime
    from tba.tasks.base import Task
    from tba.trainer import Trainer


def build_models(cfg: RunConfig, task, log=print):
    """(tokenizer, policy, reference, source). The reference is frozen; by default it is the policy's start.

    `source` is where the starting policy can be loaded from again (hub name or directory), so that searchers
    in other processes or on other nodes load the same weights; None when the policy exists only in memory.
    """
    m = cfg.model
    source = None
    if m.policy == "builtin":
        if cfg.sft.enabled:
            from tba.seeding import rng_isolated
            from tba.sft import warm_start

            with rng_isolated():  # trained now or read from the cache: the run after it is the same
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


def _loadable(source: str | None) -> bool:
    """A directory that still exists, or what looks like a hub name (org/name)."""
    if not source:
        return False
    return Path(source).exists() or (not source.startswith(("/", ".", "~")) and source.count("/") == 1)


def start_models(cfg: RunConfig, task, out: Path, resume_from: Path | None, state, log=print):
    """(tokenizer, policy, reference) for a run, and `state`'s model sources filled in.

    The sources are where other processes (and vLLM) load the *starting* models from; searchers then receive
    the newest weights from the trainer. A start policy that exists only in memory (the builtin model, an SFT
    warm start) is written once to RUN_DIR/init. On resume the trainer's policy is the checkpoint's.
    """
    if resume_from is not None and _loadable(state.policy_source) and _loadable(state.reference_source):
        tokenizer = load_tokenizer(str(resume_from / "model"))
        policy = load_model(str(resume_from / "model"), cfg.model.dtype)
        reference = load_model(state.reference_source, cfg.model.dtype).eval().requires_grad_(False)
        return tokenizer, policy, reference
    tokenizer, policy, reference, source = build_models(cfg, task, log=log)  # (re)builds the start, e.g. SFT
    if source is None:
        source = str(out / "init")
        save_checkpoint(policy, tokenizer, Path(source))
    if resume_from is not None:
        policy = load_model(str(resume_from / "model"), cfg.model.dtype)
    state.policy_source, state.reference_source = source, cfg.model.reference or source
    return tokenizer, policy, reference


def build_buffer(cfg: RunConfig, out: Path, resume_from: Path | None, buffer_state: dict | None, log=print):
    """The replay buffer: restored from RUN_DIR/buffer.sqlite on resume (and persisted there as it fills),
    or, for runtime=offline, loaded once from `buffer.source` (read-only, closed after loading)."""
    from tba.buffer import ReplayBuffer
    from tba.checkpoint import CheckpointError
    from tba.store import BufferStore

    b = cfg.buffer
    buffer = ReplayBuffer(b.capacity_per_prompt, b.online_prob, b.offline_inverse_temperature, b.dedup,
                          seed=cfg.seed, max_samples=b.max_samples)
    if cfg.runtime == "offline":  # train on a saved buffer; nothing new is written
        buffer.store = BufferStore(b.source, readonly=True)
        try:
            buffer.restore(buffer_state)
            log(f"offline: {buffer.groups_added} groups ({len(buffer)} samples in memory) from {buffer.store.path}")
        finally:
            buffer.store.close()
            buffer.store = None
        return buffer
    if b.persist:
        buffer.store = BufferStore(out)
        if resume_from is not None or buffer.store.num_groups():
            later = buffer.restore(buffer_state)
            log(f"buffer restored: {buffer.groups_added} groups ({len(buffer)} samples in memory), "
                f"{later} of them accepted after the checkpoint")
    elif resume_from is not None:
        raise CheckpointError("buffer.persist=false: this run has no saved buffer to resume from")
    return buffer


def build_trainer(cfg: RunConfig, policy, reference, tokenizer):
    from tba.objectives import OBJECTIVES
    from tba.trainer import Trainer

    owns = OBJECTIVES[cfg.objective].owns_reference  # e.g. TBA′ resets its own π_ref copy every ρ steps
    return Trainer(policy, cfg.trainer, cfg.tb, objective=cfg.objective, temperature=cfg.search.temperature,
                   pad_id=tokenizer.pad_token_id, baselines=cfg.baselines, max_tokens=cfg.search.max_new_tokens,
                   reference=copy.deepcopy(reference) if owns else None)


def build_runtime(cfg: RunConfig, *, task, tokenizer, policy, reference, sources, version: int = 0,
                  states: list[dict] | None = None, log=print):
    """The configured runtime (tba.runtime.RUNTIMES) around searchers that start from the trainer's current
    policy. `sources`: a tba.runtime.base.ModelSources; on resume, `version` is the policy version of `policy`
    and `states` the searchers' checkpointed states."""
    from tba.runtime import RUNTIMES

    threads = cfg.search.threads or default_threads(cfg.search.num_searchers, cfg.runtime)[1]
    return RUNTIMES[cfg.runtime].build(cfg, task=task, tokenizer=tokenizer, policy=policy, reference=reference,
                                       sources=sources, version=version, states=states, log=log, threads=threads)


@dataclasses.dataclass
class Run:
    """What `build_run` returns: everything the loop trains with."""

    task: Task
    tokenizer: PreTrainedTokenizerBase
    policy: PreTrainedModel
    """On its device; a PEFT model when the run trains LoRA."""
    reference: PreTrainedModel
    """π_ref, frozen, on the policy's device."""
    trainer: Trainer
    buffer: ReplayBuffer
    runtime: Runtime
    fitted: dict[str, int]
    """prompts_too_long / prompts_truncated (tba.tasks.prepare.fit_prompts), for the summary."""


def build_run(cfg: RunConfig, out: Path, resume_from: Path | None, checkpoint: dict, state, log=print) -> Run:
    """Task, models (on their device), trainer (restored on resume), buffer and runtime, in that order.
    `checkpoint`: the checkpoint's full state ({} for a fresh run); `state`: its tba.state.RunState."""
    from tba.models import num_parameters
    from tba.runtime.base import ModelSources

    task = build_task(cfg)
    tokenizer, policy, reference = start_models(cfg, task, out, resume_from, state, log)
    device = resolve_device(cfg.model.device)
    policy, reference = policy.to(device), reference.to(device)
    if cfg.task.chat_template:
        apply_chat_template(task, tokenizer)
    limit = prompt_limit(cfg, policy)
    fitted = fit_prompts(task, tokenizer, limit, cfg.task.long_prompts)
    if fitted["prompts_too_long"]:
        log(f"{fitted['prompts_too_long']} prompts longer than {limit} tokens: "
            f"{'truncated' if cfg.task.long_prompts == 'truncate' else 'skipped'} (task.long_prompts)")
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    lora = "" if trainable == num_parameters(policy) else f" ({trainable / 1e6:.2f}M trainable, LoRA)"
    log(f"task {task.name}: {len(task.train)} train / {len(task.test)} test prompts; "
        f"policy {num_parameters(policy) / 1e6:.2f}M params{lora} on {device}; "
        f"runtime {cfg.runtime}, mode {cfg.mode}")
    trainer = build_trainer(cfg, policy, reference, tokenizer)
    if resume_from is not None:
        trainer.load_state(resume_from, checkpoint)
    buffer = build_buffer(cfg, out, resume_from, checkpoint.get("buffer"), log)
    sources = ModelSources(policy=state.policy_source, reference=state.reference_source,
                           tokenizer=state.policy_source)
    behaviour, version = policy, trainer.version
    if resume_from is not None and cfg.trainer.sync_every_steps == 0:
        # k = 0, never synced: the searchers' policy is the run's start, on a resume too (not the checkpoint's)
        behaviour, version = load_model(state.policy_source, cfg.model.dtype).to(device), 0
        if cfg.model.lora.enabled:
            behaviour = apply_lora(behaviour, cfg.model.lora)  # B = 0: the base, under the trainer's tensor names
    runtime = build_runtime(cfg, task=task, tokenizer=tokenizer, policy=behaviour, reference=reference,
                            sources=sources, version=version, states=checkpoint.get("searchers"), log=log)
    return Run(task, tokenizer, policy, reference, trainer, buffer, runtime, fitted)


def default_threads(num_searchers: int, runtime: str) -> tuple[int, int]:
    """(trainer threads, threads per searcher): one share of the cores per process, at least one."""
    cores = os.cpu_count() or 1
    if runtime == "inline":
        return cores, cores
    share = max(1, cores // (num_searchers + 1))
    return share, share


def train(cfg: RunConfig, log=print, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Compose a run — fresh, or resumed from the newest usable checkpoint of `cfg.output_dir` — and run the
    loop (tba.loop.Loop) to `trainer.steps`; returns the summary (also written to summary.json)."""
    import json
    import time

    import torch

    from tba import checkpoint as ckpt
    from tba import rundir
    from tba.config import save_config
    from tba.loop import Loop
    from tba.metrics import MetricsLogger
    from tba.seeding import seed_everything
    from tba.state import RunState

    out = Path(cfg.output_dir)
    rundir.prepare(out, resume=resume, overwrite=overwrite)
    resume_from = ckpt.latest(out, log=log) if resume else None
    checkpoint = ckpt.load(resume_from) if resume_from else {}
    state = RunState.from_checkpoint(checkpoint)
    if resume_from is not None and state.step >= cfg.trainer.steps:
        log(f"{out}: already finished at step {state.step} (trainer.steps={cfg.trainer.steps}); "
            "pass trainer.steps=N to continue training")
        return json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    save_config(cfg, out / "config.yaml")
    torch.set_num_threads(cfg.threads or default_threads(cfg.search.num_searchers, cfg.runtime)[0])
    seed_everything(cfg.seed)
    t_run = time.perf_counter()
    parts = build_run(cfg, out, resume_from, checkpoint, state, log)
    if resume_from is not None:
        state.resumed_at.append(state.step)
        moved = rundir.set_aside_metrics(out, state.step)
        log(f"resuming {out} from {resume_from.name} (step {state.step}); "
            f"{moved} metric lines of the interrupted segment moved to metrics.interrupted.jsonl")
    logger = MetricsLogger(out, cfg)
    if resume_from is not None:
        ckpt.set_rng_state(checkpoint["rng"])  # last: nothing above may consume random numbers after this
    run = Loop(cfg, out, parts, logger, state, log, t_run, resumed=resume_from is not None)
    try:
        summary = run.run()
    finally:
        run.close()
    save_checkpoint(parts.policy, parts.tokenizer, out / "checkpoint")
    summary["checkpoint"] = str(out / "checkpoint")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
