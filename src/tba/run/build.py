"""Build everything a run trains with from a validated config: the only code that reads a `RunConfig` and
resolves registry names (tasks, objectives, samplers, runtimes).

Every component it makes takes only its own section(s) of the config and finished parts — the trainer a bound
loss and its `trainer` section, the buffer its `buffer` section, each searcher a
`tba.runtime.searcher_spec.SearcherSpec`, the loop its `LoopSettings` — so a component's signature lists
everything it needs. No training logic here (that is tba.algorithm.loop); tba.run.train composes a run around it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sqlite3
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tba.algorithm.buffer import ReplayBuffer
from tba.algorithm.loop import LoopSettings
from tba.algorithm.objectives import OBJECTIVES
from tba.algorithm.objectives.tb import beta_schedule
from tba.algorithm.objectives.tba_prime import ResettingReference
from tba.algorithm.runtime import Runtime
from tba.algorithm.seeding import rng_isolated
from tba.algorithm.state import RunState
from tba.algorithm.store import BufferStore, StoreError
from tba.algorithm.trainer import Trainer
from tba.config import RunConfig
from tba.errors import ConfigError
from tba.models import (
    apply_lora,
    load_model,
    load_tokenizer,
    num_parameters,
    precision,
    resolve_device,
    save_checkpoint,
)
from tba.models.builtin import build_tiny_model, train_tokenizer
from tba.models.shape import source_config
from tba.models.sources import resolve_source
from tba.ranks.controller import ShardedTrainer
from tba.rollout.demonstrations import make_groups, read_rows, target_weight_warning
from tba.rollout.episodes import Limits
from tba.rollout.evaluate import SpreadEvaluator
from tba.run import rundir
from tba.run.checkpoint import CheckpointError, restore_trainer
from tba.run.evaluation import CurrentPolicy, fit_task, run_evaluator
from tba.run.placement import publish_dtype
from tba.run.searchers import (
    aging_sources,
    behaviour_weights,
    build_runtime,
    default_threads,
    searcher_groups,
    task_spec,
)
from tba.run.sft import cache_key
from tba.run.sft import warm_start as sft_warm_start
from tba.run.sharded import RankBuild, build_sharded
from tba.runtime.searcher_spec import ModelSources
from tba.runtime.worker import InlineParts
from tba.tasks.base import Task, TaskAdapter
from tba.tasks.data import DataLoadError
from tba.tasks.prepare import build_task as build_task_from_spec

logger = logging.getLogger(__name__)


# ---- the task and the models ---------------------------------------------------------------------------------
def build_task(cfg: RunConfig, tokenizer=None) -> Task:
    """The configured task; with `task.chat_template` and a tokenizer, its prompts in the chat template."""
    return build_task_from_spec(task_spec(cfg), tokenizer)


def warm_start(cfg: RunConfig, task: Task) -> Path:
    """The builtin model's SFT warm start for this config (tba.run.sft), trained on a cache miss."""
    seed = cfg.seed if cfg.sft.seed is None else cfg.sft.seed
    key = cache_key(cfg.task, cfg.model.tiny, cfg.sft, seed)
    return sft_warm_start(task, cfg.sft, cfg.model.tiny, seed=seed, key=key, evaluation=cfg.eval)


def build_models(cfg: RunConfig, task: Task, reference: bool = True):
    """(tokenizer, policy, reference, source). The reference is frozen; by default it is the policy's start
    (`reference` False: None, not loaded).

    `source` is where the starting policy can be loaded from again (hub name or directory), so that searchers
    in other processes or on other nodes load the same weights; None when the policy exists only in memory.
    """
    m = cfg.model
    source = None
    if m.policy == "builtin":
        if cfg.sft.enabled:
            with rng_isolated():  # trained now or read from the cache: the run after it is the same
                source = str(warm_start(cfg, task))
            tokenizer, policy = load_tokenizer(source), load_model(source, m.dtype)
        else:
            tokenizer = train_tokenizer(task.corpus(), m.tiny.vocab_size)
            policy = build_tiny_model(tokenizer, m.tiny, seed=cfg.seed)
    else:
        source = resolve_source(m.policy)
        tokenizer, policy = load_tokenizer(source), load_model(source, m.dtype)
    if reference:
        reference = load_model(m.reference, m.dtype) if m.reference else copy.deepcopy(policy)
        reference.eval().requires_grad_(False)
    else:
        reference = None
    if m.lora.enabled:
        policy = apply_lora(policy, m.lora)
    return tokenizer, policy, reference, source


def _loadable(source: str | None) -> bool:
    """A directory that still exists, or what looks like a hub name (org/name)."""
    if not source:
        return False
    return Path(source).exists() or (not source.startswith(("/", ".", "~")) and source.count("/") == 1)


