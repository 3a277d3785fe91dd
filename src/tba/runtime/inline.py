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

    def collect(self, block: bool = True) -> list[Group]:
        """Inline, search happens only when asked: one fresh search iteration (the runtime is always sync)."""
        return self.searcher.step()

    def publish(self, weights, version: int) -> None:
        self.searcher.load_weights(weights, version)

    def stats(self) -> dict[str, float]:
        return {"searcher/samples": self.searcher.samples_generated,
                "searcher/version_min": self.searcher.version}

    def placement(self) -> list[dict]:
        return [{"rank": 0, "pid": os.getpid(), "host": socket.gethostname()}]

    def stop(self) -> None:
        pass
