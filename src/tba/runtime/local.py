"""Local runtime: searchers in torch.multiprocessing processes; weights through a transport.

Topology (built in `launch`):

    trainer process ──publish──▶ weight transport (tba.runtime.transport, search.weight_transport)
          ▲                                  │  each searcher checks for a newer version between batches
          └──────── groups queue ◀── searcher 0..N-1 (own prompt shard, own sampler, reference)

Devices: each searcher process sees only its own GPU(s) — CUDA_VISIBLE_DEVICES names them (through this process's
own CUDA_VISIBLE_DEVICES, if set) and its device inside is cuda:0 (`child_devices`) — so vLLM, which takes the first
visible GPU, runs wherever search.device puts it, and a tensor-parallel engine's k GPUs are its cuda:0..k-1.

Transports: `shared` (auto) — flat buffers in host shared memory, or on the trainer's GPU as CUDA IPC handles when
every searcher shares that GPU, plus a version counter; `broadcast` — a gloo/NCCL group fed by the trainer
(tba.runtime.transport.broadcast); `vllm` (auto for vLLM engines on GPUs of their own) — vLLM's NCCL weight
transfer into each engine (tba.runtime.transport.vllm). With `shared` and `broadcast` there is no barrier:
`publish` copies the weights out of the trainer and returns; a searcher loads the newest version
(`Searcher.load_weights`) when it finishes its current batch. With `vllm`, `publish` waits for every searcher's
next load point (batch boundary, or decode step in flight), and the weights go straight into the engines; idle
searchers (waiting for `go`, or in sync mode for a request) serve it too. In sync mode the searchers generate only
when the loop asks (one batch each per request), which turns the same components into the alternating baseline.

Lifecycle: `launch` starts the children (the loop calls it before the trainer's first evaluation), forked from a
server that has tba imported already (tba.runtime.forkserver) or, with vLLM or supervision.start_method=spawn,
spawned (each imports tba first) → each child loads its models and reports "ready", then waits for `go` → `start`
waits for every "ready" (deadline `supervision.ready_timeout_s` from `start`, liveness polled) and sets `go`: a
child's seconds of start-up overlap the evaluation, and no sample is generated before it ends. A child that raises
(its traceback is sent) or dies (kill -9, OOM: seen by the liveness check) is restarted from its last reported
prompt cursor and the newest weights while training goes on, up to `supervision.max_restarts` per run; one more
failure raises SearcherError with the traceback. So is a searcher that is alive but silent (hung, deadlocked,
SIGSTOPped): one that owes a batch — async: always, sync: once asked — and stays silent past its heartbeat (learnt
from its own batch times, capped by `supervision.heartbeat_timeout_s`; tba.runtime.supervision) is killed and
restarted the same way; a restarted one has `supervision.ready_timeout_s` to report ready before its heartbeat clock
starts. Messages carry (rank, incarnation) so a dead child's late error is not counted twice; its groups are still
kept. With `broadcast`, the replacement joins a new group that the trainer forms with every searcher (see
broadcast.py). Stop → event, then SIGTERM, SIGKILL, each with a timeout, by pid (tba.runtime.lifetime: never waiting
on the fork server, which may have stopped answering); the fork server itself is stopped before the trainer's process
exits (tba.runtime.forkserver.stop). Children ignore Ctrl-C (the parent owns shutdown) and end within a fraction of a
second once the trainer is gone, whatever they are doing (tba.runtime.lifetime.Lifeline), so no process outlives the
run.
"""

from __future__ import annotations

import dataclasses
import os
import queue as queue_lib
import signal
import socket
import time
import traceback
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from tba.algorithm.types import Group
from tba.plugins import load_object
from tba.runtime import forkserver
from tba.runtime.lifetime import Child, Lifeline
from tba.runtime.searcher_spec import SearcherSpec
from tba.runtime.supervision import WorkerRuntime
from tba.runtime.transport import choose_transport, in_host_memory, make_sender
from tba.runtime.visibility import (
    check_distinct_gpus,
    check_vllm_members,
    child_devices,
    searcher_gpus,
    vllm_engine,
)
from tba.runtime.worker import RuntimeParts, SearcherError, Worker, build_searcher
from tba.tasks.base import RewardError