def start_models(cfg: RunConfig, task: Task, out: Path, resume_from: Path | None, state: RunState):
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
    tokenizer, policy, reference, source = build_models(cfg, task)  # (re)builds the start, e.g. SFT
    if source is None:
        source = str(out / "init")
        save_checkpoint(policy, tokenizer, Path(source))
    if resume_from is not None:
        policy = load_model(str(resume_from / "model"), cfg.model.dtype)
    state.policy_source, state.reference_source = source, cfg.model.reference or source
    return tokenizer, policy, reference


# ---- the components ------------------------------------------------------------------------------------------
def build_buffer(cfg: RunConfig, out: Path, resume_from: Path | None, buffer_state: dict | None,
                 set_aside: bool = False):
    """The replay buffer: restored from RUN_DIR/buffer.sqlite on resume (and persisted there as it fills),
    or, for runtime=offline, loaded once from `buffer.source` (read-only, closed after loading). A buffer that
    cannot be read stops a resume with the way out; with `set_aside` (--set-aside-buffer) it is moved aside and
    the run goes on from the checkpoint with the groups it can still read (`salvaged_buffer`)."""
    b, d = cfg.buffer, cfg.data
    buffer = ReplayBuffer(b, seed=cfg.seed, aging=aging_sources(cfg),
                          data_sources=frozenset({d.name} if d.source else ()), data_share=d.share if d.source else 0.0)
    if cfg.runtime == "offline":  # train on a saved buffer; nothing new is written
        store = buffer.open(b.source, readonly=True)
        try:
            buffer.restore(buffer_state)
            logger.info(f"offline: {buffer.groups_added} groups ({len(buffer)} samples in memory) from {store.path}")
        finally:
            buffer.close()
        return buffer
    if b.persist:
        try:
            store = buffer.open(out)
            if resume_from is not None or store.num_groups():
                later = buffer.restore(buffer_state)
                logger.info(f"buffer restored: {buffer.groups_added} groups ({len(buffer)} samples in memory), "
                            f"{later} of them accepted after the checkpoint")
        except (StoreError, sqlite3.DatabaseError, RuntimeError) as e:
            buffer.close()
            if not set_aside or resume_from is None:
                raise StoreError(f"the replay buffer of {out} cannot be read ({e}). `tba train --resume {out} "
                                 "--set-aside-buffer` moves it aside and resumes from the checkpoint with the groups "
                                 "it can still read") from None
            return salvaged_buffer(cfg, out)
    elif resume_from is not None:
        raise CheckpointError("buffer.persist=false: this run has no saved buffer to resume from")
    return buffer


def salvaged_buffer(cfg: RunConfig, out: Path) -> ReplayBuffer:
    """A new buffer for a run whose buffer could not be read: the old file moved aside, and every group that can
    still be read from it accepted again, in order, into a new buffer.sqlite (the checkpoint's sampling state
    belonged to the old one and is not restored: the run continues as from a new recency window)."""
    aside = rundir.set_aside_buffer(out)
    buffer = ReplayBuffer(cfg.buffer, seed=cfg.seed, aging=aging_sources(cfg),
                          data_sources=frozenset({cfg.data.name} if cfg.data.source else ()),
                          data_share=cfg.data.share if cfg.data.source else 0.0)
    buffer.open(out)
    salvaged, why = [], "nothing to read"
    try:
        old = BufferStore(aside, readonly=True)
        for _, _, group in old.iter_groups():
            salvaged.append(group)
        why = "read to the end"
    except (StoreError, sqlite3.DatabaseError, OSError) as e:
        why = f"read until {type(e).__name__}: {e}"
    if salvaged:
        buffer.extend(salvaged, step=0)
    logger.warning(f"replay buffer set aside as {aside}; {len(salvaged)} of its groups ({why}) are in the new "
                   f"buffer, {len(buffer)} samples over {buffer.num_prompts} prompts")
    return buffer


def add_data(cfg: RunConfig, buffer: ReplayBuffer, *, task: Task, prompt_ids: dict[str, int], tokenizer,
             reference) -> dict | None:
    """`data.source`'s completions into the buffer (tba.rollout.demonstrations), once: a buffer restored with them
    keeps them.
    Returns what became of the rows, for the summary (None when nothing was read)."""
    d = cfg.data
    if not d.source or buffer.data:
        return None
    rows = read_rows(d, task, cfg.seed)
    groups, report = make_groups(rows, d, task=task, prompt_ids=prompt_ids, tokenizer=tokenizer, reference=reference,
                                 temperature=cfg.search.temperature, max_new_tokens=cfg.search.max_new_tokens,
                                 limits=Limits.of(cfg.search))
    if not groups:
        raise DataLoadError(f"data.source: {d.source}: no usable row ({report.line(d.name)})")
    buffer.extend(groups, step=0)  # one transaction: every group of the data, or none
    logger.info(report.line(d.name) + f"; over {len(groups)} prompts, drawn at data.share={d.share}")
    warning = target_weight_warning(groups, cfg.tb.beta_final) if OBJECTIVES[cfg.objective].targets_pi_star else None
    if warning:
        logger.warning(warning)
    return {**dataclasses.asdict(report), "target_weight_warning": warning}


