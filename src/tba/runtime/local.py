"""Local runtime: searchers in torch.multiprocessing (spawn) processes, weights through shared memory.

Topology (built in `start`):

    trainer process ──publish──▶ shared fp32 weight vector + version counter (one lock)
          ▲                                  │  each searcher checks the counter between generation batches
          └──────── groups queue ◀── searcher 0..N-1 (own prompt shard, own policy copy, reference)

No barrier anywhere: `publish` copies the weights into shared memory and bumps the version; a searcher picks
up the newest version when it finishes its current batch. In sync mode the searchers generate only when the
loop asks (one batch each per request), which turns the same components into the alternating baseline.

Lifecycle: spawn → each child loads its models and reports "ready" (deadline `search.ready_timeout_s`,
liveness polled). A child that raises (its traceback is sent) or dies (kill -9, OOM: seen by the liveness
check) is restarted from its last reported prompt cursor and the newest weights while training goes on, up
to `search.max_restarts` per run; one more failure raises SearcherError with the traceback. Messages carry
(rank, incarnation) so a dead child's late error is not counted twice; its groups are still kept.
Stop → event, join, terminate, kill, each with a timeout. Children ignore Ctrl-C (the parent owns shutdown)
and exit on their own if the parent disappears, so no process outlives the run.
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
from tba.runtime.base import (
    ModelSources,
    SearcherError,
    aggregate_stats,
    build_searcher,
    flatten,
    newest_reward_error,
    unflatten_into,
    worker_state,
)
from tba.types import Group


def _searcher_main(rank, incarnation, cfg_dict, sources, threads, state, shared, version, lock, out_q, stop, request,
                   parent_pid):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tag = (rank, incarnation)
    try:
        with lock:
            v, flat = version.value, shared.clone()
        searcher = build_searcher(rank, cfg_dict, sources, threads, state, version=v)
        unflatten_into(flat, searcher.policy)  # the newest published weights, whatever `sources` holds
        out_q.put(("ready", tag, None))
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
                     "busy": busy, "alive_s": time.perf_counter() - t_start, "sync_s": sync_s,
                     "state": worker_state(searcher), "reward_error": searcher.last_reward_error}
            while not stop.is_set():
                try:
                    out_q.put(("groups", tag, (groups, stats)), timeout=0.5)
                    break
                except queue_lib.Full:
                    continue
    except BaseException:
        out_q.put(("error", tag, traceback.format_exc()))


class LocalRuntime:
    def __init__(self, cfg: RunConfig, sources: ModelSources, initial_weights: dict[str, torch.Tensor],
                 threads_per_searcher: int, *, version: int = 0, states: list[dict] | None = None, log=print):
        self.cfg, self.sources, self.threads, self.log = cfg, sources, threads_per_searcher, log
        self.n = cfg.search.num_searchers
        self.sync = cfg.mode == "sync"
        self._initial, self._initial_version = flatten(initial_weights), version
        self._procs: list = []
        self._incarnation = [0] * self.n
        self._states: list[dict | None] = list(states) if states else [None] * self.n
        self._stats: dict[int, dict] = {}
        self.restarts = 0

    def start(self) -> None:
        ctx = self._ctx = mp.get_context("spawn")
        self.shared = self._initial.clone().share_memory_()  # [P] fp32, in state_dict order
        self.version = ctx.Value("q", self._initial_version, lock=False)
        self.lock = ctx.Lock()
        self.queue = ctx.Queue(maxsize=16 * self.n)
        self.stop_event = ctx.Event()
        self.requests = [ctx.Semaphore(0) if self.sync else None for _ in range(self.n)]
        self._procs = [self._spawn(rank) for rank in range(self.n)]
        self._placement = [{"rank": r, "pid": p.pid, "host": socket.gethostname()} for r, p in enumerate(self._procs)]
        ready, deadline = set(), time.monotonic() + self.cfg.search.ready_timeout_s
        while len(ready) < self.n:
            kind, rank, _ = self._get(deadline, "to start")
            if kind == "ready":
                ready.add(rank)

    def _spawn(self, rank: int):
        p = self._ctx.Process(target=_searcher_main, name=f"tba-searcher-{rank}", daemon=True, args=(
            rank, self._incarnation[rank], to_dict(self.cfg), self.sources, self.threads, self._states[rank],
            self.shared, self.version, self.lock, self.queue, self.stop_event, self.requests[rank], os.getpid()))
        p.start()
        return p

    def _restart(self, rank: int, why: str) -> None:
        """Replace a failed searcher (same shard, from its last reported cursor), or stop the run past the limit."""
        limit = self.cfg.search.max_restarts
        if self.restarts >= limit:
            raise SearcherError(f"searcher {rank} {why}\nrestart limit reached (search.max_restarts={limit}, "
                                f"{self.restarts} restarts so far): stopping the run")
        self.restarts += 1
        old = self._procs[rank]
        if old.is_alive():
            old.kill()
        old.join(timeout=5)
        self._incarnation[rank] += 1
        self.log(f"searcher {rank} {why.splitlines()[0] if why else ''} — restarting it "
                 f"({self.restarts}/{limit} restarts used)")
        if why and "\n" in why:
            self.log(why)
        self._procs[rank] = self._spawn(rank)
        self._placement[rank]["pid"] = self._procs[rank].pid
        if self.requests[rank] is not None:
            self.requests[rank].release()  # sync mode: the request the dead searcher took is re-issued

    def _check_alive(self) -> None:
        for rank, p in enumerate(self._procs):
            if not p.is_alive():
                self._restart(rank, f"died (exit code {p.exitcode}); its own output (stderr, above) has the cause")

    def _handle(self, kind: str, tag: tuple[int, int], payload) -> list[Group] | None:
        """Groups for "groups" messages (from any incarnation: they are valid data); None otherwise."""
        rank, incarnation = tag
        if kind == "groups":
            groups, stats = payload
            if incarnation == self._incarnation[rank]:
                self._stats[rank] = stats
                self._states[rank] = stats["state"]
            return groups
        if kind == "error" and incarnation == self._incarnation[rank]:
            self._restart(rank, f"failed:\n{payload}")
        return None

    def _get(self, deadline: float, what: str):
        """Next current-incarnation message, restarting failed searchers; raises past the deadline."""
        while True:
            try:
                kind, tag, payload = self.queue.get(timeout=0.2)
            except queue_lib.Empty:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise SearcherError(f"timed out waiting for searchers {what}") from None
                continue
            groups = self._handle(kind, tag, payload)
            if kind == "ready" and tag[1] == self._incarnation[tag[0]]:
                return kind, tag[0], None
            if groups is not None:
                return kind, tag[0], groups

    def collect(self, block: bool) -> list[Group]:
        groups: list[Group] = []
        if block:
            for r in self.requests:
                if r is not None:
                    r.release()
            need = self.n if self.sync else 1
            deadline = time.monotonic() + self.cfg.search.collect_timeout_s
            got = 0
            while got < need:
                kind, _, payload = self._get(deadline, "to deliver samples")
                if kind == "groups":
                    groups.extend(payload)
                    got += 1
        while True:  # drain whatever else is ready, without waiting
            try:
                kind, tag, payload = self.queue.get_nowait()
            except queue_lib.Empty:
                break
            groups.extend(self._handle(kind, tag, payload) or [])
        if not block:
            self._check_alive()
        return groups

    def searcher_states(self) -> list[dict | None]:
        """Each searcher's state as of the last batch the trainer received (for checkpoints)."""
        return list(self._states)

    @property
    def last_reward_error(self) -> str | None:
        return newest_reward_error(list(self._stats.values()))

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        flat = flatten(weights)
        with self.lock:
            self.shared.copy_(flat)
            self.version.value = version

    def stats(self) -> dict[str, float]:
        return {**aggregate_stats(list(self._stats.values())), "searcher/restarts": self.restarts}

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
