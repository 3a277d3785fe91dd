"""THE training loop, shared by every runtime: prefill, then per step collect → sample → update → publish.

    prefill the buffer with P completions
    for u = 1..U:
        add whatever groups the searchers produced to the buffer   (async: never waits; sync: waits)
        draw B prompt groups × K samples (recency with prob. m, else reward-prioritised history)
        one update of the objective (TB by default)
        every k updates: publish weights (version = updates applied) and start a new recency window
        every N updates: evaluate on held-out prompts; every C updates: checkpoint

The runtime (inline, local processes, Ray, offline; tba.runtime) only decides where searchers run and how
groups and weights travel; `tba.build` makes every part from the config and `tba.build.train` composes a
run (fresh or resumed) around this loop. This file is the order of operations, which is part of the
algorithm, and nothing else: it imports no runtime and nothing that builds one.

Crash-proofing lives at the step boundary: groups are persisted by the buffer before it accepts them, and
every `checkpoint.every_steps` (and at exit) a full checkpoint is written atomically; a resume rebuilds
everything from the newest usable checkpoint plus every group accepted after it (docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from tba import checkpoint as ckpt
from tba.cadence import Cadence
from tba.checkpoint import CheckpointError
from tba.config import RunConfig
from tba.evaluate import evaluate
from tba.metrics import RunTotals, buffer_age_mean, run_summary, step_metrics
from tba.objectives.tb import beta_at
from tba.progress import GracefulStop, RunProgress
from tba.state import CheckpointState, Evaluation, RunState
from tba.tasks.base import Scoring

NO_FRESH_WARN_S = 60.0
"""The aging-buffer warning's cap: an async trainer with no fresh samples for this long says so. Sooner when
fresh samples usually come faster: after max(NO_FRESH_FLOOR_S, 20 × the slowest recent gap) (tba.cadence)."""
NO_FRESH_FLOOR_S = 5.0
"""Warn when the trainer has drawn from the buffer this long without a single fresh group (async)."""


def run_scoring(cfg: RunConfig) -> Scoring:
    """How this run samples and scores responses (for a task's exact evaluation): the trainer's temperature
    (search.temperature, as tba.build gives it), the search budget and nucleus, and the β of the last update."""
    t = cfg.tb
    return Scoring(temperature=cfg.search.temperature, max_new_tokens=cfg.search.max_new_tokens,
                   beta=beta_at(cfg.trainer.steps, t.beta_init, t.beta_final, t.beta_decay_end_step,
                                t.beta_hard_stop_step), top_p=cfg.search.top_p)


class Loop:
    """Runs the steps of one segment of a run (a fresh start or a resume) over the parts `tba.build` made."""

    def __init__(self, cfg: RunConfig, out: Path, parts, logger, state: RunState, log, t_run: float,
                 resumed: bool = False):
        self.cfg, self.out, self.logger, self.state, self.log, self.t_run = cfg, out, logger, state, log, t_run
        self.parts = parts  # what the run trains with (tba.build.Run); its parts by name below
        self.task, self.tokenizer, self.policy = parts.task, parts.tokenizer, parts.policy
        self.trainer, self.buffer, self.runtime = parts.trainer, parts.buffer, parts.runtime
        self.reference, self.fitted = parts.reference, parts.fitted
        self.segment = dataclasses.replace(state)  # totals before this segment (resumes add to them)
        self.last_ckpt = state.step if resumed else None
        self.consistent = True  # False while an update is half applied: no exit checkpoint then
        self.started = False  # searchers started: only then is there anything to checkpoint at exit
        self.eval_s, self.t_train, self.t_loop, self.busy_before = 0.0, t_run, t_run, state.busy_s
        self.warned_dropped, self.warned_no_fresh = 0, False
        self.freshness: Cadence | None = None  # gaps between fresh samples, timed from the first update (run)

    # ---- the algorithm -------------------------------------------------------------------------------------
    def run(self) -> dict:
        s, t = self.state, self.cfg.trainer
        self.runtime.launch()  # searchers import and load their models while the trainer evaluates (not generate)
        if not s.evals:
            self.t_train = time.perf_counter()
            self.evaluate()
            self.log(f"at start: {self.describe_eval()}")
        self.runtime.start()  # searchers run from here on (async: continuously)
        self.started = True
        self.t_train, self.eval_s = time.perf_counter(), 0.0  # eval_s: evaluation time, excluded from train_s
        self.prefill()
        self.freshness = Cadence(NO_FRESH_WARN_S, NO_FRESH_FLOOR_S)
        self.freshness.start()  # the aging-buffer clock runs from the first update on
        self.t_loop, self.busy_before = time.perf_counter(), s.busy_s
        shown = self.cfg.logging
        progress_bar = RunProgress(t.steps, enabled=shown.progress, start=s.step, plain_every_s=shown.plain_every_s)
        with progress_bar as progress, GracefulStop(self.log) as stop:
            while s.step < t.steps:
                metrics = self.step()
                progress.update(s.step, reward=s.rewards_seen[-1] if s.rewards_seen else float("nan"),
                                score=s.evals[-1].score, beta=metrics["trainer/beta"],
                                tokens_per_s=metrics["trainer/tokens_per_s"], staleness=metrics["staleness/mean"])
                every = self.cfg.checkpoint.every_steps
                if every and s.step % every == 0 and s.step < t.steps:
                    self.checkpoint()
                if stop.requested:
                    raise KeyboardInterrupt  # close() writes the exit checkpoint of this completed step
        self.checkpoint()
        return self.summary()

    def prefill(self) -> None:
        """Wait for P samples before the first update; a new recency window starts at the current step."""
        buffer, target = self.buffer, self.cfg.buffer.prefill_samples if self.runtime.searchers else 0
        prefilled = len(buffer) < target
        while len(buffer) < target:
            self.receive(self.runtime.collect(block=True), self.state.step)
        if prefilled or self.state.step == 0:
            buffer.mark_sync(self.state.step)
        if prefilled:
            self.log(f"buffer prefilled: {len(buffer)} samples over {buffer.num_prompts} prompts")
        if not len(buffer):
            raise RuntimeError("the replay buffer is empty: nothing to train on")

    def receive(self, groups, step: int) -> list[float]:
        """Add fresh groups to the buffer (on disk before the trainer may draw them); their rewards."""
        self.buffer.extend(groups, step)
        fresh = [x.reward for g in groups for x in g.samples]
        self.state.received += len(fresh)
        if fresh:
            self.state.rewards_seen.append(sum(fresh) / len(fresh))
        return fresh

    def step(self) -> dict:
        s, t, trainer = self.state, self.cfg.trainer, self.trainer
        fresh = self.receive(self.runtime.collect(block=self.cfg.mode == "sync"), s.step + 1)
        while self.over_replay():  # as many batches as it takes: one can hold fewer samples than an update draws
            fresh += self.receive(self.runtime.collect(block=True), s.step + 1)
        self.watch_freshness(bool(fresh))
        t_step = time.perf_counter()
        draws = self.buffer.sample(t.prompts_per_step, t.samples_per_prompt)
        version = trainer.version  # staleness is measured against the policy the update starts from
        self.consistent = False
        update = trainer.step(draws)
        s.step += 1
        if t.sync_every_steps and s.step % t.sync_every_steps == 0:  # k = 0: never (searchers keep π_start)
            t_sync = time.perf_counter()
            self.runtime.publish(trainer.weights(), trainer.version)
            self.buffer.mark_sync(s.step)
            update["sync/publish_s"] = time.perf_counter() - t_sync
        self.consistent = True
        s.busy_s += time.perf_counter() - t_step
        if update["trainer/skipped"]:
            self.log(f"step {s.step}: non-finite loss or gradient — update skipped, weights untouched "
                     f"({trainer.skipped_steps} so far)")
        if s.step % self.cfg.eval.every_steps == 0 or s.step == t.steps:
            evaluation = self.evaluate()
            self.log(f"step {s.step}: {self.describe_eval()}")
            update.update({f"eval/{k}": v for k, v in evaluation.items()})
        report = self.runtime.report()
        self.warn_dropped(report)
        metrics = step_metrics(update, draws=draws, version=version, buffer=self.buffer, fresh=fresh,
                               received=s.received, busy_fraction=self.busy_fraction(), searchers=report.stats,
                               wall_clock_s=self.wall_s())
        metrics["trainer/replay_ratio"] = self.replay_ratio()
        self.logger.log(s.step, metrics)
        return metrics

    def replay_ratio(self, updates: int | None = None) -> float:
        """Samples the trainer has drawn (after `updates`, default: so far) per sample the searchers delivered
        (> 1: replay)."""
        t = self.cfg.trainer
        updates = self.state.step if updates is None else updates
        return updates * t.prompts_per_step * t.samples_per_prompt / max(self.state.received, 1)

    def over_replay(self) -> bool:
        """trainer.max_replay_ratio R: an async trainer may take its next update only if the ratio after it is
        still ≤ R, i.e. (updates + 1)·B·K ≤ R·received; until then it waits for fresh samples (every wait has the
        runtime's collect timeout). The bound is on the ratio itself, however few samples one search batch holds."""
        bound = self.cfg.trainer.max_replay_ratio
        return bound is not None and self.runtime.searchers > 0 and self.replay_ratio(self.state.step + 1) > bound

    # ---- around the algorithm: evaluation, warnings, timing, checkpoints -------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Evaluate on the held-out prompts and record every metric with the step and training time."""
        t0, train_s = time.perf_counter(), self.train_s()
        metrics = evaluate(self.policy, self.tokenizer, self.task, self.task.test, self.cfg.eval,
                           reference=self.reference, scoring=run_scoring(self.cfg))
        self.state.evals.append(Evaluation(self.state.step, metrics, train_s))
        self.eval_s += time.perf_counter() - t0
        return metrics

    def describe_eval(self) -> str:
        metrics = self.state.evals[-1].metrics
        if len(metrics) == 1 and self.cfg.eval.samples_per_prompt == 0:
            return f"score (greedy pass@1, {len(self.task.test)} problems) {metrics['score']:.3f}"
        return "eval " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())

    def watch_freshness(self, fresh: bool) -> None:
        """An async trainer never waits for samples: say so when it keeps training on an aging buffer, on the
        run's own time scale (the limit is learnt from the gaps between fresh samples so far)."""
        clock = self.freshness
        if fresh or not self.runtime.searchers:
            clock.tick()
            self.warned_no_fresh = False
            return
        quiet = clock.overdue_s()
        if quiet is not None and not self.warned_no_fresh:
            age = buffer_age_mean(self.buffer, self.trainer.version)
            self.log(f"warning: no fresh samples for {quiet:.0f}s ({clock.explain('cap', 'floor')}) — training "
                     f"on an aging buffer (mean sample age {age:.1f} versions). A searcher silent past its "
                     f"heartbeat (learnt from its batch times, at most search.heartbeat_timeout_s="
                     f"{self.cfg.search.heartbeat_timeout_s:.0f}s) is restarted")
            self.warned_no_fresh = True

    def warn_dropped(self, report) -> None:
        dropped = report.stats.get("searcher/rewards_dropped", 0)
        if dropped > self.warned_dropped:
            self.log(f"{dropped - self.warned_dropped} samples dropped: reward raised or was not finite "
                     f"(total {dropped}); last: {report.reward_error or '?'}")
            self.warned_dropped = dropped

    def train_s(self) -> float:
        return self.segment.train_s + time.perf_counter() - self.t_train - self.eval_s

    def wall_s(self) -> float:
        return self.segment.wall_s + time.perf_counter() - self.t_run

    def busy_fraction(self) -> float:
        """Share of this segment's loop time (evaluation excluded) the trainer spent updating."""
        elapsed = time.perf_counter() - self.t_loop - self.eval_s
        return (self.state.busy_s - self.busy_before) / max(elapsed, 1e-9)

    def counters(self, report) -> tuple[int, int]:
        """(searcher restarts, samples dropped for a bad reward) over the whole run, resumes included."""
        return (self.segment.restarts + report.stats.get("searcher/restarts", 0),
                report.stats.get("searcher/rewards_dropped", self.segment.rewards_dropped))

    def checkpoint(self) -> None:
        report = self.runtime.report()
        restarts, dropped = self.counters(report)
        state = dataclasses.replace(self.state, train_s=self.train_s(), wall_s=self.wall_s(), restarts=restarts,
                                    rewards_dropped=dropped)
        if self.cfg.buffer.compact:
            self.buffer.snapshot()  # on disk before the checkpoint that names it
        ckpt.save(self.out, step=self.state.step, policy=self.policy, tokenizer=self.tokenizer,
                  optimizer=self.trainer.optimizer, reference=self.trainer.reference, keep=self.cfg.checkpoint.keep,
                  state=CheckpointState(state, self.trainer.version, self.trainer.skipped_steps,
                                        self.buffer.state_dict(), report.states).to_json())
        self.last_ckpt = self.state.step
        if self.cfg.buffer.compact:  # what no kept checkpoint can draw again leaves buffer.sqlite
            self.buffer.compact(ckpt.buffer_marks(self.out))

    def summary(self) -> dict:
        report = self.runtime.report()
        restarts, dropped = self.counters(report)
        return run_summary(self.cfg, self.state, self.parts,
                           RunTotals(restarts, dropped, report.placement, self.busy_fraction(), self.wall_s(),
                                     self.train_s()))

    def close(self) -> None:
        """Exit checkpoint (if the last step completed and is not saved yet), then stop searchers."""
        try:
            if self.consistent and self.state.step > 0 and self.last_ckpt != self.state.step and self.started:
                self.checkpoint()
                self.log(f"checkpoint written at step {self.state.step}: `tba train --resume {self.out}` continues")
        except CheckpointError as e:  # e.g. the disk filled up: the error being raised matters more
            self.log(f"exit checkpoint failed: {e}")
        finally:
            self.runtime.stop()
            self.logger.close()
            if self.buffer.store is not None:
                self.buffer.store.close()