def trainer_args(cfg: RunConfig, reference, pad_id: int) -> dict:
    """The Trainer's arguments besides its model: the run's objective bound once to its settings, β's schedule; an
    objective that keeps its own π_ref (TBA′) gets a copy of `reference`, reset every baselines.reference_reset_steps
    updates."""
    objective = OBJECTIVES[cfg.objective]
    own = (ResettingReference(copy.deepcopy(reference), cfg.baselines.reference_reset_steps,
                              cfg.trainer.logprob_chunk_tokens) if objective.owns_reference else None)
    return dict(loss=objective.bind(cfg.tb, cfg.baselines, max_tokens=cfg.search.max_new_tokens), cfg=cfg.trainer,
                beta=beta_schedule(cfg.tb), temperature=cfg.search.temperature, pad_id=pad_id, reference=own,
                aging=aging_sources(cfg), autocast=cfg.model.autocast)


def build_trainer(cfg: RunConfig, policy, reference, tokenizer) -> Trainer:
    """The one-process trainer (trainer.world_size = 1) over `policy`, on its device."""
    return Trainer(policy, **trainer_args(cfg, reference, tokenizer.pad_token_id))


def sharded_start(cfg: RunConfig, task: Task, out: Path, resume_from: Path | None, state: RunState):
    """(tokenizer, where rank 0 loads the start weights from) for a sharded trainer, and `state`'s model sources
    filled in. The controller builds a start itself only when it exists nowhere else — the builtin model, fresh
    LoRA adapters (written to RUN_DIR/start: the adapters only, over their base) — and never keeps it."""
    if resume_from is not None and _loadable(state.policy_source) and _loadable(state.reference_source):
        return load_tokenizer(str(resume_from / "model")), str(resume_from / "model")
    m = cfg.model
    if m.policy == "builtin" or m.lora.enabled:
        tokenizer, policy, _, source = build_models(cfg, task, reference=False)
        if source is None:
            source = str(out / "init")
            save_checkpoint(policy, tokenizer, Path(source))
        start = source
        if m.lora.enabled:
            start = str(out / "start")
            save_checkpoint(policy, tokenizer, Path(start))
        del policy
    else:
        source = resolve_source(m.policy)
        tokenizer, start = load_tokenizer(source), source
    if resume_from is not None:
        start = str(resume_from / "model")
    state.policy_source, state.reference_source = source, m.reference or source
    return tokenizer, start


def make_sharded_trainer(cfg: RunConfig, start: str, state: RunState, pad_id: int, out: Path,
                         resume_from: Path | None) -> ShardedTrainer:
    """The controller's handle on trainer.world_size ranks, each building its part from `start`."""
    own = str(resume_from / "reference") if resume_from is not None and (resume_from / "reference").is_dir() else None
    build = RankBuild(cfg, start, state.policy_source, state.reference_source, own, pad_id)
    threads = cfg.threads or default_threads(sum(g.num_searchers for g in searcher_groups(cfg)), cfg.runtime)[0]
    return build_sharded(cfg, build, threads=threads, publish_dtype=publish_dtype(cfg), run_dir=out)


def loop_settings(cfg: RunConfig) -> LoopSettings:
    t = cfg.trainer
    return LoopSettings(steps=t.steps, prompts_per_step=t.prompts_per_step, samples_per_prompt=t.samples_per_prompt,
                        sync_every_steps=t.sync_every_steps, prefill_samples=cfg.buffer.prefill_samples,
                        eval_every_steps=cfg.eval.every_steps, checkpoint_every_steps=cfg.checkpoint.every_steps,
                        max_replay_ratio=t.max_replay_ratio, sync_mode=cfg.mode == "sync",
                        replay_warning=t.replay_warning)


