"""One run, start to end: `train` composes a run — fresh, or resumed from the newest usable checkpoint — around the
loop (tba.algorithm.loop) and writes its summary; `sft` builds the builtin model's warm start alone (`tba sft`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import torch

import tba.run.checkpoint as ckpt
import tba.run.rundir as rundir
from tba.algorithm.loop import Loop
from tba.algorithm.monitor import Monitor, tracebacks
from tba.algorithm.seeding import seed_everything, set_rng_state
from tba.algorithm.state import RunState
from tba.config import RunConfig, plain, save_config, to_dict
from tba.errors import ConfigError
from tba.models import save_checkpoint
from tba.models.shape import source_config
from tba.run.build import build_run, build_task, loop_settings, warm_start
from tba.run.checkpoint import Checkpointer
from tba.run.logger import MetricsLogger
from tba.run.progress import RunControl
from tba.run.searchers import default_threads, searcher_groups
from tba.run.sharded import compute_dtype, rank_devices
from tba.run.summary import run_summary
from tba.run.utilization import utilization
from tba.runtime import forkserver

logger = logging.getLogger(__name__)


def train(cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, set_aside_buffer: bool = False,
          callbacks: list | None = None) -> dict:
    """Compose a run — fresh, or resumed from the newest usable checkpoint of `cfg.output_dir` — and run the
    loop (tba.algorithm.loop.Loop) to `trainer.steps`; returns the summary (also written to summary.json). `callbacks`
    are called as fn(step, metrics) after every update."""
    out = Path(cfg.output_dir)
    rundir.prepare(out, resume=resume, overwrite=overwrite)
    resume_from = ckpt.latest(out) if resume else None
    checkpoint = ckpt.load(resume_from) if resume_from else {}
    state = RunState.from_checkpoint(checkpoint)
    if resume_from is not None and state.step >= cfg.trainer.steps:
        logger.info(f"{out}: already finished at step {state.step} (trainer.steps={cfg.trainer.steps}); "
            "pass trainer.steps=N to continue training")
        return json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    save_config(cfg, out / "config.yaml")
    forkserver.start_early(cfg)  # local searchers fork from it: it imports while the models below are built
    searchers = sum(g.num_searchers for g in searcher_groups(cfg))
    torch.set_num_threads(cfg.threads or default_threads(searchers, cfg.runtime)[0])
    seed_everything(cfg.seed)
    t_run = time.perf_counter()
    run = build_run(cfg, out, resume_from, checkpoint, state, set_aside_buffer=set_aside_buffer)
    if resume_from is not None:
        state.resumed_at.append(state.step)
        moved = rundir.set_aside_metrics(out, state.step)
        logger.info(f"resuming {out} from {resume_from.name} (step {state.step}); "
            f"{moved} metric lines of the interrupted segment moved to metrics.interrupted.jsonl")
    metrics = MetricsLogger(out, cfg.logging, plain(to_dict(cfg)), callbacks)
    if resume_from is not None:
        set_rng_state(checkpoint["rng"])  # last: nothing above may consume random numbers after this
    monitor = Monitor(dataclasses.replace(state), t_run, cfg.supervision.heartbeat_timeout_s)
    loop = Loop(loop_settings(cfg), trainer=run.trainer, buffer=run.buffer, runtime=run.runtime,
                evaluator=run.evaluator, checkpoints=Checkpointer(out, run.tokenizer, cfg.checkpoint.keep),
                logger=metrics, state=state, monitor=monitor, resumed=resume_from is not None,
                progress=RunControl(cfg.trainer.steps, enabled=cfg.logging.progress, start=state.step,
                                    plain_every_s=cfg.logging.plain_every_s),
                utilization=trainer_utilization(cfg, run, state))
    errors_log = logging.FileHandler(out / "errors.log", delay=True)  # written only when something raised
    errors_log.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    tracebacks.addHandler(errors_log)
    try:
        totals = loop.run()
        if run.trainer.sharded:  # the ranks write it from their master weights, before they end
            run.trainer.save_model(out / "checkpoint")
            run.tokenizer.save_pretrained(out / "checkpoint")
    finally:
        try:
            loop.close()
        finally:
            tracebacks.removeHandler(errors_log)
            errors_log.close()
            run.trainer.close()
    summary = run_summary(state, run, totals)
    if not run.trainer.sharded:
        save_checkpoint(run.policy, run.tokenizer, out / "checkpoint")
    summary["checkpoint"] = str(out / "checkpoint")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def trainer_utilization(cfg: RunConfig, run, state: RunState):
    """trainer/mfu's counter (tba.run.utilization) for the run's trainer: its devices, compute dtype and policy."""
    if cfg.trainer.world_size > 1:
        return utilization(rank_devices(cfg), compute_dtype(cfg), source_config(state.policy_source),
                           lora=cfg.model.lora.enabled, shared_prompts=cfg.trainer.shared_prompts)
    return utilization([run.policy.device], cfg.model.autocast or cfg.model.dtype, run.policy.config,
                       lora=cfg.model.lora.enabled, shared_prompts=run.trainer.shared_prompts)


def sft(cfg: RunConfig) -> Path:
    """`tba sft`: build (or reuse) the cached SFT warm start of the builtin model."""
    if cfg.model.policy != "builtin":
        raise ConfigError("model.policy: tba sft builds the builtin model's warm start (model.policy=builtin)")
    return warm_start(cfg, build_task(cfg))
