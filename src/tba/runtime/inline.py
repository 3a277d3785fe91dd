"""Inline runtime: one process, search and training alternate (the reference semantics).

The loop asks for groups, and this runtime answers by running one search iteration right there; weights
published by the trainer are loaded into the searcher's own policy copy, so with k > 1 the searcher really
does generate with a stale policy, exactly as a remote searcher would.
"""

from __future__ import annotations

import copy
import os
import socket
import time

from tba.algorithm.runtime import RuntimeReport
from tba.algorithm.types import Group
from tba.rollout.searcher import Searcher
from tba.runtime.worker import (
    RuntimeParts,
    WorkerStats,
    attach_outside,
    build_sampler,
    restore_searcher,
    worker_report,
)


class Published:
    """The trainer's last publication, which an inline searcher loads when its step asks (a WeightSync, as a
    worker's receiver is: before a batch, or in flight). Inline, the trainer does not train while a searcher
    steps, so the published tensors are still that version's when they load."""

    def __init__(self, searcher: Searcher):
        self.searcher, self.weights, self.version = searcher, None, -1

    def pending(self) -> bool:
        return self.weights is not None and self.version > self.searcher.version

    def load(self) -> None:
        if self.pending():
            self.searcher.load_weights(self.weights, self.version)
        self.weights = None


class InlineRuntime:
    def __init__(self, searchers: list[Searcher], synced: list[bool]):
        """`searchers`, one per searcher spec of the run (usually one); `synced[i]`: searcher i loads the
        trainer's published weights (False: a fixed behaviour policy)."""
        self.all, self.synced = searchers, synced
        self.published = [Published(s) if on else None for s, on in zip(searchers, synced, strict=True)]
        self.t_start = time.perf_counter()

    @property
    def searchers(self) -> int:
        return len(self.all)

    @property
    def searcher(self) -> Searcher:
        return self.all[0]

    def launch(self) -> None:
        pass  # the searchers live in this process: nothing to start ahead

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def collect(self, block: bool = True) -> list[Group]:
        """Inline, search happens only when asked: one fresh search iteration of every searcher, in rank order
        (the runtime is always sync)."""
        return [g for s, p in zip(self.all, self.published, strict=True) for g in s.step(p)]

    def publish(self, weights, version: int) -> None:
        """Static batching: loaded now (between two steps no response is half-generated). Continuous batching:
        rows are in flight, so the searcher loads it when search.weight_update says."""
        for searcher, p in zip(self.all, self.published, strict=True):
            if p is None:
                continue
            if searcher.stream is None:
                searcher.load_weights(weights, version)
            else:
                p.weights, p.version = weights, version

    def report(self) -> RuntimeReport:
        """States carry no RNG: the searchers share the trainer process's RNG, which the checkpoint saves."""
        stats = {rank: WorkerStats.of(s, rank, self.t_start, with_rng=False) for rank, s in enumerate(self.all)}
        placement = [{"rank": i, "pid": os.getpid(), "host": socket.gethostname()} for i in range(len(self.all))]
        return worker_report(stats, [x.state for x in stats.values()], placement, restarts=0)

    def stop(self) -> None:
        for s in self.all:
            s.close()
            s.sampler.close()


class OfflineRuntime:
    """No searchers at all: the loop trains on whatever the buffer was restored with (runtime=offline)."""

    searchers = 0

    def launch(self) -> None:
        pass

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


def build_inline(parts: RuntimeParts) -> InlineRuntime:
    """`runtime=inline` (tba.runtime.RUNTIMES): the searchers in the trainer's process. A searcher of the trained
    policy samples with a copy of the behaviour policy (hf), one of another model with that model; each walks
    the prompts in the order a process searcher of its rank would."""
    own, searchers = parts.inline, []
    for spec in parts.searchers:
        shares = spec.sampler.takes_policy and spec.synced and spec.trained_policy  # else: load its own model
        policy = copy.deepcopy(own.policy) if shares else None
        sampler = build_sampler(spec.sampler, source=spec.sources.policy, tokenizer=own.tokenizer,
                                device=own.reference.device, seed=spec.seed, policy=policy)
        searcher = Searcher(sampler, own.reference, own.tokenizer, own.task, spec.search, seed=spec.seed,
                            shard=spec.shard, num_shards=spec.num_shards, source=spec.source,
                            scoring_temperature=spec.scoring_temperature, autocast=spec.autocast)
        searcher.version = parts.version if spec.synced else 0
        restore_searcher(searcher, parts.states[spec.rank] if parts.states else None)
        attach_outside(searcher)
        searchers.append(searcher)
    return InlineRuntime(searchers, [spec.synced for spec in parts.searchers])


def build_offline(parts: RuntimeParts) -> OfflineRuntime:
    """`runtime=offline` (tba.runtime.RUNTIMES): no searchers; the loop trains on the restored buffer."""
    return OfflineRuntime()