@dataclass
class WorkerArgs:
    """What a searcher process is started with (pickled: plain data, transport spec, mp primitives)."""

    spec: SearcherSpec
    incarnation: int
    """Bumped at each restart of this rank: messages of a dead incarnation are told apart."""
    state: dict | None
    """The searcher's state as of its last batch received (None: a fresh start)."""
    weights: object
    """The transport's spec (`WeightSender.spec()`), opened in the child as its receiver."""
    out_q: object
    stop: object
    request: object | None
    """Sync mode: a semaphore the trainer releases once per batch it asks for; async: None."""
    go: object
    """Set by `start`: a searcher launched early waits, ready, until the trainer's first evaluation is over."""
    env: dict[str, str]
    """The trainer's environment variables now (a forked child would otherwise have the server's)."""
    trainer_pid: int
    """The process the searcher must not outlive (a forked one's parent is the fork server)."""


def _searcher_main(a: WorkerArgs):
    trainer = Lifeline(a.trainer_pid)
    trainer.watch()  # first: from here on this process ends with the trainer, even blocked in a C call at start-up
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    forkserver.settle(a.env)
    rank, out_q, stop, request = a.spec.rank, a.out_q, a.stop, a.request
    tag = (rank, a.incarnation)
    receiver = searcher = None
    try:
        searcher = build_searcher(a.spec, a.state)
        receiver = a.weights.open(rank, searcher.reference.device, "127.0.0.1")
        if a.spec.synced:  # the newest published weights, whatever `sources` holds (a fixed group keeps its own)
            receiver.load_initial(searcher)
        out_q.put(("ready", tag, None))
        worker = Worker(searcher, rank, a.spec.synced, receiver)
        while not a.go.wait(0.2):  # launched before the trainer's first evaluation: generate from `start` on
            if stop.is_set() or trainer.gone():
                out_q.cancel_join_thread()
                return
            worker.idle()
        while not stop.is_set():
            if trainer.gone():
                # orphaned: the trainer is gone. Batches already handed to the queue's feeder thread can never
                # be read; without this, exit would wait on that thread (blocked on a full pipe) forever.
                out_q.cancel_join_thread()
                return
            if request is not None and not request.acquire(timeout=0.2):
                worker.idle()
                continue  # sync mode: wait to be asked
            groups, stats = worker.step()
            while not stop.is_set() and not trainer.gone():  # a full queue whose trainer died: exit
                try:
                    out_q.put(("groups", tag, (groups, stats)), timeout=0.5)
                    break
                except queue_lib.Full:  # the trainer may be waiting for this searcher (vllm transport)
                    worker.idle()
    except RewardError as e:  # a broken reward function: every restart would fail alike, the run stops
        out_q.put(("fatal", tag, str(e)))
    except BaseException:
        out_q.put(("error", tag, traceback.format_exc()))
    finally:
        if searcher is not None:
            searcher.close()  # an agent task's endpoint and harness threads
        if receiver is not None:
            receiver.close()


