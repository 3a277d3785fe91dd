"""THE training loop, shared by every runtime: prefill, then per step collect → sample → update → publish.

    prefill the buffer with P completions
    for u = 1..U:
        add whatever groups the searchers produced to the buffer   (async: never waits; sync: waits)
        draw B prompt groups × K samples (recency with prob. m, else reward-prioritised history)
        one update of the objective (TB by default)
        every k updates: publish weights (version = updates applied) and start a new recency window
        every N updates: evaluate on held-out prompts; every C updates: checkpoint

The runtime (inline, local processes, Ray, offline; tba.runtime) only decides where searchers run and how
groups and weights travel; `tba.run.build` makes every part from the config, and `tba.run.train` composes a run
(fresh or resumed) around this loop. This file is the order of operations, which is part of the algorithm,
and nothing else: it imports no runtime and nothing that builds one, and its clocks and warnings are the
`Monitor`'s (tba.algorithm.monitor).

Crash-proofing lives at the step boundary: groups are persisted by the buffer before it accepts them, and
every `checkpoint.every_steps` (and at exit) a full checkpoint is written atomically; a resume rebuilds
everything from the newest usable checkpoint plus every group accepted after it (docs/reliability.md).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from tba.algorithm.buffer import NothingYoungEnough, ReplayBuffer
from tba.algorithm.metrics import step_metrics
from tba.algorithm.monitor import Monitor, episodes_ended, replay_threshold
from tba.algorithm.runtime import Runtime
from tba.algorithm.state import CheckpointState, Evaluation, RunState, RunTotals
from tba.algorithm.trainer import Trainer
from tba.errors import UserError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopSettings:
    """The numbers the loop runs by (tba.run.build takes them from the config's sections)."""

    steps: int
    """U: updates in the whole run."""
    prompts_per_step: int
    """B: prompt groups per update."""
    samples_per_prompt: int
    """K: samples per group."""
    sync_every_steps: int
    """k: publish weights every k updates (0: never)."""
    prefill_samples: int
    """P: samples in the buffer before the first update."""
    eval_every_steps: int
    checkpoint_every_steps: int | None
    max_replay_ratio: float | None
    """trainer.max_replay_ratio R (async): wait for fresh samples rather than pass it."""
    sync_mode: bool
    """mode=sync: every step waits for fresh groups."""
    replay_warning: float | None = None
    """trainer.replay_warning (async, unbounded): warn when the replay ratio passes it (None: never)."""


# ---- what the loop is given besides the algorithm's parts (tba.run makes them) --------------------------------
class Evaluator(Protocol):
    def __call__(self) -> dict[str, float]:
        """Evaluate the trainer's policy on the held-out prompts: {"score": …, task metrics…}."""

    def describe(self, metrics: dict[str, float]) -> str:
        """One log line of an evaluation's metrics."""


class Checkpoints(Protocol):
    run_dir: object

    def save(self, step: int, *, trainer: Trainer, state: dict) -> object:
        """Write checkpoint `step` atomically: what `trainer` holds (policy, optimizer, the objective's own π_ref)
        and the loop's JSON `state`."""

    def buffer_marks(self) -> list[int]:
        """The buffer positions every kept checkpoint restores: what buffer compaction must keep."""


class MetricsSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class Progress(Protocol):
    """A context around the updates: shown after each, and asked whether the user wants the run stopped."""

    requested: bool
    """The user asked to stop (Ctrl-C, SIGTERM): the loop stops after the current update."""

    def __enter__(self): ...

    def __exit__(self, *exc): ...

    def update(self, step: int, **fields: float) -> None: ...

    def interruptible(self) -> contextlib.AbstractContextManager:
        """Within it, a stop request interrupts at once (KeyboardInterrupt) instead of after the update: an
        evaluation, which can take minutes, with the update already applied."""


class Utilization(Protocol):
    def __call__(self, draws: list, seconds: float) -> dict[str, float]:
        """The metrics of an update's use of its devices (trainer/mfu), from what it drew and its seconds."""


class _Quiet:
    """No display and no signals: the loop's progress when its caller gives none (tests, benchmarks)."""

    requested = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def update(self, step: int, **fields: float) -> None:
        pass

    def interruptible(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class Loop:
    """Runs the steps of one segment of a run (a fresh start or a resume) over the parts `tba.run.build` made."""

    def __init__(self, settings: LoopSettings, *, trainer: Trainer, buffer: ReplayBuffer, runtime: Runtime,
                 evaluator: Evaluator, checkpoints: Checkpoints, logger: MetricsSink, state: RunState,
                 monitor: Monitor, progress: Progress | None = None, resumed: bool = False,
                 utilization: Utilization | None = None):
        """`utilization`: adds trainer/mfu to each update's metrics (None: not logged)."""
        self.settings, self.trainer, self.buffer, self.runtime = settings, trainer, buffer, runtime
        self.utilization = utilization
        self.search_window = SearchRate()
        self.evaluator, self.checkpoints, self.metrics = evaluator, checkpoints, logger
        self.state, self.monitor, self.progress = state, monitor, progress or _Quiet()
        self.last_ckpt = state.step if resumed else None
        self.consistent = True  # False while an update is half applied: no exit checkpoint then
        self.started = False  # searchers started: only then is there anything to checkpoint at exit
        self.replay_warn_at = replay_threshold(settings.replay_warning, max_replay_ratio=settings.max_replay_ratio,
                                               sync=settings.sync_mode, searchers=runtime.searchers)

    # ---- the algorithm -------------------------------------------------------------------------------------
    def run(self) -> RunTotals:
        state, settings, progress = self.state, self.settings, self.progress
        self.runtime.launch()  # searchers import and load their models while the trainer evaluates (not generate)
        if not state.evals:
            logger.info(f"at start: {self.evaluator.describe(self.evaluate())}")
        self.runtime.start()  # searchers run from here on (async: continuously)
        self.started = True
        self.monitor.training_starts()
        self.prefill()
        self.monitor.updates_start(state.busy_s)
        self.search_window.start()
        with progress:
            while state.step < settings.steps and not progress.requested:
                metrics = self.step()
                progress.update(state.step, reward=state.rewards_seen[-1] if state.rewards_seen else float("nan"),
                                score=state.evals[-1].score, beta=metrics["trainer/beta"],
                                tokens_per_s=metrics["trainer/tokens_per_s"], staleness=metrics["staleness/mean"],
                                replay=metrics["trainer/replay_ratio"] if state.received else float("nan"),
                                search_tokens_per_s=metrics["searcher/tokens_per_s"],
                                mfu=metrics.get("trainer/mfu", float("nan")))
                every = settings.checkpoint_every_steps
                if every and state.step % every == 0 and state.step < settings.steps:
                    self.checkpoint()
        if state.step < settings.steps:  # the user asked to stop: close() writes the exit checkpoint of this step
            raise KeyboardInterrupt
        self.checkpoint()
        return self.totals()

    def prefill(self) -> None:
        """Wait until the searchers have delivered P completions before the first update (the paper's initial
        buffer: a count of completions generated, not of the unique ones the buffer keeps — a peaked warm start
        repeats itself, so P unique ones can take many times the search batches); a new recency window starts at
        the current step."""
        buffer, target = self.buffer, self.settings.prefill_samples if self.runtime.searchers else 0
        prefilled = self.state.received < target
        while self.state.received < target or (self.runtime.searchers and not len(buffer)):  # (a resume whose
            self.receive(self.runtime.collect(block=True), self.state.step)  # buffer was set aside starts empty)
            report = self.runtime.report()
            self.warn(self.monitor.dropped_samples(report))
            if why := self.monitor.nothing_kept(report, self.state.received, target):
                raise UserError(why)
        if prefilled or self.state.step == 0:
            buffer.mark_sync(self.state.step)
        if prefilled:
            logger.info(f"buffer prefilled: {self.state.received} completions received, {len(buffer)} unique over "
                        f"{buffer.num_prompts} prompts")
        if not len(buffer):
            raise RuntimeError("the replay buffer is empty: nothing to train on")

    def receive(self, groups, step: int) -> list[float]:
        """Add fresh groups to the buffer (on disk before the trainer may draw them); their rewards."""
        self.buffer.extend(groups, step)
        fresh = [x.reward for g in groups for x in g.samples]
        self.state.received += len(fresh)
        self.search_window.add(sum(sum(x.policy_mask) if x.policy_mask else len(x.response) for g in groups
                                   for x in g.samples))
        for g in groups:
            self.state.tally(g.source, received=len(g.samples), reward_sum=sum(x.reward for x in g.samples))
        if fresh:
            self.state.rewards_seen.append(sum(fresh) / len(fresh))
        return fresh

    def gather(self) -> list[float]:
        """The rewards of this step's fresh samples: whatever the searchers delivered (async: never waiting;
        sync: waiting), and as many more batches as trainer.max_replay_ratio requires."""
        step = self.state.step + 1
        fresh = self.receive(self.runtime.collect(block=self.settings.sync_mode), step)
        while self.over_replay():  # as many batches as it takes: one can hold fewer samples than an update draws
            fresh += self.receive(self.runtime.collect(block=True), step)
        return fresh

    def draw(self) -> tuple[list, list[float]]:
        """B groups × K samples, and the rewards of fresh samples received meanwhile: with buffer.max_sample_age,
        a draw with nothing young enough waits for fresh samples first (every wait has the runtime's collect
        timeout)."""
        settings, state, waited = self.settings, self.state, []
        while True:
            try:
                draws = self.buffer.sample(settings.prompts_per_step, settings.samples_per_prompt,
                                           version=self.trainer.version)
            except NothingYoungEnough:
                if not self.runtime.searchers:
                    raise
                waited += self.receive(self.runtime.collect(block=True), state.step + 1)
                continue
            for d in draws:
                for x in d.samples:
                    state.tally(x.source, drawn=1)
            return draws, waited

    def step(self) -> dict:
        state, settings, trainer = self.state, self.settings, self.trainer
        fresh = self.gather()
        self.warn(self.monitor.no_fresh_samples(bool(fresh), self.runtime.searchers,
                                                lambda: self.buffer.age_mean(trainer.version)))
        t_step = time.perf_counter()
        draws, waited = self.draw()
        fresh += waited
        version = trainer.version  # staleness is measured against the policy the update starts from
        self.consistent = False
        update = trainer.step(draws)
        state.step += 1
        extra = {}
        if settings.sync_every_steps and state.step % settings.sync_every_steps == 0:  # k = 0: never
            t_sync = time.perf_counter()
            self.runtime.publish(trainer.weights(), trainer.version)
            self.buffer.mark_sync(state.step)
            extra["sync/publish_s"] = time.perf_counter() - t_sync
        self.consistent = True
        state.busy_s += time.perf_counter() - t_step
        if self.utilization is not None:
            extra.update(self.utilization(draws, update["trainer/step_s"]))
        if update["trainer/skipped"]:
            logger.warning(f"step {state.step}: non-finite loss or gradient — update skipped, weights untouched "
                           f"({trainer.skipped_steps} so far)")
        if state.step % settings.eval_every_steps == 0 or state.step == settings.steps:
            with self.progress.interruptible():  # Ctrl-C here stops now: the update is applied, the step complete
                evaluation = self.evaluate()
            logger.info(f"step {state.step}: {self.evaluator.describe(evaluation)}")
            extra.update({f"eval/{k}": v for k, v in evaluation.items()})
        report = self.runtime.report()
        self.warn(self.monitor.dropped_samples(report))
        self.warn(self.monitor.replay_ahead(self.replay_ratio(), self.replay_warn_at, received=state.received,
                                            drawn=self.drawn(), ended=episodes_ended(report.stats)))
        metrics = step_metrics({**update, **extra}, draws=draws, version=version, buffer=self.buffer, fresh=fresh,
                               received=state.received, busy_fraction=self.monitor.busy_fraction(state.busy_s),
                               searchers=report.stats, wall_clock_s=self.monitor.wall_s(), sources=state.sources,
                               replay_ratio=self.replay_ratio(), search_tokens_per_s=self.search_window.rate())
        self.metrics.log(state.step, metrics)
        return metrics

    def drawn(self, updates: int | None = None) -> int:
        """Samples the trainer has drawn after `updates` (default: so far): B·K each."""
        updates = self.state.step if updates is None else updates
        return updates * self.settings.prompts_per_step * self.settings.samples_per_prompt

    def replay_ratio(self, updates: int | None = None) -> float:
        """Samples the trainer has drawn (after `updates`, default: so far) per sample the searchers delivered
        (> 1: replay)."""
        return self.drawn(updates) / max(self.state.received, 1)

    def over_replay(self) -> bool:
        """trainer.max_replay_ratio R: an async trainer may take its next update only if the ratio after it is
        still ≤ R, i.e. (updates + 1)·B·K ≤ R·received; until then it waits for fresh samples (every wait has the
        runtime's collect timeout). The bound is on the ratio itself, however few samples one search batch holds."""
        bound = self.settings.max_replay_ratio
        return bound is not None and self.runtime.searchers > 0 and self.replay_ratio(self.state.step + 1) > bound

    # ---- around the algorithm: evaluation, checkpoints -------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Evaluate on the held-out prompts and record every metric with the step and training time."""
        t0, train_s = time.perf_counter(), self.monitor.train_s()
        metrics = self.evaluator()
        self.state.evals.append(Evaluation(self.state.step, metrics, train_s))
        self.monitor.evaluated(time.perf_counter() - t0)
        return metrics

    def warn(self, message: str | None) -> None:
        if message:
            logger.warning(message)

    def totals(self) -> RunTotals:
        report = self.runtime.report()
        restarts, dropped = self.monitor.counters(report)
        return RunTotals(restarts, dropped, report.placement, self.monitor.busy_fraction(self.state.busy_s),
                         self.monitor.wall_s(), self.monitor.train_s(), self.monitor.startup_s,
                         self.replay_ratio() if self.state.received else None,
                         episodes_ended(report.stats))

    def checkpoint(self) -> None:
        t = self.totals()
        state = dataclasses.replace(self.state, train_s=t.train_s, wall_s=t.wall_clock_s, restarts=t.restarts,
                                    rewards_dropped=t.dropped)
        self.buffer.snapshot()  # on disk before the checkpoint that names it
        trainer = self.trainer
        self.checkpoints.save(self.state.step, trainer=trainer,
                              state=CheckpointState(state, trainer.version, trainer.skipped_steps,
                                                    self.buffer.state_dict(), self.runtime.report().states).to_json())
        self.last_ckpt = self.state.step
        self.buffer.compact(self.checkpoints.buffer_marks())  # what no kept checkpoint can draw again

    def close(self) -> None:
        """Exit checkpoint (if the last step completed and is not saved yet), then stop searchers."""
        try:
            if self.consistent and self.state.step > 0 and self.last_ckpt != self.state.step and self.started:
                self.checkpoint()
                logger.info(f"checkpoint written at step {self.state.step}: "
                            f"`tba train --resume {self.checkpoints.run_dir}` continues")
        except UserError as e:  # e.g. the disk filled up: the error being raised matters more
            logger.warning(f"exit checkpoint failed: {e}")
        finally:
            self.runtime.stop()
            self.metrics.close()
            self.buffer.close()


class SearchRate:
    """searcher/tokens_per_s: the tokens the searchers generated (a multi-turn episode's policy tokens) in the groups
    the loop received, per second of wall clock, over the last `window` updates (one update's receipt is bursty)."""

    def __init__(self, window: int = 10):
        self.window, self.steps = window, collections.deque(maxlen=window)
        self.tokens, self.t_last = 0, time.perf_counter()

    def start(self) -> None:
        """The first window starts now (the first update; what the prefill received is not counted)."""
        self.tokens, self.t_last = 0, time.perf_counter()

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def rate(self) -> float:
        """Close this update's share of the window; the rate over the window."""
        now = time.perf_counter()
        self.steps.append((self.tokens, now - self.t_last))
        self.tokens, self.t_last = 0, now
        seconds = sum(s for _, s in self.steps)
        return sum(t for t, _ in self.steps) / seconds if seconds > 0 else float("nan")
