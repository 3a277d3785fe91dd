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

Crash-proofing lives at the step boundary: groups are persisted by the buffer before it accepts them, and
every `checkpoint.every_steps` (and at exit) a full checkpoint is written atomically. `resume=True` rebuilds
everything from the newest complete checkpoint plus every group accepted after it (docs/reliability.md).
"""

from __future__ import annotations

import copy
import json
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch

from tba import checkpoint as ckpt
from tba import rundir
from tba.buffer import ReplayBuffer
from tba.build import apply_chat_template, build_models, build_task, fit_prompts, prompt_limit
from tba.checkpoint import CheckpointError
from tba.config import RunConfig, save_config
from tba.evaluate import evaluate
from tba.metrics import MetricsLogger
from tba.models import load_model, load_tokenizer, num_parameters, resolve_device, save_checkpoint
from tba.progress import RunProgress
from tba.runtime import make_runtime
from tba.runtime.base import default_threads
from tba.store import BufferStore
from tba.trainer import Trainer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _loadable(source: str | None) -> bool:
    """A directory that still exists, or what looks like a hub name (org/name)."""
    if not source:
        return False
    return Path(source).exists() or (not source.startswith(("/", ".", "~")) and source.count("/") == 1)


def _models(cfg: RunConfig, task, out: Path, resume_from: Path | None, state: dict, log):
    """(tokenizer, policy, reference, start-policy source, reference source).

    The sources are where other processes load the *starting* models from (searchers then receive the
    newest weights from the trainer); on resume the trainer's policy is the checkpoint's.
    """
    source, ref_source = state.get("policy_source"), state.get("reference_source")
    if resume_from is not None and _loadable(source) and _loadable(ref_source):
        tokenizer = load_tokenizer(str(resume_from / "model"))
        policy = load_model(str(resume_from / "model"), cfg.model.dtype)
        reference = load_model(ref_source, cfg.model.dtype).eval().requires_grad_(False)
        return tokenizer, policy, reference, source, ref_source
    tokenizer, policy, reference, source = build_models(cfg, task, log=log)  # (re)builds the start, e.g. SFT
    if source is None:  # the start policy exists only in memory: write it once for searchers and resumes
        source = str(out / "init")
        save_checkpoint(policy, tokenizer, Path(source))
    if resume_from is not None:
        policy = load_model(str(resume_from / "model"), cfg.model.dtype)
    return tokenizer, policy, reference, source, cfg.model.reference or source


def train(cfg: RunConfig, log=print, *, resume: bool = False, overwrite: bool = False) -> dict:
    out = Path(cfg.output_dir)
    rundir.prepare(out, resume=resume, overwrite=overwrite)
    resume_from = ckpt.latest(out) if resume else None
    state = ckpt.load(resume_from) if resume_from else {}
    if resume_from is not None and state["step"] >= cfg.trainer.steps:
        log(f"{out}: already finished at step {state['step']} (trainer.steps={cfg.trainer.steps}); "
            "pass trainer.steps=N to continue training")
        return json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    save_config(cfg, out / "config.yaml")
    torch.set_num_threads(cfg.threads or default_threads(cfg.search.num_searchers, cfg.runtime)[0])
    seed_everything(cfg.seed)
    t_run = time.perf_counter()

    task = build_task(cfg)
    tokenizer, policy, reference, source, ref_source = _models(cfg, task, out, resume_from, state, log)
    device = resolve_device(cfg.model.device)
    policy, reference = policy.to(device), reference.to(device)
    if cfg.task.chat_template:
        apply_chat_template(task, tokenizer)
    limit = prompt_limit(cfg, policy)
    fitted = fit_prompts(task, tokenizer, limit, cfg.task.long_prompts)
    if fitted["prompts_too_long"]:
        log(f"{fitted['prompts_too_long']} prompts longer than {limit} tokens: "
            f"{'truncated' if cfg.task.long_prompts == 'truncate' else 'skipped'} (task.long_prompts)")
    log(f"task {task.name}: {len(task.train)} train / {len(task.test)} test prompts; "
        f"policy {num_parameters(policy) / 1e6:.2f}M params{_trainable(policy)} on {device}; "
        f"runtime {cfg.runtime}, mode {cfg.mode}")
    trainer = Trainer(policy, cfg.trainer, cfg.tb, objective=cfg.objective, temperature=cfg.search.temperature,
                      pad_id=tokenizer.pad_token_id, baselines=cfg.baselines, max_tokens=cfg.search.max_new_tokens,
                      reference=copy.deepcopy(reference) if cfg.objective == "tba_prime" else None)
    if resume_from is not None:
        trainer.load_state(resume_from, state)
    buffer = _buffer(cfg, out, resume_from, state, log)
    runtime = make_runtime(cfg, task=task, tokenizer=tokenizer, policy=policy, reference=reference,
                           source=source, out_dir=out, reference_source=ref_source, version=trainer.version,
                           states=state.get("searchers"), log=log)
    if resume_from is not None:
        moved = rundir.set_aside_metrics(out, state["step"])
        log(f"resuming {out} from {resume_from.name} (step {state['step']}); "
            f"{moved} metric lines of the interrupted segment moved to metrics.interrupted.jsonl")
    logger = MetricsLogger(out, cfg)
    if resume_from is not None:
        ckpt.set_rng_state(state["rng"])  # last: nothing above may consume random numbers after this
    run = _Run(cfg, out, task, tokenizer, policy, buffer, trainer, runtime, logger, log, t_run, state,
               {**fitted, "reference_source": ref_source, "policy_source": source, "reference": reference})
    try:
        summary = run.loop()
    finally:
        run.close()
    save_checkpoint(policy, tokenizer, out / "checkpoint")
    summary["checkpoint"] = str(out / "checkpoint")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _trainable(model) -> str:
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return "" if n == num_parameters(model) else f" ({n / 1e6:.2f}M trainable, LoRA)"


def _buffer(cfg: RunConfig, out: Path, resume_from, state: dict, log) -> ReplayBuffer:
    b = cfg.buffer
    buffer = ReplayBuffer(b.capacity_per_prompt, b.online_prob, b.offline_inverse_temperature, b.dedup,
                          seed=cfg.seed, max_samples=b.max_samples)
    if cfg.runtime == "offline":  # train on a saved buffer; nothing new is written
        buffer.store = BufferStore(b.source, readonly=True)
        buffer.restore(state.get("buffer"))
        log(f"offline: {buffer.groups_added} groups ({len(buffer)} samples in memory) from {buffer.store.path}")
        buffer.store = None
        return buffer
    if b.persist:
        buffer.store = BufferStore(out)
        if resume_from is not None or buffer.store.num_groups():
            later = buffer.restore(state.get("buffer"))
            log(f"buffer restored: {buffer.groups_added} groups ({len(buffer)} samples in memory), "
                f"{later} of them accepted after the checkpoint")
    elif resume_from is not None:
        raise CheckpointError("buffer.persist=false: this run has no saved buffer to resume from")
    return buffer


class _GracefulStop:
    """First Ctrl-C / SIGTERM: finish the current step, checkpoint, stop. A second Ctrl-C: stop at once."""

    def __init__(self, log):
        self.log, self.requested, self._previous = log, False, {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.log(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint (Ctrl-C again: now)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Run:
    """The loop's state between steps: exactly what a checkpoint saves (besides model/optimizer/buffer)."""

    def __init__(self, cfg, out, task, tokenizer, policy, buffer, trainer, runtime, logger, log, t_run, state,
                 extra):
        self.cfg, self.out, self.task, self.tokenizer, self.policy = cfg, out, task, tokenizer, policy
        self.buffer, self.trainer, self.runtime, self.logger, self.log = buffer, trainer, runtime, logger, log
        self.t_run, self.extra = t_run, extra
        loop = state.get("loop", {})
        self.step = state.get("step", 0)
        # every evaluation: [step, {metric: value} (always "score", the mean reward), training seconds so far];
        # checkpoints written before task metrics existed hold the bare score
        self.evals = [[s, m if isinstance(m, dict) else {"score": m}, t] for s, m, t in loop.get("evals", [])]
        self.rewards_seen = loop.get("rewards_seen", [])
        self.received = loop.get("received", 0)
        self.busy_s = loop.get("busy_s", 0.0)
        self.train_s_before = loop.get("train_s", 0.0)  # training time of earlier segments (resumes)
        self.wall_before = loop.get("wall_s", 0.0)
        self.resumed_at = loop.get("resumed_at", []) + ([self.step] if state else [])
        self.restarts_before = loop.get("restarts", 0)
        self.dropped_before = loop.get("rewards_dropped", 0)
        self.last_ckpt = self.step if state else None
        self.consistent = True  # False while an update is half applied: no exit checkpoint then
        self.started = False  # searchers started: only then is there anything to checkpoint at exit
        self.warned_dropped = 0

    def evaluate(self, train_s: float) -> dict[str, float]:
        """Evaluate on the held-out prompts and record every metric with the step and training time."""
        metrics = evaluate(self.policy, self.tokenizer, self.task, self.task.test, self.cfg.eval,
                           reference=self.extra["reference"])
        self.evals.append([self.step, metrics, train_s])
        return metrics

    def score(self, i: int) -> float:
        """Evaluation i's score: greedy pass@1 for a 0/1 verifier, the mean reward in general."""
        return self.evals[i][1]["score"]

    def describe_eval(self) -> str:
        metrics = self.evals[-1][1]
        if len(metrics) == 1 and self.cfg.eval.samples_per_prompt == 0:
            return f"test accuracy (greedy pass@1, {len(self.task.test)} problems) {metrics['score']:.3f}"
        return "eval " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())

    def train_s(self) -> float:
        return self.train_s_before + time.perf_counter() - self.t_train - self.eval_s

    def busy_fraction(self, t_loop: float, busy_before: float) -> float:
        """Share of this segment's loop time (evaluation excluded) the trainer spent updating."""
        return (self.busy_s - busy_before) / max(time.perf_counter() - t_loop - self.eval_s, 1e-9)

    def counters(self) -> tuple[int, int]:
        """(searcher restarts, samples dropped for a bad reward) over the whole run, resumes included."""
        stats = self.runtime.stats()
        return (self.restarts_before + stats.get("searcher/restarts", 0),
                stats.get("searcher/rewards_dropped", self.dropped_before))

    def checkpoint(self) -> None:
        restarts, dropped = self.counters()
        state = {
            "version": self.trainer.version, "skipped_steps": self.trainer.skipped_steps,
            "buffer": self.buffer.state_dict(), "searchers": self.runtime.searcher_states(),
            "reference_source": self.extra["reference_source"], "policy_source": self.extra["policy_source"],
            "loop": {"evals": self.evals, "rewards_seen": self.rewards_seen, "received": self.received,
                     "busy_s": self.busy_s, "train_s": self.train_s(),
                     "wall_s": self.wall_before + time.perf_counter() - self.t_run, "resumed_at": self.resumed_at,
                     "restarts": restarts, "rewards_dropped": dropped},
        }
        ckpt.save(self.out, step=self.step, policy=self.policy, tokenizer=self.tokenizer,
                  optimizer=self.trainer.optimizer, state=state, reference=self.trainer.reference,
                  keep=self.cfg.checkpoint.keep)
        self.last_ckpt = self.step

    def close(self) -> None:
        """Exit checkpoint (if the last step completed and is not saved yet), then stop searchers."""
        try:
            if self.consistent and self.step > 0 and self.last_ckpt != self.step and self.started:
                self.checkpoint()
                self.log(f"checkpoint written at step {self.step}: `tba train --resume {self.out}` continues")
        except CheckpointError as e:  # e.g. the disk filled up: the error being raised matters more
            self.log(f"exit checkpoint failed: {e}")
        finally:
            self.runtime.stop()
            self.logger.close()
            if self.buffer.store is not None:
                self.buffer.store.close()

    def loop(self) -> dict:
        cfg, buffer, runtime, t = self.cfg, self.buffer, self.runtime, self.cfg.trainer
        self.eval_s = 0.0
        if not self.evals:
            self.t_train = time.perf_counter()
            self.evaluate(0.0)
            self.log(f"at start: {self.describe_eval()}")
        runtime.start()  # searchers run from here on (async: continuously)
        self.started = True
        self.t_train = time.perf_counter()  # eval_s: evaluation time inside the loop, excluded from train_s

        if len(buffer) < cfg.buffer.prefill_samples and cfg.runtime != "offline":
            while len(buffer) < cfg.buffer.prefill_samples:
                groups = runtime.collect(block=True)
                buffer.extend(groups, self.step)
                self.received += sum(len(g.samples) for g in groups)
            buffer.mark_sync(self.step)
            self.log(f"buffer prefilled: {len(buffer)} samples over {buffer.num_prompts} prompts")
        elif cfg.runtime == "offline" or self.step == 0:
            buffer.mark_sync(self.step)
        if not len(buffer):
            raise RuntimeError("the replay buffer is empty: nothing to train on")

        t_loop, busy_before = time.perf_counter(), self.busy_s
        progress_bar = RunProgress(t.steps, enabled=cfg.logging.progress, start=self.step)
        with progress_bar as progress, _GracefulStop(self.log) as stop:
            while self.step < t.steps:
                metrics = self._step(t_loop, busy_before)
                progress.update(self.step, reward=metrics["reward_mean"], accuracy=self.score(-1),
                                beta=metrics["trainer/beta"], tokens_per_s=metrics["trainer/tokens_per_s"])
                every = cfg.checkpoint.every_steps
                if every and self.step % every == 0 and self.step < t.steps:
                    self.checkpoint()
                if stop.requested:
                    raise KeyboardInterrupt  # close() writes the exit checkpoint of this completed step
        self.checkpoint()
        return self.summary(t_loop, busy_before)

    def _step(self, t_loop: float, busy_before: float) -> dict:
        cfg, buffer, trainer, runtime, t = self.cfg, self.buffer, self.trainer, self.runtime, self.cfg.trainer
        groups = runtime.collect(block=cfg.mode == "sync")
        buffer.extend(groups, self.step + 1)  # on disk before the trainer may draw it
        fresh = [s.reward for g in groups for s in g.samples]
        self.received += len(fresh)
        if fresh:
            self.rewards_seen.append(float(np.mean(fresh)))
        t_step = time.perf_counter()
        draws = buffer.sample(t.prompts_per_step, t.samples_per_prompt)
        staleness = [trainer.version - s.version for d in draws for s in d.samples]
        self.consistent = False
        metrics = trainer.step(draws)
        self.step += 1
        if self.step % t.sync_every_steps == 0:
            t_sync = time.perf_counter()
            runtime.publish(trainer.weights(), trainer.version)
            buffer.mark_sync(self.step)
            metrics["sync/publish_s"] = time.perf_counter() - t_sync
        self.consistent = True
        self.busy_s += time.perf_counter() - t_step
        if metrics["trainer/skipped"]:
            self.log(f"step {self.step}: non-finite loss or gradient — update skipped, weights untouched "
                     f"({trainer.skipped_steps} so far)")
        if self.step % cfg.eval.every_steps == 0 or self.step == t.steps:
            t_eval = time.perf_counter()
            evaluation = self.evaluate(self.train_s())
            self.eval_s += time.perf_counter() - t_eval
            self.log(f"step {self.step}: {self.describe_eval()}")
            metrics["eval/test_accuracy"] = evaluation["score"]
            metrics.update({f"eval/{k}": v for k, v in evaluation.items() if k != "score"})
        stats = runtime.stats()
        dropped = stats.get("searcher/rewards_dropped", 0)
        if dropped > self.warned_dropped:
            error = runtime.last_reward_error or "?"
            self.log(f"{dropped - self.warned_dropped} samples dropped: reward raised or was not finite "
                     f"(total {dropped}); last: {error}")
            self.warned_dropped = dropped
        ages = [trainer.version - s.version for h in buffer.histories.values() for s in h.items]
        metrics.update({
            "searcher/reward_mean": self.rewards_seen[-1] if self.rewards_seen else float("nan"),
            "searcher/samples_received": self.received,
            "buffer/draw_reward_mean": float(np.mean([s.reward for d in draws for s in d.samples])),
            "buffer/size": len(buffer),
            "buffer/prompts": buffer.num_prompts,
            "buffer/groups": buffer.groups_added,
            "buffer/age_mean": float(np.mean(ages)),
            "buffer/online_fraction": float(np.mean([d.online for d in draws])),
            "staleness/mean": float(np.mean(staleness)),
            "staleness/max": float(np.max(staleness)),
            "trainer/busy_fraction": self.busy_fraction(t_loop, busy_before),
            **stats,
        })
        metrics.update({  # the documented short names
            "wall_clock_s": self.wall_before + time.perf_counter() - self.t_run, "loss": metrics["trainer/loss"],
            "reward_mean": metrics["searcher/reward_mean"], "beta": metrics["trainer/beta"],
            "lr": metrics["trainer/lr"], "buffer_size": len(buffer),
            "tokens_per_s": metrics["trainer/tokens_per_s"], "staleness_mean": metrics["staleness/mean"],
            "staleness_max": metrics["staleness/max"],
        })
        self.logger.log(self.step, metrics)
        return metrics

    def summary(self, t_loop: float, busy_before: float) -> dict:
        window = max(1, len(self.rewards_seen) // 10)
        restarts, dropped = self.counters()
        return {
            "test_accuracy_start": self.score(0),
            "test_accuracy_end": self.score(-1),
            "test_problems": len(self.task.test),
            "eval_start": self.evals[0][1],
            "eval_end": self.evals[-1][1],
            "train_reward_start": float(np.mean(self.rewards_seen[:window])) if self.rewards_seen else float("nan"),
            "train_reward_end": float(np.mean(self.rewards_seen[-window:])) if self.rewards_seen else float("nan"),
            "wall_clock_s": self.wall_before + time.perf_counter() - self.t_run,
            "train_wall_clock_s": self.train_s(),
            "trainer_steps": self.trainer.version,
            "skipped_steps": self.trainer.skipped_steps,
            "samples_generated": self.received,
            "samples_dropped_bad_reward": dropped,
            "searcher_restarts": restarts,
            "prompts_too_long": self.extra["prompts_too_long"],
            "prompts_truncated": self.extra["prompts_truncated"],
            "buffer_groups": self.buffer.groups_added,
            "buffer_evicted_prompts": self.buffer.evicted_prompts,
            "resumed_at_steps": self.resumed_at,
            "trainer_busy_fraction": self.busy_fraction(t_loop, busy_before),
            "objective": self.cfg.objective,
            "runtime": self.cfg.runtime,
            "mode": self.cfg.mode,
            "seed": self.cfg.seed,
            "searchers": self.runtime.placement(),
            "evals": [(step, metrics["score"], train_s) for step, metrics, train_s in self.evals],
        }
