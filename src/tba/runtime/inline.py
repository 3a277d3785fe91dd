"""Inline runtime: one process, search and training alternate (the reference semantics).

The loop asks for groups, and this runtime answers by running one search iteration right there; weights
published by the trainer are loaded into the searcher's own policy copy, so with k > 1 the searcher really
does generate with a stale policy, exactly as a remote searcher would.
"""

from __future__ import annotations

import os
import socket

from tba.searcher import Searcher
from tba.types import Group


class InlineRuntime:
    def __init__(self, searcher: Searcher):
        self.searcher = searcher

    def start(self) -> None:
        pass

    @property
    def last_reward_error(self) -> str | None:
        return self.searcher.last_reward_error

    def collect(self, block: bool = True) -> list[Group]:
        """Inline, search happens only when asked: one fresh search iteration (the runtime is always sync)."""
        return self.searcher.step()

    def publish(self, weights, version: int) -> None:
        self.searcher.load_weights(weights, version)

    def stats(self) -> dict[str, float]:
        return {"searcher/samples": self.searcher.samples_generated,
                "searcher/tokens": self.searcher.tokens_generated, "searcher/busy_s": self.searcher.busy_s,
                "searcher/generate_s": self.searcher.generate_s, "sync/searcher_loads": self.searcher.loads,
                "searcher/version_min": self.searcher.version,
                "searcher/rewards_dropped": self.searcher.rewards_dropped, "searcher/restarts": 0}

    def searcher_states(self) -> list[dict]:
        """No RNG here: the searcher shares the trainer process's RNG, which the checkpoint saves."""
        return [self.searcher.state_dict()]

    def placement(self) -> list[dict]:
        return [{"rank": 0, "pid": os.getpid(), "host": socket.gethostname()}]

    def stop(self) -> None:
        self.searcher.sampler.close()


class OfflineRuntime:
    """No searchers at all: the loop trains on whatever the buffer was restored with (runtime=offline)."""

    last_reward_error = None

    def start(self) -> None:
        pass

    def collect(self, block: bool = True) -> list[Group]:
        return []

    def publish(self, weights, version: int) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}

    def searcher_states(self) -> list[dict]:
        return []

    def placement(self) -> list[dict]:
        return []

    def stop(self) -> None:
        pass
