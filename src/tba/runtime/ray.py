"""Ray runtime: searchers as Ray actors, for users who outgrow one machine.

Topology (built in `launch`):

    driver (trainer) ──ray.put once per version──▶ object store ──▶ SearcherActor 0..N-1 (any node)
          ▲                                                             │
          └──────────── step() results (groups + stats) ◀───────────────┘

Each actor keeps `pipeline_depth` step() calls queued, so it generates back to back while the trainer
trains (async) — no barrier: the newest weights ride along with the next call submitted after a
publish, and Ray fetches them once per node. In sync mode the loop submits one call per actor and waits.

Weights (search.weight_transport): `object_store` (auto for CPU weights) — `ray.put` of CPU copies, as
drawn above; `broadcast` (auto when the trainer is on a GPU) — a torch.distributed group (NCCL, or gloo on
CPU) whose store listens on the driver's node IP; each actor runs a receiver thread and loads the newest
weights at the start of a step() (tba.runtime.transport.broadcast). Control stays Ray calls either way; after Ray
restarts an actor, `restore` hands it the new group to join.

Faults: an actor that raises or dies is restarted by Ray (max_restarts = supervision.max_restarts) and restored
by the driver. An actor that is alive but silent (hung, SIGSTOPped) — calls in flight and no result within its
heartbeat (learnt from its own batch times, capped by `supervision.heartbeat_timeout_s`; tba.runtime.supervision)
— is treated the same way: `ray.kill(actor, no_restart=False)`, then restore.

`ray.address` joins an existing cluster (`ray start --head` …); otherwise a private Ray starts on
127.0.0.1 with the dashboard off and is shut down at the end. Every worker node must have `tba` installed
(same version) and see the model sources (hub names, or paths on a shared filesystem). Ray clusters have
no authentication: keep them on a private network.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time

import torch

from tba.algorithm.types import Group
from tba.runtime.searcher_spec import SearcherSpec
from tba.runtime.supervision import WorkerRuntime
from tba.runtime.transport import choose_transport, make_sender
from tba.runtime.worker import RuntimeParts, SearcherError, Worker, build_searcher, restore_searcher
from tba.tasks.base import RewardError

logger = logging.getLogger(__name__)

try:
    import ray
except ImportError:  # the optional extra is missing
    ray = None


def connect(cfg) -> bool:
    """Join `ray.address`, or start a private Ray on 127.0.0.1 (dashboard off), unless this process is connected
    already; says whether it started Ray (and so must shut it down)."""
    if ray.is_initialized():
        return False
    if cfg.address:
        ray.init(address=cfg.address, log_to_driver=True)
        return False
    ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=True)
    return True


def kill(actors: list, timeout_s: float = 10.0) -> None:
    """End `actors`, and wait (up to `timeout_s`, then SIGKILL) until the processes of those on this node have
    exited. Why wait: `ray.kill` marks an actor dead at once, but its process exits a little later, and a
    `ray.shutdown()` straight after can leave it running after the run has returned (an orphan)."""
    procs = _local_processes(actors)
    for actor in actors:
        ray.kill(actor)
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in procs if _running(*p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in left:
        logger.warning(f"Ray actor process {pid} still running {timeout_s:g} s after ray.kill: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _local_processes(actors: list) -> list[tuple[int, str]]:
    """(pid, start time) of each of `actors` that runs on this node, pids from Ray's actor table (Ray has no public
    call for it without its dashboard; on another Ray version that lacks it, or without /proc: none, and `kill`
    does not wait)."""
    try:
        here = ray.get_runtime_context().get_node_id()
        table = [ray._private.state.actors(actor_id=a._actor_id.hex()) for a in actors]
        pids = [int(t["Pid"]) for t in table if t.get("Pid") and t["Address"]["NodeID"] == here]
        return [(pid, started) for pid in pids if (started := _started(pid)) is not None]
    except Exception as e:  # noqa: BLE001 — a private API: its absence must not break a run's end
        logger.debug(f"actor process ids unavailable ({type(e).__name__}: {e}); not waiting for them to exit")
        return []


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: state, ppid, …, start time (field 22) at index 19; [] if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks after boot): with the pid, which process it is (pids are reused)."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else None


def _running(pid: int, started: str | None) -> bool:
    """Whether the process `pid` that started at `started` is still running (a zombie, exited and not yet reaped,
    is not)."""
    fields = _stat(pid)
    return len(fields) > 19 and fields[19] == started and fields[0] != "Z"


class _SearcherActor:
    def __init__(self, spec: SearcherSpec, state: dict | None, weights_spec):
        self.worker = Worker(build_searcher(spec, state), spec.rank, spec.synced, receiver=None)
        self._weights_spec = weights_spec

    def _open(self, spec) -> None:
        worker = self.worker
        if worker.receiver is not None:
            worker.receiver.close()
        worker.receiver = spec.open(worker.rank, worker.searcher.reference.device, ray.util.get_node_ip_address())
        if worker.synced:  # a fixed behaviour policy never loads the trainer's weights
            worker.receiver.load_initial(worker.searcher)

    def restore(self, state: dict | None, weights_spec) -> None:
        """After a Ray restart (which re-runs __init__ with the original arguments): continue from `state`, and
        receive weights through `weights_spec` (a broadcast: the group the driver formed for this incarnation)."""
        restore_searcher(self.worker.searcher, state)
        self._open(weights_spec)

    def ready(self) -> dict:
        """First start only (restarts get `restore`): join the weight group, load the trainer's weights."""
        self._open(self._weights_spec)
        return {"rank": self.worker.rank, "node_id": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname()}

    def step(self, *carried):
        """One batch; `carried` = (version, weights) when the transport sends weights with calls (object_store)."""
        if carried:
            self.worker.receiver.offer(*carried)
        return self.worker.step()


