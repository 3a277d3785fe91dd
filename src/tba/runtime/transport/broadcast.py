"""The `broadcast` weight transport: a torch.distributed group of the trainer (rank 0) and the searchers.

NCCL when the trainer's weights are on a GPU, gloo on CPU. The group is a dedicated backend object built on
its own TCPStore, never the global default process group, so a trainer that uses torch.distributed itself
is not disturbed. The store is also the control channel — the same for local processes and Ray actors:

    trainer                                   TCPStore (trainer's host)          searcher r (receiver thread)
    publish: pack → set e{E}/b{n} = version ──────────▶ key appears ─────────────▶ joins broadcast n of epoch E
             broadcast(buffers) ═══════════════ gloo / NCCL ═══════════════════▶  into its staging buffers
                                                                                  ready_version = version
    searcher main loop, at a batch boundary: staging newer than the policy → Searcher.load_weights(views)

Async: each searcher's receiver thread is always waiting for the next announcement, so a publish never waits
for a generation to end — at most for one searcher's load from staging (a copy), since the receiver does not
overwrite staging while the loop loads from it. The loop skips a load while a broadcast is in flight. Each
receiver acknowledges a complete broadcast on the store before `publish` returns, so, as with `shared`, a
searcher's next batch after a publish uses the new weights (what sync mode needs).

Membership: a fixed-world group does not survive a member's death (the broadcast fails — gloo at once when the
peer's socket closes, otherwise at the op timeout). Every (re)start therefore forms a new group, an *epoch*
with its own store prefix: `rejoin()` (called by the runtime before it replaces a searcher) bumps the
`epoch` key; survivors see it between broadcasts (or after their failed one, up to the op timeout) and join
the new group with the new incarnation; once formed, the trainer broadcasts the newest weights to everyone.
Until then searchers keep generating with what they have, and the trainer keeps training. A failed broadcast
with no replacement within `timeout_s` (or a group that cannot form) raises SearcherError — never a hang.

Addresses: local runs bind the store and gloo to 127.0.0.1; on Ray the store listens on the driver's node
IP and each actor's gloo on its own node IP (NCCL picks its interfaces itself: NCCL_SOCKET_IFNAME). The
store and gloo have no authentication: keep them on a private network, like the Ray cluster itself.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import BroadcastOptions, PrefixStore, TCPStore

from tba.runtime.transport.layout import WeightLayout
from tba.runtime.worker import SearcherError

POLL_S = 0.02
"""How often an idle receiver checks the store for an announcement or a new epoch."""


def op_timeout_s(layout: WeightLayout) -> float:
    """Longest one broadcast may take: a minute, or the time at 100 MB/s for large models."""
    return max(60.0, layout.nbytes / 100e6)


def new_group(store, epoch: int, rank: int, world: int, backend: str, host: str, device: torch.device, *,
              wait_s: float, op_s: float, current=lambda: True):
    """Join epoch `epoch`'s group, or return None once `current()` turns false (a newer epoch began).

    Members first count themselves in on the store and wait (abortably) for all `world`; only then is the
    backend built, so nobody sits in its un-interruptible rendezvous waiting for a member that never comes.
    A 1-element broadcast follows, so that NCCL, which connects lazily, is connected before the first real one.
    """
    arrived, deadline = f"e{epoch}/arrived", time.monotonic() + wait_s
    n = store.add(arrived, 1)
    while n < world:
        if not current():
            return None
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n - 1} of {world - 1} searchers joined the weight group within {wait_s:.0f}s")
        time.sleep(POLL_S)
        n = store.add(arrived, 0)
    prefixed = PrefixStore(f"e{epoch}/group/", store)
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        opts = ProcessGroupGloo._Options()
        opts._devices = [ProcessGroupGloo.create_device(hostname=host)]
        opts._timeout = timedelta(seconds=op_s)
        pg = ProcessGroupGloo(prefixed, rank, world, opts)
    else:
        from torch.distributed import ProcessGroupNCCL

        opts = ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = timedelta(seconds=op_s)
        pg = ProcessGroupNCCL(prefixed, rank, world, opts)
    try:
        broadcast(pg, [torch.zeros(1, device=device)], op_s)
    except BaseException:
        drop_group(pg)
        raise
    return pg


def broadcast(pg, buffers: list[torch.Tensor], timeout_s: float, stream=None) -> None:
    """Broadcast `buffers` from rank 0; returns once they are complete on this rank (GPU included).

    Waits by polling `is_completed`, so a stuck NCCL collective cannot hang us past `timeout_s`."""
    opts = BroadcastOptions()
    opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, timedelta(seconds=timeout_s)
    deadline = time.monotonic() + timeout_s
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        works = [pg.broadcast([b], opts) for b in buffers]
        for w in works:
            while not w.is_completed():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"weight broadcast did not complete within {timeout_s:.0f}s")
                time.sleep(0.001)
            w.wait()  # raises the backend's error, if the broadcast failed
        if buffers and buffers[0].is_cuda:
            torch.cuda.current_stream(buffers[0].device).synchronize()


def drop_group(pg) -> None:
    """Leave a group for good: NCCL's communicators are aborted (frees a stuck collective); gloo just closes."""
    if pg is not None and type(pg).__name__ == "ProcessGroupNCCL":
        with contextlib.suppress(Exception):
            pg.abort()