class LocalRuntime(WorkerRuntime):
    def __init__(self, parts: RuntimeParts):
        super().__init__(parts)
        self.n = len(self.specs)
        self.sync = parts.sync
        self._initial, self._initial_version = parts.weights, parts.version
        device = next(iter(parts.weights.values())).device
        self.gpus = [searcher_gpus(spec.device) for spec in self.specs]
        members = [spec.synced for spec in self.specs]
        engines = [spec.sampler.vllm.tensor_parallel_size if vllm_engine(spec) else 0 for spec in self.specs]
        vllm_engines = any(members) and all(engines[r] and device.index not in self.gpus[r] and self.gpus[r]
                                            for r in range(self.n) if members[r])
        self.transport_kind = choose_transport(parts.transport, "local", device, vllm_engines)
        self.members = [engines[r] if members[r] else 0 for r in range(self.n)]
        if self.transport_kind == "vllm":
            check_vllm_members(self.specs, self.members)
            self.specs = [dataclasses.replace(s, sampler=dataclasses.replace(s.sampler, weight_transfer="nccl"))
                          if m else s for s, m in zip(self.specs, self.members, strict=True)]
        elif max(engines, default=0) > 1:
            raise SearcherError(f"search.vllm.tensor_parallel_size > 1: the engine's workers are reached only by "
                                f"vLLM's weight transfer, and the transport here is {self.transport_kind}; every "
                                "synced searcher must be a vLLM engine on GPUs other than the trainer's "
                                "(search.weight_transport=vllm)")
        if self.transport_kind in ("broadcast", "vllm") and device.type == "cuda":
            check_distinct_gpus(self.gpus, device, self.members if self.transport_kind == "vllm" else None)
        self.in_host = in_host_memory(device, self.gpus)
        self.transport = None
        self._procs: list[Child] = []
        self._incarnation = [0] * self.n
        self._owed = [0] * self.n  # sync mode: batches each rank has been asked for and not yet delivered

    def launch(self) -> None:
        """Spawn the searchers and return: they import, load their models and report ready while the trainer
        goes on (its first evaluation); they generate only once `start` sets `go`."""
        if self._procs:
            return
        fresh = any(spec.sampler.fresh_process for spec in self.specs)  # declared by the backend
        self.start_method = forkserver.method(self.supervision.start_method, fresh)
        if self.start_method == "forkserver":
            forkserver.start()  # a no-op when `tba train` started it already
        ctx = self._ctx = mp.get_context(self.start_method)
        self.transport = make_sender(self.transport_kind, self._initial, num_searchers=self.n, ctx=ctx,
                                     timeout_s=self.supervision.ready_timeout_s, in_host=self.in_host,
                                     members=self.members, alive=self._all_alive)
        self.transport.publish(self._initial, self._initial_version)
        self._initial = None  # the trainer's live tensors: copied now, not held
        self.queue = ctx.Queue(maxsize=16 * self.n)
        self.stop_event = ctx.Event()
        self.requests = [ctx.Semaphore(0) if self.sync else None for _ in range(self.n)]
        self.go = ctx.Event()
        self._procs = [self._spawn(rank) for rank in range(self.n)]
        self._placement = [{"rank": r, "pid": p.pid, "host": socket.gethostname()} for r, p in enumerate(self._procs)]

    def start(self) -> None:
        self.launch()
        ready, deadline = set(), time.monotonic() + self.supervision.ready_timeout_s
        while len(ready) < self.n:
            kind, rank, _ = self._get(deadline, "to start")
            if kind == "ready":
                ready.add(rank)
        self.go.set()

    def _child_env(self, spec: SearcherSpec) -> dict[str, str]:
        """Variables a searcher process needs from its first instruction: the GPUs it may see, and what its backend
        declares (vLLM on CPU: LD_PRELOAD, which the dynamic loader reads only when a process starts)."""
        env = child_devices(spec.device, os.environ.get("CUDA_VISIBLE_DEVICES"))[0]
        if spec.sampler.child_env is not None:
            env |= load_object(spec.sampler.child_env, "search.backend")(spec.sampler, spec.device)
        return env

    def _spawn(self, rank: int):
        env = self._child_env(self.specs[rank])
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # spawn copies this process's environment into the child (never forked: `launch`)
        try:
            return self._start_process(rank)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _all_alive(self) -> bool:
        return not any(p.exited() for p in self._procs)

    def _start_process(self, rank: int):
        spec = self.specs[rank]
        spec = dataclasses.replace(spec, device=child_devices(spec.device, None)[1])  # its device inside
        args = WorkerArgs(spec, self._incarnation[rank], self._states[rank], self.transport.spec(),
                          self.queue, self.stop_event, self.requests[rank], self.go, forkserver.environment(),
                          os.getpid())
        p = self._ctx.Process(target=_searcher_main, name=f"tba-searcher-{rank}", daemon=True, args=(args,))
        if self.start_method != "forkserver":
            p.start()
            return Child(p)
        try:  # a stopped or hung server would otherwise keep the trainer waiting here for ever
            forkserver.start_process(p, self.supervision.ready_timeout_s)
        except TimeoutError as e:
            raise SearcherError(f"searcher {rank} could not be started: {e}") from None
        return Child(p)

    def _restart(self, rank: int, why: str) -> None:
        """Replace a failed searcher (same shard, from its last reported cursor), or stop the run past the limit."""
        self.supervisor.charge(rank, why)
        self._procs[rank].end(((signal.SIGKILL, 5.0),))  # failed or hung: nothing to wind down
        self._incarnation[rank] += 1
        self.transport.rejoin(rank)
        self._procs[rank] = self._spawn(rank)
        self._placement[rank]["pid"] = self._procs[rank].pid
        self.supervisor.restarted(rank)  # timed by ready_timeout_s, then at a pace learnt anew
        if self.requests[rank] is not None:
            self.requests[rank].release()  # sync mode: the request the dead searcher took is re-issued

    def _check_alive(self) -> None:
        """Restart searchers that died, did not come back after a restart, or owe a batch for too long.

        Call with the queue drained: a delivery waiting in it resets the heartbeat only once it is read."""
        self.transport.check()
        for rank, p in enumerate(self._procs):
            if p.exited():
                code = p.reported_exitcode()
                code = "unknown: its fork server did not report it" if code is None else code
                self._restart(rank, f"died (exit code {code}); its own output (stderr, above) has the cause")
            elif why := self.supervisor.silent(rank):
                self._restart(rank, why)

    def _owes(self, rank: int) -> bool:
        return not self.sync or self._owed[rank] > 0

    def _handle(self, kind: str, tag: tuple[int, int], payload) -> list[Group] | None:
        """Groups for "groups" messages (from any incarnation: they are valid data); None otherwise."""
        rank, incarnation = tag
        if kind == "groups":
            groups, stats = payload
            if incarnation == self._incarnation[rank]:
                self.record(stats)
                if self.sync:
                    self._owed[rank] = max(0, self._owed[rank] - 1)
                self.supervisor.delivered(rank, owes_more=self._owes(rank))
            return groups
        if kind == "ready" and incarnation == self._incarnation[rank]:
            self.supervisor.ready(rank, owes=self._owes(rank))
        if kind == "error" and incarnation == self._incarnation[rank]:
            self._restart(rank, f"failed:\n{payload}")
        if kind == "fatal":
            raise RewardError(payload)
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
            for rank, r in enumerate(self.requests):
                if r is not None:
                    r.release()
                    self._owed[rank] += 1
                    self.supervisor.due(rank)
            need = self.n if self.sync else 1
            deadline = time.monotonic() + self.supervision.collect_timeout_s
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

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.transport.publish(weights, version)

    def stop(self) -> None:
        if self._procs:
            self._stop_searchers()
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def _stop_searchers(self) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + 10
        while not all(p.exited() for p in self._procs) and time.monotonic() < deadline:
            try:  # keep the queue drained so no child blocks on a full pipe
                self.queue.get(timeout=0.1)
            except queue_lib.Empty:
                pass
        for p in self._procs:
            p.end()
        self._procs = []
        self.queue.close()
        self.queue.cancel_join_thread()


def build(parts: RuntimeParts) -> LocalRuntime:
    """`runtime=local` (tba.runtime.RUNTIMES)."""
    return LocalRuntime(parts)
