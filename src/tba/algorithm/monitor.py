"""What the training loop watches besides the algorithm: its clocks and the warnings it owes the user.

Clocks: wall-clock seconds since the run started (start-up included), training seconds (evaluation excluded)
and the trainer's busy fraction (updating, not waiting), each summed over the run's resumed segments. Warnings:
an async trainer that keeps drawing from an aging buffer because no fresh samples come, one that replays far ahead of
its searchers (each sample drawn many times: too few searchers, or an environment that times out), and samples
dropped because their reward raised or was not finite. Kept apart from tba.algorithm.loop so that the loop reads as
the order of operations and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tba.algorithm.runtime import RuntimeReport
from tba.algorithm.state import RunState
from tba.algorithm.timeout import LearntTimeout

tracebacks = logging.getLogger("tba.tracebacks")
"""The tracebacks of what raised in a user's code (a reward, an environment): the warning names it in one line, the
run writes the traceback to its errors.log (tba.run.train). It does not propagate: a console never shows them."""
tracebacks.propagate = False
tracebacks.setLevel(logging.DEBUG)

NO_FRESH_WARN_S = 60.0
"""The aging-buffer warning's cap: an async trainer with no fresh samples for this long says so. Sooner when
fresh samples usually come faster: after max(NO_FRESH_FLOOR_S, 20 × the slowest recent gap) (tba.algorithm.timeout)."""
NO_FRESH_FLOOR_S = 5.0
"""Warn when the trainer has drawn from the buffer this long without a single fresh group (async)."""


class Monitor:
    def __init__(self, before: RunState, t_run: float, heartbeat_timeout_s: float):
        """`before`: the run's totals before this segment (a resume adds to them); `t_run`: when it started."""
        self.before, self.t_run, self.heartbeat_timeout_s = before, t_run, heartbeat_timeout_s
        self.t_loop = t_run
        self.t_train: float | None = None
        """When this segment's training clock started (None: not yet; the start evaluation is before it)."""
        self.eval_s, self.busy_before = 0.0, before.busy_s
        self.startup_s = 0.0
        self.freshness = LearntTimeout(NO_FRESH_WARN_S, NO_FRESH_FLOOR_S)
        self.warned_no_fresh, self.warned_dropped = False, 0
        self.warned_replay = 0.0
        """The replay ratio of the last replay warning (0: none yet): the next one waits until it doubles."""

    # ---- clocks ------------------------------------------------------------------------------------------
    def training_starts(self) -> None:
        """Training seconds count from now. What came before, since the run began and the start evaluation
        excluded, is this segment's start-up: building models and launching searchers."""
        self.startup_s = time.perf_counter() - self.t_run - self.eval_s
        self.t_train, self.eval_s = time.perf_counter(), 0.0

    def updates_start(self, busy_s: float) -> None:
        """The first update is next: the loop's busy fraction and the aging-buffer clock run from here."""
        self.t_loop, self.busy_before = time.perf_counter(), busy_s
        self.freshness.start()

    def evaluated(self, seconds: float) -> None:
        self.eval_s += seconds

    def train_s(self) -> float:
        if self.t_train is None:
            return self.before.train_s
        return self.before.train_s + time.perf_counter() - self.t_train - self.eval_s

    def wall_s(self) -> float:
        return self.before.wall_s + time.perf_counter() - self.t_run

    def busy_fraction(self, busy_s: float) -> float:
        """Share of this segment's loop time (evaluation excluded) the trainer spent updating."""
        elapsed = time.perf_counter() - self.t_loop - self.eval_s
        return (busy_s - self.busy_before) / max(elapsed, 1e-9)

    def counters(self, report: RuntimeReport) -> tuple[int, int]:
        """(searcher restarts, samples dropped for a bad reward) over the whole run, resumes included."""
        return (self.before.restarts + report.stats.get("searcher/restarts", 0),
                report.stats.get("searcher/rewards_dropped", self.before.rewards_dropped))

    # ---- warnings ----------------------------------------------------------------------------------------
    def no_fresh_samples(self, fresh: bool, searchers: int, age_mean: Callable[[], float]) -> str | None:
        """An async trainer never waits for samples: a warning when it keeps training on an aging buffer, on the
        run's own time scale (the limit is learnt from the gaps between fresh samples so far)."""
        clock = self.freshness
        if fresh or not searchers:
            clock.tick()
            self.warned_no_fresh = False
            return None
        quiet = clock.overdue_s()
        if quiet is None or self.warned_no_fresh:
            return None
        self.warned_no_fresh = True
        return (f"no fresh samples for {quiet:.0f}s ({clock.explain('cap', 'floor')}) — training on an "
                f"aging buffer (mean sample age {age_mean():.1f} versions). A searcher silent past its heartbeat "
                f"(learnt from its batch times, at most supervision.heartbeat_timeout_s="
                f"{self.heartbeat_timeout_s:.0f}s) is restarted")

    def dropped_samples(self, report: RuntimeReport) -> str | None:
        dropped = report.stats.get("searcher/rewards_dropped", 0)
        if dropped <= self.warned_dropped:
            return None
        new, self.warned_dropped = dropped - self.warned_dropped, dropped
        last, _, trace = (report.reward_error or "?").partition("\n")
        if trace:
            tracebacks.debug(f"{last}\n{trace}")
        return (f"{new} samples dropped: reward raised or was not finite (total {dropped}); last: {last}"
                + ("; its traceback in the run's errors.log" if trace else ""))

    def nothing_kept(self, report: RuntimeReport, received: int, target: int) -> str | None:
        """Why the run cannot start, when the searchers' samples have all been dropped — none received, at least
        twice the prefill (and 64) dropped: a reward or an environment that fails every time (an agent refused by
        the endpoint, a reward function that raises) would otherwise leave the prefill waiting for ever."""
        dropped = report.stats.get("searcher/rewards_dropped", 0)
        if received or dropped < max(2 * target, 64):
            return None
        last = (report.reward_error or "?").partition("\n")[0]
        return (f"the searchers' first {dropped:.0f} samples were all dropped (their reward raised or was not "
                f"finite), so there is nothing to train on; the last: {last}")

    def replay_ahead(self, ratio: float, threshold: float | None, *, received: int, drawn: int,
                     ended: dict[str, int]) -> str | None:
        """A warning when the trainer replays far ahead of its searchers: its replay ratio (draws per sample
        received) has passed `threshold` (trainer.replay_warning; None: never, as when the loop is sync or
        trainer.max_replay_ratio bounds the ratio — `replay_threshold`). Once, then again only when the ratio has
        doubled since the last warning, so that a long run says it a handful of times, not every step. `ended`:
        multi-turn episodes by end reason (`episodes_ended`), to say how many timed out or failed."""
        if threshold is None or ratio < max(threshold, 2 * self.warned_replay):
            return None
        self.warned_replay = ratio
        failed = ", ".join(f"{ended[r]} {r}" for r in ("timeout", "error", "bad_observation") if ended.get(r))
        faster = (f"make the environment faster (of {sum(ended.values())} episodes: {failed}; a failed episode "
                  f"brings no sample)" if failed else "make the environment or generation faster")
        return (f"the trainer is replaying far ahead of its searchers: replay ratio {ratio:.1f}× ({drawn} draws from "
                f"{received} samples received, each drawn ≈ {ratio:.0f} times). Set trainer.max_replay_ratio (the "
                f"trainer then waits for fresh samples), add searchers (search.num_searchers) or {faster}; "
                f"trainer.replay_warning sets this warning's threshold")


def replay_threshold(replay_warning: float | None, *, max_replay_ratio: float | None, sync: bool,
                     searchers: int) -> float | None:
    """The replay ratio past which the loop warns: none when nothing can run ahead (sync mode, where every step
    waits for fresh groups; no searchers, an offline run) or when trainer.max_replay_ratio already bounds it."""
    if sync or not searchers or max_replay_ratio is not None:
        return None
    return replay_warning


def episodes_ended(stats: dict[str, float]) -> dict[str, int]:
    """Multi-turn episodes by end reason ({"done": n, "timeout": n, …}) from the searchers' `episode/ended_<reason>`
    counters in RuntimeReport.stats; {} for a single-turn run."""
    prefix = "episode/ended_"
    return {k[len(prefix):]: int(v) for k, v in stats.items() if k.startswith(prefix)}