@dataclass(frozen=True)
class BroadcastSpec:
    host: str
    port: int
    world: int
    layout: WeightLayout
    backend: str
    epoch: int
    timeout_s: float
    op_s: float

    def open(self, searcher: int, device: torch.device, host: str = "127.0.0.1") -> BroadcastReceiver:
        """Searcher `searcher`'s receiver (group rank searcher + 1); `host`: the address its gloo endpoint binds
        to (its own node's)."""
        if not 0 <= searcher < self.world - 1:
            raise ValueError(f"searcher {searcher} is not in a weight group of {self.world - 1} searchers")
        return BroadcastReceiver(self, searcher + 1, device, host)


class BroadcastSender:
    kind = "broadcast"

    def __init__(self, layout: WeightLayout, device: torch.device, *, num_searchers: int, host: str,
                 timeout_s: float, backend: str | None = None, op_s: float | None = None):
        """`backend` and `op_s` (longest broadcast) override the defaults (NCCL on GPUs, `op_timeout_s`): tests."""
        self.layout, self.device, self.host, self.timeout_s = layout, torch.device(device), host, timeout_s
        self.world = num_searchers + 1
        self.backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")  # gloo on GPUs: tests
        self.op_timeout_s = op_s or op_timeout_s(layout)
        listener = socket.create_server((host, 0), backlog=256)  # bound to `host` only (TCPStore's own binds all)
        self.port = listener.getsockname()[1]
        self.store = TCPStore(host, self.port, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s), master_listen_fd=listener.detach())
        self.buffers = layout.allocate(self.device)
        self._lock = threading.Lock()  # buffers, group and counters: publish vs. a new group's catch-up broadcast
        self._pg, self._epoch, self._seq, self._version = None, -1, 0, None
        self._error: str | None = None
        self._broken: tuple[float, str] | None = None  # (since, why): the last broadcast failed
        self._closed = False
        self.rejoin()

    def spec(self) -> BroadcastSpec:
        return BroadcastSpec(self.host, self.port, self.world, self.layout, self.backend, self._epoch, self.timeout_s,
                             self.op_timeout_s)

    def attach(self, rank: int) -> tuple:
        return ()

    def rejoin(self, rank: int | None = None) -> None:
        with self._lock:
            drop_group(self._pg)
            self._pg, self._seq, self._broken, self._error = None, 0, None, None
            self._epoch += 1
            self.store.set("epoch", str(self._epoch))
            epoch = self._epoch
        threading.Thread(target=self._connect, args=(epoch,), name=f"tba-weights-group-{epoch}", daemon=True).start()

    def _connect(self, epoch: int) -> None:
        """Background: form epoch's group (waits for every searcher to join), then send it the newest weights."""
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # the current device is per thread
            pg = new_group(self.store, epoch, 0, self.world, self.backend, self.host, self.device,
                           wait_s=self.timeout_s, op_s=self.op_timeout_s,
                           current=lambda: epoch == self._epoch and not self._closed)
        except Exception as e:
            with self._lock:
                if epoch == self._epoch and not self._closed:
                    self._error = f"the weight broadcast group (epoch {epoch}) did not form: {e}"
            return
        if pg is None:
            return
        with self._lock:
            if epoch != self._epoch or self._closed:
                drop_group(pg)  # superseded by a newer epoch while it formed
                return
            self._pg = pg
            if self._version is not None:
                self._broadcast()

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self.check()
        with self._lock:
            self.layout.pack(weights, self.buffers)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # a catch-up broadcast may run on another thread's stream
            self._version = version
            if self._pg is not None:
                self._broadcast()

    def _broadcast(self) -> None:
        """Announce and send the buffers, then wait for every searcher's acknowledgement that they are in its
        staging (lock held): after `publish` returns, each searcher's next batch uses them — which sync mode
        relies on. A failure leaves the group broken until `rejoin`."""
        key = f"e{self._epoch}/b{self._seq}"
        self.store.set(key, str(self._version))
        self._seq += 1
        try:
            broadcast(self._pg, self.buffers, self.op_timeout_s)
            deadline = time.monotonic() + self.op_timeout_s
            while self.store.add(f"{key}/ack", 0) < self.world - 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"searchers did not acknowledge a broadcast within {self.op_timeout_s:.0f}s")
                time.sleep(0.001)
        except Exception as e:
            drop_group(self._pg)
            self._pg, self._broken = None, (time.monotonic(), f"{type(e).__name__}: {e}")

    def check(self) -> None:
        if self._error:
            raise SearcherError(self._error)
        if self._broken and time.monotonic() - self._broken[0] > self.timeout_s:
            raise SearcherError(f"a weight broadcast failed ({self._broken[1]}) and no searcher was replaced "
                                f"within {self.timeout_s:.0f}s to re-form the group")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            drop_group(self._pg)
            self._pg, self.buffers = None, []
        self.store = None  # a group still forming keeps its own reference until its timeout


