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

    def launch(self) -> None:
        pass  # the searcher lives in this process: nothing to start ahead

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


def build_inline(cfg, *, task, tokenizer, policy, reference, sources, version, states, **_) -> InlineRuntime:
    """`runtime=inline` (tba.runtime.RUNTIMES): one searcher in the trainer's process, sampling with a copy of
    the trainer's policy (hf) and walking the prompts in the order a process searcher of rank 0 would."""
    import copy

    from tba.runtime.base import restore_searcher
    from tba.samplers import build_sampler
    from tba.seeding import searcher_seed

    seed = searcher_seed(cfg.seed, 0)
    sampler = build_sampler(cfg, source=sources.policy, tokenizer=tokenizer, device=reference.device, seed=seed,
                            policy=copy.deepcopy(policy) if cfg.search.backend == "hf" else None)
    searcher = Searcher(sampler, reference, tokenizer, task, cfg.search, seed=seed)
    searcher.version = version
    restore_searcher(searcher, states[0] if states else None)
    return InlineRuntime(searcher)


def build_offline(cfg, **_) -> OfflineRuntime:
    """`runtime=offline` (tba.runtime.RUNTIMES): no searchers; the loop trains on the restored buffer."""
    return OfflineRuntime()
