"""Local runtime: searchers in torch.multiprocessing (spawn) processes, weights through shared memory.

Topology (built in `start`):

    trainer process ──publish──▶ shared fp32 weight vector + version counter (one lock)
          ▲                                  │  each searcher checks the counter between generation batches
          └──────── groups queue ◀── searcher 0..N-1 (own prompt shard, own policy copy, reference)

No barrier anywhere: `publish` copies the weights into shared memory and bumps the version; a searcher picks
up the newest version when it finishes its current batch. In sync mode the searchers generate only when the
loop asks (one batch each per request), which turns the same components into the alternating baseline.

Lifecycle: spawn → each child loads its models and reports "ready" (deadline `search.ready_timeout_s`,
liveness polled); any exception in a child is sent with its traceback and raised in the trainer as
SearcherError; stop → event, join, terminate, kill, each with a timeout. Children ignore Ctrl-C (the parent
owns shutdown) and exit on their own if the parent disappears, so no process outlives the run.
"""

from __future__ import annotations

import os
import queue as queue_lib
import signal
import socket
import time
import traceback

import torch
import torch.multiprocessing as mp

from tba.config import RunConfig, to_dict
from tba.runtime.base import ModelSources, SearcherError, aggregate_stats, build_searcher, flatten, unflatten_into
from tba.types import Group


def _searcher_main(rank, cfg_dict, sources, threads, shared, version, lock, out_q, stop, request, parent_pid):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        searcher = build_searcher(rank, cfg_dict, sources, threads)
        out_q.put(("ready", rank, None))
        t_start, busy, sync_s = time.perf_counter(), 0.0, 0.0
        while not stop.is_set():
            if os.getppid() != parent_pid:
                return  # orphaned: the trainer is gone
            if request is not None and not request.acquire(timeout=0.2):
                continue  # sync mode: wait to be asked
            if version.value > searcher.version:
                t0 = time.perf_counter()
                with lock:
                    v, flat = version.value, shared.clone()
                unflatten_into(flat, searcher.policy)
                searcher.version = v
                sync_s += time.perf_counter() - t0
            groups = searcher.step()
            busy += searcher.last_step_s
            stats = {"rank": rank, "version": searcher.version, "samples": searcher.samples_generated,
                     "busy": busy, "alive_s": time.perf_counter() - t_start, "sync_s": sync_s}
            while not stop.is_set():
                try:
                    out_q.put(("groups", rank, (groups, stats)), timeout=0.5)
                    break
                except queue_lib.Full:
                    continue
    except BaseException:
        out_q.put(("error", rank, traceback.format_exc()))


class LocalRuntime:
    def __init__(self, cfg: RunConfig, sources: ModelSources, initial_weights: dict[str, torch.Tensor],
                 threads_per_searcher: int):
        self.cfg, self.sources, self.threads = cfg, sources, threads_per_searcher
        self.n = cfg.search.num_searchers
        self.sync = cfg.mode == "sync"
        self._initial = flatten(initial_weights)
        self._procs: list = []
        self._stats: dict[int, dict] = {}
        self._pending: list[Group] = []

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.shared = self._initial.clone().share_memory_()  # [P] fp32, in state_dict order
        self.version = ctx.Value("q", 0, lock=False)
        self.lock = ctx.Lock()
        self.queue = ctx.Queue(maxsize=16 * self.n)
        self.stop_event = ctx.Event()
        self.requests = [ctx.Semaphore(0) if self.sync else None for _ in range(self.n)]
        for rank in range(self.n):
            p = ctx.Process(target=_searcher_main, name=f"tba-searcher-{rank}", daemon=True, args=(
                rank, to_dict(self.cfg), self.sources, self.threads, self.shared, self.version, self.lock,
                self.queue, self.stop_event, self.requests[rank], os.getpid()))
            p.start()
            self._procs.append(p)
        self._placement = [{"rank": r, "pid": p.pid, "host": socket.gethostname()} for r, p in enumerate(self._procs)]
        ready, deadline = set(), time.monotonic() + self.cfg.search.ready_timeout_s
        while len(ready) < self.n:
            kind, rank, payload = self._get(deadline, "to start")
            if kind == "ready":
                ready.add(rank)

    def _get(self, deadline: float, what: str):
        """Next message from any searcher, raising on errors, dead children and the deadline."""
        while True:
            try:
                kind, rank, payload = self.queue.get(timeout=0.2)
            except queue_lib.Empty:
                for rank, p in enumerate(self._procs):
                    if not p.is_alive():
                        raise SearcherError(
                            f"searcher {rank} died (exit code {p.exitcode}) before it could report an error; "
                            "its own output (stderr, above) has the cause") from None
                if time.monotonic() > deadline:
                    raise SearcherError(f"timed out waiting for searchers {what}") from None
                continue
            if kind == "error":
                raise SearcherError(f"searcher {rank} failed:\n{payload}")
            if kind == "groups":
                groups, stats = payload
                self._stats[rank] = stats
            return kind, rank, payload

    def collect(self, block: bool) -> list[Group]:
        groups: list[Group] = []
        if block:
            for r in self.requests:
                if r is not None:
                    r.release()
            need = self.n if self.sync else 1
            deadline = time.monotonic() + self.cfg.search.collect_timeout_s
            for _ in range(need):
                groups.extend(self._get(deadline, "to deliver samples")[2][0])
        while True:  # drain whatever else is ready, without waiting
            try:
                kind, rank, payload = self.queue.get_nowait()
            except queue_lib.Empty:
                break
            if kind == "error":
                raise SearcherError(f"searcher {rank} failed:\n{payload}")
            groups.extend(payload[0])
            self._stats[rank] = payload[1]
        if not block:
            for rank, p in enumerate(self._procs):
                if not p.is_alive():
                    raise SearcherError(f"searcher {rank} died (exit code {p.exitcode}) before it could report an "
                                        "error; its own output (stderr, above) has the cause")
        return groups

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        flat = flatten(weights)
        with self.lock:
            self.shared.copy_(flat)
            self.version.value = version

    def stats(self) -> dict[str, float]:
        return aggregate_stats(list(self._stats.values()))

    def placement(self) -> list[dict]:
        return self._placement

    def stop(self) -> None:
        if not self._procs:
            return
        self.stop_event.set()
        deadline = time.monotonic() + 10
        while any(p.is_alive() for p in self._procs) and time.monotonic() < deadline:
            try:  # keep the queue drained so no child blocks on a full pipe
                self.queue.get(timeout=0.1)
            except queue_lib.Empty:
                pass
        for p in self._procs:
            p.join(timeout=1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=3)
            if p.is_alive():
                p.kill()
                p.join(timeout=3)
        self._procs = []
        self.queue.close()
        self.queue.cancel_join_thread()