class BroadcastReceiver:
    """A searcher's end: a daemon thread joins every broadcast into staging; `poll` loads from it."""

    def __init__(self, spec: BroadcastSpec, rank: int, device: torch.device, host: str):
        self.spec, self.rank, self.device, self.host = spec, rank, torch.device(device), host
        self.op_s = spec.op_s
        self.store = TCPStore(spec.host, spec.port, is_master=False, timeout=timedelta(seconds=spec.timeout_s))
        self.staging = spec.layout.allocate(self.device)
        self.lock = threading.Lock()  # staging: the receiver writes it, the searcher's loop loads from it
        self.ready_version: int | None = None  # the version complete in staging, None while none is
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tba-weights-receiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # the current device is per thread
            epoch = self.spec.epoch
            while not self._stop.is_set():
                pg = new_group(self.store, epoch, self.rank, self.spec.world, self.spec.backend, self.host,
                               self.device, wait_s=self.spec.timeout_s, op_s=self.op_s,
                               current=lambda e=epoch: not self._stop.is_set() and self._epoch() == e)
                if pg is None:  # the trainer moved on to a newer group before this one formed
                    epoch = self._epoch()
                    continue
                try:
                    epoch = self._serve(pg, epoch)
                finally:
                    drop_group(pg)
        except BaseException:
            if not self._stop.is_set():
                self.error = traceback.format_exc()

    def _epoch(self) -> int:
        return int(self.store.get("epoch"))

    def _serve(self, pg, epoch: int) -> int:
        """Join each broadcast of `epoch` in turn; returns the epoch to join next."""
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        seq = 0
        while not self._stop.is_set():
            key = f"e{epoch}/b{seq}"
            if not self.store.check([key]):
                if (newest := self._epoch()) != epoch:
                    return newest
                time.sleep(POLL_S)
                continue
            version = int(self.store.get(key))
            with self.lock:
                self.ready_version = None  # staging is being overwritten
                try:
                    broadcast(pg, self.staging, self.op_s, stream)
                except Exception:
                    return self._next_epoch(epoch)
                self.ready_version = version
            self.store.add(f"{key}/ack", 1)  # staging is complete and unlocked: the loop's next poll loads it
            seq += 1
        return epoch

    def _next_epoch(self, epoch: int) -> int:
        """The group broke (a member died): wait for the trainer to start the next one."""
        deadline = time.monotonic() + self.spec.timeout_s
        while not self._stop.is_set():
            if (newest := self._epoch()) != epoch:
                return newest
            if time.monotonic() > deadline:
                raise RuntimeError(f"weight broadcast (epoch {epoch}) failed and the trainer formed no new group "
                                   f"within {self.spec.timeout_s:.0f}s")
            time.sleep(POLL_S)
        return epoch

    def _check(self) -> None:
        if self.error:
            raise RuntimeError(f"the weight receiver thread failed:\n{self.error}")

    def load_initial(self, searcher) -> None:
        deadline = time.monotonic() + self.spec.timeout_s
        while True:
            self._check()
            with self.lock:
                if self.ready_version is not None:
                    self._load(searcher, self.ready_version)
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no weights arrived by broadcast within {self.spec.timeout_s:.0f}s")
            time.sleep(POLL_S)

    def pending(self, searcher) -> bool:
        self._check()
        return self.ready_version is not None and self.ready_version > searcher.version

    def poll(self, searcher) -> float:
        self._check()
        v = self.ready_version
        if v is None or v <= searcher.version or not self.lock.acquire(blocking=False):
            return 0.0  # nothing newer, or a broadcast is filling staging: the next batch boundary
        t0 = time.perf_counter()
        try:
            if self.ready_version is not None and self.ready_version > searcher.version:
                self._load(searcher, self.ready_version)
        finally:
            self.lock.release()
        return time.perf_counter() - t0

    def _load(self, searcher, version: int) -> None:
        """Lock held: the copies out of staging must be complete before the receiver may overwrite it."""
        searcher.load_weights(self.spec.layout.views(self.staging), version)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
