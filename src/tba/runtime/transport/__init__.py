"""Weight transports: how the trainer's published weights reach searchers in other processes.

Both ends agree on a `WeightLayout`, computed once from the trainer's synced tensors (`tba.models.
synced_tensors`): every tensor's name, shape and dtype, packed into one flat buffer per dtype, so a bf16 model
travels as bf16 (no fp32 up-cast) in as few pieces as it has dtypes, tied weights once, and the receiving end
rebuilds named views without having a model. A searcher loads weights only through
`Searcher.load_weights(named tensors, version)`, whatever the transport — the vLLM sampler needs the names.

Trainer side, a `WeightSender`: `publish` copies the trainer's tensors into its own buffers before it returns
(`Trainer.weights()` hands out the live tensors), `spec()` is the picklable handle a searcher process (or Ray
actor) opens as a `WeightReceiver`, and `rejoin(rank)` is called before a failed searcher is replaced. Searcher
side, a `WeightReceiver`: `load_initial` before the searcher reports ready, `poll` at every batch boundary
(returns the seconds spent loading: `sync/searcher_load_s`).

Transports: `shared` (here; the local runtime's default), `broadcast` (tba.runtime.transport.broadcast: a
torch.distributed group), `object_store` (tba.runtime.transport.object_store: Ray's object store, the weights riding
on the driver's calls, which is what the sender's `attach` is for), and `vllm` (tba.runtime.transport.vllm: vLLM's
NCCL weight transfer straight into the searchers' engines).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from tba.runtime import TRANSPORTS
from tba.runtime.transport.broadcast import BroadcastSender
from tba.runtime.transport.layout import WeightLayout
from tba.runtime.transport.object_store import ObjectStoreSender
from tba.runtime.worker import SearcherError

LOCK_TIMEOUT_S = 60.0
"""Longest wait for the shared buffers' lock, held by either side only for one memory copy: past it, the
holder died inside the copy (kill -9 at that instant), and the run stops with SearcherError instead of hanging."""


class WeightReceiver(Protocol):
    def load_initial(self, searcher) -> None:
        """Load the newest published weights now (before the searcher reports ready), waiting if needed."""

    def poll(self, searcher) -> float:
        """Load newer weights if there are any; returns the seconds spent (0.0 if nothing was loaded)."""

    def pending(self, searcher) -> bool:
        """Newer weights than the searcher's are ready to load (a between-batches update under continuous
        batching then lets the rows in flight end first)."""

    def close(self) -> None:
        """Stop background work (threads, group membership)."""


class WeightSender(Protocol):
    kind: str

    def spec(self):
        """A picklable handle that searcher i's process turns into its receiver: `spec().open(i, device, host)`,
        `device` the searcher's and `host` the address of its node (for transports that listen)."""

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Copy `weights` out of the trainer's tensors and make them the newest version for every searcher."""

    def attach(self, rank: int) -> tuple:
        """Arguments for the next call to searcher `rank`, for a transport whose weights ride on calls
        (object_store); () for the others."""

    def rejoin(self, rank: int) -> None:
        """Searcher `rank` is about to be replaced: make room for its new incarnation (call `spec()` afterwards)."""

    def check(self) -> None:
        """Raise SearcherError if weights can no longer be delivered."""

    def close(self) -> None:
        """Release buffers, threads and ports."""


def choose_transport(setting: str, runtime: str, device: torch.device, vllm_engines: bool = False) -> str:
    """`search.weight_transport`, with auto resolved: local → vllm when the trainer is on a GPU and `vllm_engines`
    (every synced searcher is a vLLM engine on GPUs other than the trainer's, full weights), else shared; ray → the
    object store for CPU weights, a broadcast (NCCL) when the trainer is on a GPU."""
    if setting not in ("auto", *TRANSPORTS):
        raise ValueError(f"unknown search.weight_transport {setting!r}")
    if setting != "auto":
        return setting
    if runtime == "local":
        return "vllm" if device.type == "cuda" and vllm_engines else "shared"
    return "broadcast" if device.type == "cuda" else "object_store"


def in_host_memory(trainer: torch.device, searchers: list[list[int]]) -> bool:
    """Where `shared` keeps its buffers: host shared memory unless the trainer is on a GPU and every searcher on that
    same GPU alone (`searchers`: each one's GPU indices, in the trainer's numbering; [] for a CPU searcher) — CUDA
    IPC then, no host copy. A searcher that cannot see the trainer's GPU (runtime=local shows each only its own)
    could not open an IPC handle of it, and a host copy serves every GPU alike."""
    return trainer.type != "cuda" or any(gpus != [trainer.index] for gpus in searchers)


@dataclass(frozen=True)
class CudaBuffer:
    """One CUDA buffer shared by IPC the way vLLM's ipc weight transfer ships them: torch's reduction of it and the
    UUID of its GPU, so that a process that numbers its GPUs differently (CUDA_VISIBLE_DEVICES) opens it on the
    same physical device."""

    uuid: str
    args: tuple
    """torch.multiprocessing.reductions.reduce_tensor(buffer)[1]: `rebuild_cuda_tensor`'s arguments (the 7th is
    the device index, which `open` replaces)."""

    @classmethod
    def of(cls, buffer: torch.Tensor) -> CudaBuffer:
        from torch.multiprocessing.reductions import reduce_tensor

        return cls(str(torch.cuda.get_device_properties(buffer.device).uuid), tuple(reduce_tensor(buffer)[1]))

    def open(self) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        args = list(self.args)
        args[6] = device_of_uuid(self.uuid)
        return rebuild_cuda_tensor(*args)


