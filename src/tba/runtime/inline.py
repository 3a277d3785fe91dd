"""Inline runtime: one process, search and training alternate (the reference semantics).

The loop asks for groups, and this runtime answers by running one search iteration right there; weights
published by the trainer are loaded into the searcher's own policy copy, so with k > 1 the searcher really
does generate with a stale policy, exactly as a remote searcher would.
"""

from __future__ import annotations

import os
import socket
import time

from tba.runtime.base import RuntimeReport
from tba.searcher import Searcher
from tba.types import Group


class InlineRuntime:
    searchers = 1

    def __init__(self, searcher: Searcher):
        self.searcher = searcher
        self.t_start = time.perf_counter()

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def collect(self, block: bool = True) -> list[Group]:
        """Inline, search happens only when asked: one fresh search iteration (the runtime is always sync)."""
        return self.searcher.step()

    def publish(self, weights, version: int) -> None:
        self.searcher.load_weights(weights, version)

    def report(self) -> RuntimeReport:
        """States carry no RNG: the searcher shares the trainer process's RNG, which the checkpoint saves."""
        s = self.searcher
        stats = {"searcher/samples": s.samples_generated, "searcher/tokens": s.tokens_generated,
                 "searcher/busy_fraction": s.busy_s / max(time.perf_counter() - self.t_start, 1e-9),
                 "searcher/generate_s": s.generate_s, "sync/searcher_loads": s.loads,
                 "searcher/version_min": s.version, "searcher/rewards_dropped": s.rewards_dropped,
                 "searcher/restarts": 0}
        return RuntimeReport(stats, [s.state_dict()], [{"rank": 0, "pid": os.getpid(), "host": socket.gethostname()}],
                             s.last_reward_error)

    def stop(self) -> None:
        self.searcher.sampler.close()


class OfflineRuntime:
    """No searchers at all: the loop trains on whatever the buffer was restored with (runtime=offline)."""

    searchers = 0

    def start(self) -> None:
        pass

    def collect(self, block: bool = True) -> list[Group]:
        return []

    def publish(self, weights, version: int) -> None:
        pass

    def report(self) -> RuntimeReport:
        return RuntimeReport({}, [], [], None)

    def stop(self) -> None:
        pass