class RayRuntime(WorkerRuntime):
    pipeline_depth = 2

    def __init__(self, parts: RuntimeParts):
        if ray is None:
            raise RuntimeError("runtime=ray needs Ray: pip install 'tba[ray]' (or pip install 'ray[default]')")
        super().__init__(parts)
        self.ray_cfg = parts.ray
        self._version, self._initial = parts.version, parts.weights
        device = next(iter(parts.weights.values())).device
        self.transport_kind = choose_transport(parts.transport, "ray", device)
        self.transport = None  # the trainer's end of the weight transport (tba.runtime.transport.make_sender)
        self._recovering: dict[int, tuple] = {}  # actor index → (restore ObjectRef, deadline)
        self.sync = parts.sync
        self.actors: list = []
        self._in_flight: dict = {}  # ObjectRef → actor index
        self._started_ray = False

    def launch(self) -> None:
        """Create the actors and return: Ray runs their constructors (imports, model loads) while the trainer
        goes on; `start` waits for them and only then submits work."""
        if self.actors:
            return
        self._started_ray = connect(self.ray_cfg)
        r, s = self.ray_cfg, self.supervision
        # Ray restarts a dead actor itself (re-running __init__); tasks in flight at the death fail and are
        # not retried: the driver counts the restart, re-sends the searcher's last state and the newest weights
        actor_cls = ray.remote(_SearcherActor).options(
            num_cpus=r.searcher_cpus, num_gpus=r.searcher_gpus, resources=r.searcher_resources or {},
            max_restarts=s.max_restarts, max_task_retries=0)
        # broadcast: the store listens on this (the driver's) node's IP, every actor loads the weights before it
        # is ready; object_store: they ride with each actor's first call (nothing to send unless resumed)
        self.transport = make_sender(self.transport_kind, self._initial, num_searchers=len(self.specs),
                                     timeout_s=s.ready_timeout_s, host=ray.util.get_node_ip_address())
        self.transport.publish(self._initial, self._version)
        self._initial = None
        weights = self.transport.spec()
        self.actors = [actor_cls.remote(spec, self._states[spec.rank], weights) for spec in self.specs]

    def start(self) -> None:
        self.launch()
        timeout = self.supervision.ready_timeout_s
        self._placement = self._get([a.ready.remote() for a in self.actors], timeout, "to start")
        if not self.sync:
            for i in range(len(self.actors)):
                for _ in range(self.pipeline_depth):
                    self._submit(i)

    def _get(self, refs, timeout: float, what: str, rank: int | None = None):
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise SearcherError(f"timed out after {timeout:.0f}s waiting for searchers {what}") from None
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
            _raise_user_error(e)
            who = "a searcher" if rank is None else f"searcher {rank}"
            raise SearcherError(f"{who} failed. Traceback (remote, from Ray):\n{e}") from None

    def _submit(self, i: int) -> None:
        self._in_flight[self.actors[i].step.remote(*self.transport.attach(i))] = i
        self.supervisor.due(i)

    def _receive(self, ref) -> list[Group]:
        i = self._in_flight.pop(ref)
        timeout = self.supervision.collect_timeout_s
        try:
            groups, stats = ray.get(ref, timeout=timeout)
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
            _raise_user_error(e)
            self._recover(i, e)
            return []
        except ray.exceptions.GetTimeoutError:
            raise SearcherError(f"timed out after {timeout:g}s (supervision.collect_timeout_s) waiting for searcher "
                                f"{i} to return a finished batch") from None
        self.record(stats)
        self.supervisor.delivered(i, owes_more=i in self._in_flight.values())  # its next call is due in turn
        return groups

    def _recover(self, i: int, error: Exception | None = None, *, why: str | None = None) -> None:
        """Searcher i raised, died (`error`) or hung (`why`): count it once, let Ray restart it, then restore its
        last state.

        While Ray restarts an actor, calls to it fail with ActorUnavailableError; those are the same incident,
        not new failures. The restore call is re-sent until it succeeds (deadline: supervision.ready_timeout_s)."""
        if i in self._recovering:
            return
        cause = why if why is not None else f"failed ({type(error).__name__}). Traceback (remote, from Ray):\n{error}"
        self.supervisor.charge(i, cause, action="Ray restarts it")
        for ref in [r for r, j in self._in_flight.items() if j == i]:
            del self._in_flight[ref]  # the failed incarnation's other calls: dropped, not counted again
        self.supervisor.forget(i)  # timed again, at a pace learnt anew, from its first call after the restore
        if why is not None or isinstance(error, ray.exceptions.RayTaskError):  # alive but hung or suspect
            ray.kill(self.actors[i], no_restart=False)
        deadline = time.monotonic() + self.supervision.ready_timeout_s
        self.transport.rejoin(i)  # broadcast: a new group, joined in `restore`; object_store: resend the newest
        self._recovering[i] = (self._restore(i), deadline)

    def _restore(self, i: int):
        return self.actors[i].restore.remote(self._states[i], self.transport.spec())

    def _poll_recovering(self) -> None:
        for i, (ref, deadline) in list(self._recovering.items()):
            if not ray.wait([ref], timeout=0)[0]:
                if time.monotonic() > deadline:
                    raise SearcherError(f"searcher {i} did not come back after a restart within "
                                        f"supervision.ready_timeout_s={self.supervision.ready_timeout_s:.0f}s")
                continue
            try:
                ray.get(ref)
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError):  # still restarting
                self._recovering[i] = (self._restore(i), deadline)
                continue
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                raise SearcherError(f"searcher {i} could not be restored after a restart:\n{e}") from None
            del self._recovering[i]
            logger.info(f"searcher {i} is back (restarted by Ray, state restored)")
            if not self.sync:
                for _ in range(self.pipeline_depth):
                    self._submit(i)

    def _check_heartbeat(self) -> None:
        """Restart (through Ray) every actor that owes a result and is silent past its heartbeat. A finished
        call not yet received counts as a delivery."""
        for i in range(len(self.actors)):
            why = None if i in self._recovering else self.supervisor.silent(i)
            if why is None:
                continue
            refs = [r for r, j in self._in_flight.items() if j == i]
            if refs and ray.wait(refs, num_returns=1, timeout=0)[0]:
                continue
            self._recover(i, why=why)

    def collect(self, block: bool) -> list[Group]:
        groups: list[Group] = []
        self.transport.check()
        self._poll_recovering()
        if block and self.sync:
            for i in range(len(self.actors)):
                if i not in self._recovering:
                    self._submit(i)
        if block:  # sync: every submitted call; async: any one call
            deadline = time.monotonic() + self.supervision.collect_timeout_s
            while True:
                pending = list(self._in_flight)
                want = len(pending) if self.sync else 1
                if pending and len(ray.wait(pending, num_returns=want, timeout=0.5)[0]) >= want:
                    break
                if not pending:
                    time.sleep(0.2)
                self._poll_recovering()
                if self.sync and not pending and not self._recovering:
                    for i in range(len(self.actors)):
                        self._submit(i)
                self._check_heartbeat()
                if time.monotonic() > deadline:
                    raise SearcherError("timed out waiting for searchers to deliver samples")
        pending = list(self._in_flight)
        ready = ray.wait(pending, num_returns=len(pending), timeout=0)[0] if pending else []
        for ref in ready:
            if ref not in self._in_flight:
                continue  # dropped after its searcher failed
            i = self._in_flight[ref]
            groups.extend(self._receive(ref))
            if not self.sync and i not in self._recovering:
                self._submit(i)
        self._check_heartbeat()
        return groups

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.transport.publish(weights, version)

    def stop(self) -> None:
        if ray is not None and ray.is_initialized():
            kill(self.actors)
            self.actors, self._in_flight = [], {}
            if self._started_ray:
                ray.shutdown()
        if self.transport is not None:
            self.transport.close()
            self.transport = None


def _raise_user_error(error: Exception) -> None:
    """A searcher's RewardError (a broken reward function) ends the run with its one line, as in-process: a
    restart would fail alike."""
    if isinstance(getattr(error, "cause", None), RewardError):
        raise error.cause from None


def build(parts: RuntimeParts) -> RayRuntime:
    """`runtime=ray` (tba.runtime.RUNTIMES)."""
    return RayRuntime(parts)
