"""The run's handle on a sharded trainer (trainer.world_size = N > 1): what the loop, the checkpoints and the
evaluation call a trainer, carried out by N ordinary ranks (tba.ranks.rank) that the controller drives.

The controller is the run's own process. It holds no model on a training device and never takes part in a
collective: it sends each rank a command, waits (each wait with a deadline) and reads the answers. So a rank that
raises, dies or hangs is always seen — on NCCL as on gloo — and named: the controller is never the process stuck in
a CUDA sync. Between commands no collective is open, so the loop may wait for searchers as long as it likes.

What it keeps: the update counters (the ranks are told the version with every update, so none can drift) and one
host-memory copy of the synced tensors in the searchers' dtype, filled bucket by bucket as rank 0 streams a
publication: the runtime's transports publish from it, as they publish a one-process trainer's tensors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from tba.algorithm.trainer import age_factor
from tba.algorithm.types import Draw
from tba.config.schema import TrainerConfig
from tba.errors import UserError
from tba.ranks.rank import Update

logger = logging.getLogger(__name__)


class TrainerRankError(UserError, RuntimeError):
    """A trainer rank failed, died or stopped answering; the message names it."""

    label = "trainer rank failed"


class RankGroup(Protocol):
    """The controller's handle on ranks 0..N−1, wherever they run (processes here: tba.ranks.local; Ray actors:
    tba.ranks.ray). Every wait has a deadline; a failure raises TrainerRankError naming the rank, after every rank
    is ended."""

    world: int
    where: str
    """Where the ranks run, for the log ("processes", "Ray actors")."""
    placement: list[dict]
    """Where each rank runs (rank, pid, host; on Ray its node id), for the run summary."""

    def call(self, command: str, payloads: list, timeout_s: float) -> list:
        """Carry out `command` on every rank (rank r with payloads[r]) and return each rank's answer."""

    def stream(self, command: str, payloads: list, timeout_s: float) -> Iterator:
        """As `call`, yielding the items rank 0 sends while it carries the command out (buckets of tensors in host
        memory); ends once every rank has answered."""

    def close(self) -> None:
        """End every rank."""


@dataclass(frozen=True)
class Timeouts:
    collective_s: float
    """trainer.fsdp.collective_timeout_s: the longest command but a checkpoint's."""
    checkpoint_s: float
    """trainer.fsdp.checkpoint_timeout_s: a checkpoint's save or load (DCP writes every rank's shard)."""


class ShardedTrainer:
    """The algorithm's trainer as the loop sees it, over a group of ranks."""

    sharded = True
    reference = None  # an objective's own π_ref lives, sharded, on the ranks

    def __init__(self, group: RankGroup, cfg: TrainerConfig, *, aging: frozenset[str] | None, timeouts: Timeouts):
        self.group, self.cfg, self.aging, self.timeouts = group, cfg, aging, timeouts
        self.placement = list(group.placement)  # where each rank ran, for the summary (readable after close)
        self.version, self.skipped_steps = 0, 0
        self.host: dict[str, torch.Tensor] = {}
        self.host_version = -1

    @property
    def world(self) -> int:
        return self.group.world

    def step(self, draws: list[Draw]) -> dict[str, float]:
        """One update: rank r trains on the r-th equal share of the prompt groups; the age factor and the sample
        count are the whole batch's, so every rank takes the same step."""
        n, world = len(draws) // self.world, self.world
        shares = [draws[r * n:(r + 1) * n] for r in range(world)]
        age = age_factor(draws, self.version, self.cfg, self.aging)
        samples = sum(len(d.samples) for d in draws)
        answers = self.group.call("step", [Update(s, samples, age, self.version) for s in shares],
                                  self.timeouts.collective_s)
        metrics = answers[0]
        if metrics["trainer/skipped"]:
            self.skipped_steps += 1
        else:
            self.version += 1
        return metrics

    def weights(self) -> dict[str, torch.Tensor]:
        """The synced tensors in host memory, gathered from the ranks' shards now unless the copy is current."""
        if self.host_version != self.version:
            t0 = time.perf_counter()
            for bucket in self.group.stream("publish", [None] * self.world, self.timeouts.collective_s):
                for name, tensor in bucket.items():
                    if name in self.host and self.host[name].shape == tensor.shape:
                        self.host[name].copy_(tensor)
                    else:
                        self.host[name] = tensor.clone()  # out of the transfer's shared memory into our own
            self.host_version = self.version
            logger.debug(f"gathered {len(self.host)} tensors from the ranks in {time.perf_counter() - t0:.2f} s")
        return self.host

    def masters(self) -> dict[str, torch.Tensor]:
        """The master weights (model.dtype), whole, in host memory: for tests and export."""
        out = {}
        for bucket in self.group.stream("masters", [None] * self.world, self.timeouts.checkpoint_s):
            out.update(bucket)
        return out

    def evaluate(self, shares: list) -> list:
        """Each rank's part of an evaluation (shares[r]: its test prompts); the answers, in rank order."""
        return self.group.call("evaluate", shares, self.timeouts.collective_s)

    def save(self, path: Path) -> list[dict]:
        """Write model/, optimizer/ (and TBA′'s reference/) into checkpoint directory `path`; returns the optimizer's
        hyperparameters (state.json keeps them)."""
        return self.group.call("save", [str(path)] * self.world, self.timeouts.checkpoint_s)[0]

    def memory(self, reset: bool = False) -> list[dict[str, float]]:
        """Each rank's memory (tba.ranks.rank.RankTrainer.memory), in rank order; `reset`: peaks start again."""
        return self.group.call("memory", [reset] * self.world, self.timeouts.collective_s)

    def save_model(self, path: Path) -> None:
        """A `from_pretrained` directory of the policy (its master weights; a LoRA run's adapters) at `path`."""
        self.group.call("export", [str(path)] * self.world, self.timeouts.checkpoint_s)

    def load(self, path: Path | None, one_process=None, *, version: int, skipped: int) -> None:
        """The optimizer state from a sharded checkpoint's optimizer/ (`path`), or a one-process checkpoint's
        (`one_process()`, called by rank 0: torch's optimizer state dict); the counters."""
        payload = (str(path) if path is not None else None, one_process, version, skipped)
        self.group.call("load", [payload] * self.world, self.timeouts.checkpoint_s)
        self.version, self.skipped_steps = version, skipped

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