def device_of_uuid(uuid: str) -> int:
    """This process's index of the GPU with `uuid`."""
    seen = [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    if uuid not in seen:
        raise SearcherError(f"the trainer's weight buffers are on GPU {uuid}, which this searcher cannot see "
                            f"(it sees {seen}): use search.weight_transport=shared with the searcher on that GPU, "
                            "or leave it to auto")
    return seen.index(uuid)


def _sync(*devices: torch.device) -> None:
    for d in {d for d in devices if d.type == "cuda"}:
        torch.cuda.synchronize(d)


class SharedSender:
    """Trainer-owned flat buffers handed to spawned searcher processes: in host shared memory (the trainer on a CPU,
    or any searcher off the trainer's GPU: `in_host_memory`), or on the trainer's GPU, reaching the children as CUDA
    IPC handles (`CudaBuffer`; this process must outlive them, which it does). A version counter and a lock go with
    them; the lock covers one memory copy on either side.
    """

    kind = "shared"

    def __init__(self, layout: WeightLayout, device: torch.device, ctx, host: bool = True):
        self.layout, self.device = layout, torch.device("cpu") if host else torch.device(device)
        self.buffers = layout.allocate(self.device)
        if self.device.type == "cpu":
            self.buffers = [b.share_memory_() for b in self.buffers]
        self.version = ctx.Value("q", -1, lock=False)
        self.lock = ctx.Lock()

    def spec(self) -> SharedSpec:
        buffers = self.buffers if self.device.type == "cpu" else [CudaBuffer.of(b) for b in self.buffers]
        return SharedSpec(self.layout, buffers, self.version, self.lock)

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise SearcherError(f"the shared weight buffers stayed locked for {LOCK_TIMEOUT_S:.0f}s: a searcher "
                                "died while copying them; stopping the run")
        try:
            self.layout.pack(weights, self.buffers)
            # IPC memory has no cross-process stream order, and a copy from a GPU into host memory may still be in
            # flight: the copy is done before the bump
            _sync(self.device, *(t.device for t in weights.values()))
            self.version.value = version
        finally:
            self.lock.release()

    def attach(self, rank: int) -> tuple:
        return ()

    def rejoin(self, rank: int) -> None:
        pass  # a restarted process receives the same buffers

    def check(self) -> None:
        pass

    def close(self) -> None:
        self.buffers = []


@dataclass
class SharedSpec:
    """Travels to a spawned searcher process as a Process argument (shared-memory tensors, or `CudaBuffer`s)."""

    layout: WeightLayout
    buffers: list[torch.Tensor] | list[CudaBuffer]
    version: object
    lock: object

    def open(self, searcher: int, device: torch.device, host: str | None = None) -> SharedReceiver:
        return SharedReceiver(self, device)


class SharedReceiver:
    """Snapshot under the lock into a staging buffer on the searcher's device (device to device when the
    trainer's GPU is another one), then load outside it: the trainer never waits longer than one copy."""

    def __init__(self, spec: SharedSpec, device: torch.device):
        self.spec, self.device = spec, torch.device(device)
        self.buffers = [b.open() if isinstance(b, CudaBuffer) else b for b in spec.buffers]
        self.staging = spec.layout.allocate(self.device)

    def load_initial(self, searcher) -> None:
        self._load(searcher)

    def pending(self, searcher) -> bool:
        return self.spec.version.value > searcher.version

    def poll(self, searcher) -> float:
        if self.spec.version.value <= searcher.version:
            return 0.0
        t0 = time.perf_counter()
        self._load(searcher)
        return time.perf_counter() - t0

    def _load(self, searcher) -> None:
        if not self.spec.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise RuntimeError(f"the shared weight buffers stayed locked for {LOCK_TIMEOUT_S:.0f}s")
        try:
            version = self.spec.version.value
            for dst, src in zip(self.staging, self.buffers, strict=True):
                dst.copy_(src)
            _sync(self.device, *(b.device for b in self.buffers))
        finally:
            self.spec.lock.release()
        searcher.load_weights(self.spec.layout.views(self.staging), version)

    def close(self) -> None:
        self.staging, self.buffers = [], []


def make_sender(kind: str, weights: dict[str, torch.Tensor], *, num_searchers: int, timeout_s: float,
                host: str = "127.0.0.1", ctx=None, in_host: bool = True, members: list[int] | None = None,
                alive=lambda: True) -> WeightSender:
    """The trainer's end of transport `kind` (tba.runtime.TRANSPORTS), laid out after `weights` (which it does
    not copy: the runtime publishes the starting weights before it starts any searcher). `in_host`: where `shared`
    keeps its buffers (`in_host_memory`); `members` and `alive`: vllm's (tba.runtime.transport.vllm.VLLMSender)."""
    layout = WeightLayout.of(weights)
    device = next(iter(weights.values())).device
    if kind == "shared":
        return SharedSender(layout, device, ctx, host=in_host)
    if kind == "broadcast":
        return BroadcastSender(layout, device, num_searchers=num_searchers, host=host, timeout_s=timeout_s)
    if kind == "object_store":
        return ObjectStoreSender(num_searchers)
    if kind == "vllm":
        from tba.runtime.transport.vllm import VLLMSender

        if device.type != "cuda":
            raise SearcherError(f"search.weight_transport=vllm sends over NCCL from the trainer's GPU; the weights are "
                                f"on {device}: use weight_transport=shared")
        return VLLMSender(layout, device, members=members or [1] * num_searchers, host=host, timeout_s=timeout_s,
                          alive=alive)
    raise ValueError(f"unknown weight transport {kind!r}")
