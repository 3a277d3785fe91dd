"""The runtime seam: what the training loop needs from whatever hosts the searchers, and what it reads back.

Three things move: completed groups (searcher → buffer), weights with a version (trainer → searchers), and
control (start, stop, errors, metrics). A runtime (tba.runtime) implements `Runtime`; the loop in tba.algorithm.loop is
written against it only, so it reads the same on one process, several local processes, or a Ray cluster. This
module imports nothing of the runtimes: the algorithm's files may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tba.algorithm.types import Group


@dataclass
class RuntimeReport:
    """What the loop reads back from a runtime, besides groups: for metrics, checkpoints and the summary."""

    stats: dict[str, float]
    """Searcher-side metrics: samples, tokens, busy fraction, versions, weight loads, restarts, drops."""
    states: list[dict | None]
    """Each searcher's state as of the last batch received (prompt cursor, counters, RNG): for checkpoints."""
    placement: list[dict]
    """Where each searcher runs (rank, pid or Ray node id, host), for the run summary."""
    reward_error: str | None
    """The newest reward failure a searcher reported (the sample was dropped), for the log."""


class Runtime(Protocol):
    """Transport and lifecycle: start, move groups and weights, stop; and one `report` of everything else."""

    searchers: int
    """How many searchers produce samples (0: none, the loop trains on what the buffer was restored with)."""

    def launch(self) -> None:
        """Begin starting the searchers and return at once (processes spawn, import, load their models); they
        wait, ready, for `start`. The loop launches before its first evaluation so that the two overlap: a
        searcher process's imports and model load are seconds the trainer would otherwise wait for."""

    def start(self) -> None:
        """Start the searchers (launching them first if `launch` was not called); returns once every searcher
        is ready (or raises)."""

    def collect(self, block: bool) -> list[Group]:
        """Groups produced since the last call. block=True waits (with a timeout) for fresh ones: at least
        one per searcher in sync mode, at least one in all. block=False never waits."""

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Make `weights` (the trainer's state after `version` updates) available; never waits for searchers."""

    def report(self) -> RuntimeReport:
        """Searcher metrics, states, placement and the newest reward error, as of the last batch received."""

    def stop(self) -> None:
        """Stop every searcher and release every process or daemon this runtime started."""
