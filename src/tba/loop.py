"""THE training loop, shared by every runtime: prefill, then per step collect → sample → update → publish.

    prefill the buffer with P completions
    for u = 1..U:
        add whatever groups the searchers produced to the buffer   (async: never waits; sync: waits)
        draw B prompt groups × K samples (recency with prob. m, else reward-prioritised history)
        one TB update
        every k updates: publish weights (version = updates applied) and start a new recency window
        every N updates: greedy pass@1 on held-out prompts

The runtime (inline, local processes, Ray) only decides where searchers run and how groups and weights
travel; this file is the order of operations, which is part of the algorithm.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from tba.buffer import ReplayBuffer
from tba.build import apply_chat_template, build_models, build_task
from tba.config import RunConfig, save_config
from tba.evaluate import greedy_accuracy
from tba.metrics import MetricsLogger
from tba.models import num_parameters, save_checkpoint
from tba.progress import RunProgress
from tba.runtime import make_runtime
from tba.runtime.base import default_threads
from tba.trainer import Trainer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: RunConfig, log=print) -> dict:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    torch.set_num_threads(cfg.threads or default_threads(cfg.search.num_searchers, cfg.runtime)[0])
    seed_everything(cfg.seed)
    t_run = time.perf_counter()

    task = build_task(cfg)
    tokenizer, policy, reference, source = build_models(cfg, task, log=log)
    if cfg.task.chat_template:
        apply_chat_template(task, tokenizer)
    log(f"task {task.name}: {len(task.train)} train / {len(task.test)} test prompts; "
        f"policy {num_parameters(policy) / 1e6:.2f}M params; runtime {cfg.runtime}, mode {cfg.mode}")
    buffer = ReplayBuffer(cfg.buffer.capacity_per_prompt, cfg.buffer.online_prob,
                          cfg.buffer.offline_inverse_temperature, cfg.buffer.dedup, seed=cfg.seed)
    trainer = Trainer(policy, cfg.trainer, cfg.tb, objective=cfg.objective, temperature=cfg.search.temperature,
                      pad_id=tokenizer.pad_token_id, baselines=cfg.baselines, max_tokens=cfg.search.max_new_tokens,
                      reference=copy.deepcopy(reference) if cfg.objective == "tba_prime" else None)
    runtime = make_runtime(cfg, task=task, tokenizer=tokenizer, policy=policy, reference=reference,
                           source=source, out_dir=out)
    logger = MetricsLogger(out, cfg)
    try:
        summary = _run(cfg, task, tokenizer, policy, buffer, trainer, runtime, logger, log, t_run)
    finally:
        runtime.stop()
        logger.close()
    save_checkpoint(policy, tokenizer, out / "checkpoint")
    summary["checkpoint"] = str(out / "checkpoint")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _run(cfg, task, tokenizer, policy, buffer, trainer, runtime, logger, log, t_run) -> dict:
    def evaluate() -> float:
        return greedy_accuracy(policy, tokenizer, task, task.test, cfg.eval.max_new_tokens, cfg.eval.batch_size)

    t_train = time.perf_counter()
    evals = [(0, evaluate(), 0.0)]  # (step, accuracy, training seconds so far, evaluation excluded)
    log(f"test accuracy at start (greedy pass@1, {len(task.test)} problems): {evals[0][1]:.3f}")
    runtime.start()  # searchers run from here on (async: continuously)
    t_train, eval_s = time.perf_counter(), 0.0  # eval_s: evaluation time inside the loop, excluded below

    received = 0
    while len(buffer) < cfg.buffer.prefill_samples:
        for group in runtime.collect(block=True):
            buffer.add(group)
            received += len(group.samples)
    buffer.mark_sync()
    log(f"buffer prefilled: {len(buffer)} samples over {buffer.num_prompts} prompts")

    t, rewards_seen, busy_s = cfg.trainer, [], 0.0
    t_loop = time.perf_counter()
    with RunProgress(t.steps, enabled=cfg.logging.progress) as progress:
        for step in range(1, t.steps + 1):
            groups = runtime.collect(block=cfg.mode == "sync")
            for group in groups:
                buffer.add(group)
            fresh = [s.reward for g in groups for s in g.samples]
            received += len(fresh)
            if fresh:
                rewards_seen.append(float(np.mean(fresh)))
            t_step = time.perf_counter()
            draws = buffer.sample(t.prompts_per_step, t.samples_per_prompt)
            staleness = [trainer.version - s.version for d in draws for s in d.samples]
            metrics = trainer.step(draws)
            if step % t.sync_every_steps == 0:
                t_sync = time.perf_counter()
                runtime.publish(trainer.weights(), trainer.version)
                buffer.mark_sync()
                metrics["sync/publish_s"] = time.perf_counter() - t_sync
            busy_s += time.perf_counter() - t_step
            if step % cfg.eval.every_steps == 0 or step == t.steps:
                t_eval = time.perf_counter()
                evals.append((step, evaluate(), t_eval - t_train - eval_s))
                eval_s += time.perf_counter() - t_eval
                log(f"step {step}: test accuracy {evals[-1][1]:.3f}")
                metrics["eval/test_accuracy"] = evals[-1][1]
            ages = [trainer.version - s.version for h in buffer.histories.values() for s in h.items]
            metrics.update({
                "searcher/reward_mean": rewards_seen[-1] if rewards_seen else float("nan"),
                "searcher/samples_received": received,
                "buffer/draw_reward_mean": float(np.mean([s.reward for d in draws for s in d.samples])),
                "buffer/size": len(buffer),
                "buffer/prompts": buffer.num_prompts,
                "buffer/age_mean": float(np.mean(ages)),
                "buffer/online_fraction": float(np.mean([d.online for d in draws])),
                "staleness/mean": float(np.mean(staleness)),
                "staleness/max": float(np.max(staleness)),
                "trainer/busy_fraction": busy_s / max(time.perf_counter() - t_loop - eval_s, 1e-9),
                **runtime.stats(),
            })
            metrics.update({  # the documented short names
                "wall_clock_s": time.perf_counter() - t_run, "loss": metrics["trainer/loss"],
                "reward_mean": metrics["searcher/reward_mean"], "beta": metrics["trainer/beta"],
                "lr": metrics["trainer/lr"], "buffer_size": len(buffer),
                "tokens_per_s": metrics["trainer/tokens_per_s"], "staleness_mean": metrics["staleness/mean"],
                "staleness_max": metrics["staleness/max"],
            })
            logger.log(step, metrics)
            progress.update(step, reward=metrics["reward_mean"], accuracy=evals[-1][1],
                            beta=metrics["trainer/beta"], tokens_per_s=metrics["trainer/tokens_per_s"])

    window = max(1, len(rewards_seen) // 10)
    train_s = time.perf_counter() - t_train - eval_s
    return {
        "test_accuracy_start": evals[0][1],
        "test_accuracy_end": evals[-1][1],
        "test_problems": len(task.test),
        "train_reward_start": float(np.mean(rewards_seen[:window])) if rewards_seen else float("nan"),
        "train_reward_end": float(np.mean(rewards_seen[-window:])) if rewards_seen else float("nan"),
        "wall_clock_s": time.perf_counter() - t_run,
        "train_wall_clock_s": train_s,
        "trainer_steps": trainer.version,
        "skipped_steps": trainer.skipped_steps,
        "samples_generated": received,
        "trainer_busy_fraction": busy_s / max(time.perf_counter() - t_loop - eval_s, 1e-9),
        "objective": cfg.objective,
        "runtime": cfg.runtime,
        "mode": cfg.mode,
        "seed": cfg.seed,
        "searchers": runtime.placement(),
        "evals": evals,
    }
