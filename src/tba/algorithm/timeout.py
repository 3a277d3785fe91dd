"""How long is too long to wait for something that normally comes at a steady pace.

A fixed limit cannot serve every run: a tiny model's searcher delivers a batch in a fraction of a second and a
real model's on a CPU in tens of seconds, so a limit long enough for the slow one lets the fast one hang unnoticed
for a whole run (the trainer training on a frozen buffer, with no restart and no warning), and one short enough
for the fast one kills the slow one. So a clock learns the pace of what it watches and derives its limit from it:

    limit = min(cap, max(floor, factor × slowest of the last `window` intervals))

Until one interval has been seen (start-up, a first batch that loads or compiles) the cap alone applies. The
floor keeps scheduling jitter from looking like a hang; the slowest recent interval (not the mean) keeps a
slow-but-regular phase, such as a trainer evaluation that delays reading, from tripping it. Used by the
runtimes' heartbeat (tba.runtime.supervision) and by the loop's no-fresh-samples warning (tba.algorithm.monitor).
"""

from __future__ import annotations

import time
from collections import deque


class LearntTimeout:
    """A clock over one stream of events: `start` when one becomes due, `tick` when it arrives."""

    def __init__(self, cap_s: float, floor_s: float, factor: float = 20.0, window: int = 16):
        self.cap_s, self.floor_s, self.factor = cap_s, floor_s, factor
        self.intervals: deque[float] = deque(maxlen=window)
        self.since: float | None = None
        """When the awaited event became due (None: nothing is awaited)."""

    def start(self, now: float | None = None) -> None:
        """An event is due from now on (no-op if one is already awaited: its clock keeps running)."""
        if self.since is None:
            self.since = time.monotonic() if now is None else now

    def tick(self, now: float | None = None, *, again: bool = True) -> None:
        """The awaited event arrived: learn the interval; `again` = the next one is due at once."""
        now = time.monotonic() if now is None else now
        if self.since is not None:
            self.intervals.append(now - self.since)
        self.since = now if again else None

    def forget(self) -> None:
        """A new source (a restarted searcher): its pace is unknown again, and nothing is awaited yet."""
        self.intervals.clear()
        self.since = None

    def limit_s(self) -> float:
        if not self.intervals:
            return self.cap_s
        return min(self.cap_s, max(self.floor_s, self.factor * max(self.intervals)))

    def overdue_s(self, now: float | None = None) -> float | None:
        """Seconds waited if that is past the limit, else None."""
        if self.since is None:
            return None
        waited = (time.monotonic() if now is None else now) - self.since
        return waited if waited > self.limit_s() else None

    def explain(self, cap_name: str, floor_name: str) -> str:
        """The limit in force, named by the settings that made it (for the log line that acts on it)."""
        limit = self.limit_s()
        if limit >= self.cap_s:
            return f"{cap_name}={self.cap_s:g}"
        return (f"limit {limit:.1f}s = max({floor_name}={self.floor_s:g}, {self.factor:g} × its slowest recent "
                f"interval {max(self.intervals):.2f}s)")
