"""Searcher supervision, written once for every runtime whose searchers live elsewhere (processes, Ray actors).

What it decides, for each searcher rank: is it due to deliver a batch, and for how long has it been silent
(heartbeat: a `tba.algorithm.timeout.LearntTimeout` per rank, its limit derived from that searcher's own batch times,
capped
by `supervision.heartbeat_timeout_s`, never below `supervision.heartbeat_floor_s`); did a restarted one come back
within `supervision.ready_timeout_s`; and may the run afford one more restart (`supervision.max_restarts`), with the
message
that stops it otherwise. What it does not do is the plumbing — killing a process or asking Ray to restart an
actor is the runtime's; it calls `charge` first, then acts.
"""

from __future__ import annotations

import logging
import time

from tba.algorithm.runtime import RuntimeReport
from tba.algorithm.timeout import LearntTimeout
from tba.config.schema import SupervisionConfig
from tba.runtime.worker import RuntimeParts, SearcherError, WorkerStats, worker_report

logger = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, num_searchers: int, supervision: SupervisionConfig):
        self.cfg, self.restarts = supervision, 0
        self.clocks = [LearntTimeout(supervision.heartbeat_timeout_s, supervision.heartbeat_floor_s)
                       for _ in range(num_searchers)]
        self.starting_since: list[float | None] = [None] * num_searchers
        """Since when a restarted rank has been starting (its heartbeat begins once it reports ready)."""

    # ---- the restart budget ----------------------------------------------------------------------------------
    def charge(self, rank: int, why: str, action: str = "restarting it") -> None:
        """Count one restart of `rank`, or raise SearcherError with the cause once supervision.max_restarts is spent.
        `why` may carry a traceback after its first line: the log gets the line, then the traceback."""
        limit = self.cfg.max_restarts
        if self.restarts >= limit:
            raise SearcherError(f"searcher {rank} {why}\nrestart limit reached (supervision.max_restarts={limit}, "
                                f"{self.restarts} restarts so far): stopping the run")
        self.restarts += 1
        logger.warning(f"searcher {rank} {why.splitlines()[0] if why else ''} — {action} "
                 f"({self.restarts}/{limit} restarts used)")
        if why and "\n" in why:
            logger.warning(why)

    # ---- the heartbeat ---------------------------------------------------------------------------------------
    def due(self, rank: int) -> None:
        """`rank` owes a batch from now on (async: always; sync: once asked); a running clock keeps running."""
        if self.starting_since[rank] is None:
            self.clocks[rank].start()

    def delivered(self, rank: int, owes_more: bool) -> None:
        self.starting_since[rank] = None
        self.clocks[rank].tick(again=owes_more)

    def ready(self, rank: int, owes: bool) -> None:
        """The (re)started rank reported ready: its heartbeat starts now if it owes a batch."""
        self.starting_since[rank] = None
        if owes:
            self.clocks[rank].start()

    def restarted(self, rank: int) -> None:
        """A new incarnation of `rank` is starting: timed by supervision.ready_timeout_s, then at a pace learnt anew."""
        self.clocks[rank].forget()
        self.starting_since[rank] = time.monotonic()

    def forget(self, rank: int) -> None:
        """A new incarnation of `rank` whose start the runtime times itself (Ray's restore): untimed until its
        next call is due, then at a pace learnt anew."""
        self.clocks[rank].forget()

    def silent(self, rank: int, now: float | None = None) -> str | None:
        """Why `rank` counts as hung now, or None: silent past its heartbeat, or not ready in time after a
        restart."""
        now = time.monotonic() if now is None else now
        starting = self.starting_since[rank]
        if starting is not None:
            if now - starting > self.cfg.ready_timeout_s:
                return (f"did not report ready within supervision.ready_timeout_s={self.cfg.ready_timeout_s:g}s after "
                        "its restart: hung or stopped")
            return None
        waited = self.clocks[rank].overdue_s(now)
        if waited is None:
            return None
        return (f"sent no batch for {waited:.0f}s "
                f"({self.clocks[rank].explain('supervision.heartbeat_timeout_s', 'supervision.heartbeat_floor_s')}): "
                "hung or stopped")


class WorkerRuntime:
    """What the runtimes whose searchers report `WorkerStats` with each batch share: the report, the searcher
    count, the per-rank records a restart resumes from, and the supervisor."""

    def __init__(self, parts: RuntimeParts):
        self.specs, self.supervision = parts.searchers, parts.supervision
        n = len(self.specs)
        self.supervisor = Supervisor(n, parts.supervision)
        self._states: list[dict | None] = list(parts.states) if parts.states else [None] * n
        self._stats: dict[int, WorkerStats] = {}
        self._placement: list[dict] = []

    @property
    def restarts(self) -> int:
        return self.supervisor.restarts

    @property
    def searchers(self) -> int:
        return len(self.specs)

    def record(self, stats: WorkerStats) -> None:
        """A batch arrived from the current incarnation of `stats.rank`: its stats and resumable state."""
        self._stats[stats.rank], self._states[stats.rank] = stats, stats.state

    def report(self) -> RuntimeReport:
        """As of the last batch received from each searcher (its state is what a restart resumes from)."""
        return worker_report(self._stats, self._states, self._placement, self.restarts)