# ---- a run ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """What `build_run` returns: everything the loop trains with."""

    task: Task
    tokenizer: PreTrainedTokenizerBase
    policy: PreTrainedModel | None
    """On its device; a PEFT model when the run trains LoRA. None for a sharded trainer (its ranks hold it)."""
    reference: PreTrainedModel | None
    """π_ref, frozen, on the policy's device (None for a sharded trainer)."""
    trainer: Trainer
    buffer: ReplayBuffer
    runtime: Runtime
    evaluator: CurrentPolicy
    fitted: dict[str, int]
    """prompts_too_long / prompts_truncated (tba.tasks.prepare.fit_prompts), for the summary."""
    identity: dict
    """objective, runtime, mode, seed: what the summary says the run was."""
    data: dict | None = None
    """What became of data.source's rows (tba.rollout.demonstrations.DataReport), when they were read in this
    segment."""


def build_run(cfg: RunConfig, out: Path, resume_from: Path | None, checkpoint: dict, state: RunState,
              set_aside_buffer: bool = False) -> Run:
    """Task, models (on their device), trainer (restored on resume), buffer and runtime, in that order.
    `checkpoint`: the checkpoint's full state ({} for a fresh run); `state`: its tba.algorithm.state.RunState;
    `set_aside_buffer`: a buffer that cannot be read is moved aside (`build_buffer`). A sharded trainer's controller
    (trainer.world_size > 1) holds no model: its ranks do (tba.run.sharded)."""
    task = build_task(cfg)
    prompt_ids = {p.text.strip(): p.id for p in task.train}  # as the task wrote them, before any chat template
    sharded = cfg.trainer.world_size > 1
    device = resolve_device(cfg.model.device) if not sharded else torch.device("cpu")
    if sharded:
        tokenizer, start = sharded_start(cfg, task, out, resume_from, state)
        policy = reference = None
        architecture = source_config(state.policy_source)
    else:
        tokenizer, policy, reference = start_models(cfg, task, out, resume_from, state)
        policy, reference = policy.to(device), reference.to(device)
        architecture = policy.config
    limit, fitted = fit_task(cfg, task, tokenizer, architecture)  # now that the tokenizer exists
    if sharded:
        logger.info(f"task {task.name}: {len(task.train)} train / {len(task.test)} test prompts; policy "
                    f"{state.policy_source} on {cfg.trainer.world_size} trainer ranks; runtime {cfg.runtime}, "
                    f"mode {cfg.mode}")
        trainer = make_sharded_trainer(cfg, start, state, tokenizer.pad_token_id, out, resume_from)
    else:
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        lora = "" if trainable == num_parameters(policy) else f" ({trainable / 1e6:.2f}M trainable, LoRA)"
        logger.info(f"task {task.name}: {len(task.train)} train / {len(task.test)} test prompts; "
            f"policy {num_parameters(policy) / 1e6:.2f}M params{lora} on {device}; "
            f"runtime {cfg.runtime}, mode {cfg.mode}")
        trainer = build_trainer(cfg, policy, reference, tokenizer)
    try:  # a sharded trainer's ranks are processes: a failure below must not leave them waiting
        if resume_from is not None:
            restore_trainer(trainer, resume_from, checkpoint)
        buffer = build_buffer(cfg, out, resume_from, checkpoint.get("buffer"), set_aside_buffer)
        scorer = reference
        if sharded and cfg.data.source and not buffer.data:  # π_ref scores the data once, in host memory
            scorer = load_model(state.reference_source, cfg.model.dtype).eval().requires_grad_(False)
        with precision.autocast(device, cfg.model.autocast):  # π_ref scores the data as the searchers score theirs
            data = add_data(cfg, buffer, task=task, prompt_ids=prompt_ids, tokenizer=tokenizer, reference=scorer)
        del scorer
        sources = ModelSources(policy=state.policy_source, reference=state.reference_source,
                               tokenizer=state.policy_source)
        weights, version, behaviour = behaviour_weights(cfg, policy, trainer, state, resumed=resume_from is not None)
        inline = InlineParts(task, tokenizer, behaviour, reference) if cfg.runtime == "inline" else None
        runtime = build_runtime(cfg, weights=weights, version=version, inline=inline, sources=sources, limit=limit,
                                states=checkpoint.get("searchers"))
        if sharded and TaskAdapter.of(task).agentic:
            raise ConfigError(f"task.name={cfg.task.name}: an agent task's evaluation serves the trainer's policy "
                              "in one process; a sharded trainer (trainer.world_size > 1) cannot yet")
        if sharded:
            evaluator = SpreadEvaluator(task, cfg.eval, trainer.evaluate, trainer.world)
        else:
            evaluator = run_evaluator(cfg, task, policy, tokenizer, reference)  # as `tba eval` runs it
        identity = {"objective": cfg.objective, "runtime": cfg.runtime, "mode": cfg.mode, "seed": cfg.seed}
    except BaseException:
        trainer.close()
        raise
    return Run(task, tokenizer, policy, reference, trainer, buffer, runtime, evaluator, fitted, identity, data)
