"""The `vllm` weight transport: vLLM's own NCCL weight transfer, from the trainer's GPU straight into every searcher's
engine — into each of its workers, one per GPU of a tensor-parallel engine — with no copy in the searcher between.

Data plane (vLLM's, `vllm.distributed.weight_transfer`, pinned in pyproject's `vllm` extra): on the trainer's side
vLLM's `NCCLTrainerWeightTransferEngine` over a source of this publish's tensors, packed into `bucket_bytes` buffers;
in each engine vLLM's `NCCLWeightTransferEngine` (the sampler builds its `LLM` with `weight_transfer_config`), which
loads what arrives through vLLM's layerwise reload. One NCCL group per epoch: the trainer is rank 0, then every
synced searcher's workers in rank order (searcher i's first rank is 1 + the tensor-parallel sizes before it).

Control plane (tba's, a TCPStore of the trainer's, like the broadcast transport's): vLLM's trainer engine drives the
inference side through a client (init, start, update, finish); here that client posts each step on the store and
waits until every searcher has done it. An engine is not thread-safe, so each searcher does its part on its own
thread at its load points — between batches, every decode step under in-flight updates, and while idle:

    trainer publish(v)                              store                  searcher r, at a load point
      host copy ← weights (kept for catch-ups)
      e{E}/a{n} = v  ─────────────────────────────▶ announced ──────────▶ arrived += 1, waits for go (or x: skipped)
      all arrived → client.start: go ─────────────────────────────────▶ start_weight_update; started += 1
      client.update: u = vLLM's update info ──────────────────────────▶ update_weights(info)  ⇐═ NCCL broadcast
      client.finish: waits finished == S ◀────────────────────────────── finish_weight_update(v); searcher at v

So unlike `shared` and `broadcast`, which stage a copy for later, a publish waits for every searcher's next load
point (bounded by `timeout_s`; at once over when a searcher process dies): a decode step under continuous batching
with in-flight updates, up to a batch otherwise.

Epochs: a group forms once every member has checked in for the current epoch — the trainer posts vLLM's init info,
each searcher joins (`init_weight_transfer_engine`) at its next load point — and then gets the host copy (the catch-up:
the starting weights, published before any searcher exists, or the newest after a restart). `rejoin()` (before the
runtime replaces a searcher) and a failed send start a new epoch. Forming and sending happen only inside the
trainer's own calls (`publish`; `check`, which the runtime calls between updates), never in the background.

The sender takes named tensors or buckets of them; only the one-process trainer (trainer.world_size 1) drives it
today (the config refuses it beside ranks). vLLM is imported only when a sender or receiver is built.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import TCPStore

from tba.runtime.transport.layout import WeightLayout
from tba.runtime.worker import SearcherError

PACKED_BYTES = 256 * 2**20
"""vLLM's packed broadcast buffer (`packed_buffer_size_bytes`): each holds a little over this much (it is closed by
the tensor that passes it), `buffers` of them in flight on the trainer's GPU during a send, besides the tensors
being packed into the next, and as many on each worker's."""
POLL_S = 0.002


def group_ranks(members: list[int]) -> tuple[list[int | None], int]:
    """Each searcher's first rank in the NCCL group (None: not a member) and the group's size, from each searcher's
    tensor-parallel size (0: it does not load the trainer's weights). The trainer is rank 0."""
    offsets, next_rank = [], 1
    for tp in members:
        offsets.append(next_rank if tp else None)
        next_rank += tp
    return offsets, next_rank


def send_timeout_s(nbytes: int) -> float:
    """Longest one send may take once every searcher is in it: a minute, or the time at 1 GB/s for large models."""
    return max(60.0, nbytes / 1e9)


class _Source:
    """vLLM's `WeightSource` contract — `metadata()` agrees with iteration, name for name, in order — over the send in
    progress: one pass over the buckets `start` was given (tensors in the layout's order, which is the trainer's),
    each tensor also copied into the host copy as it goes by. Every name goes, tied ones too (as `load_weights`
    hands the engine a whole state dict): whether the engine's model ties them is its config's business."""

    def __init__(self, layout: WeightLayout, host: list[torch.Tensor] | None, device: torch.device):
        self.slots = list(layout.slots)
        self.names = {s.name for s in self.slots}
        self.host = layout.views(host) if host is not None else None
        self.device, self.items = device, iter(())

    def metadata(self):
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(s.name, s.dtype, s.shape) for s in self.slots]

    def start(self, buckets: Iterable[Mapping[str, torch.Tensor]]) -> None:
        self.items = (item for bucket in buckets for item in bucket.items())

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in self.items:
            if name in self.names:
                self.keep(name, t)
                yield name, t.to(self.device, non_blocking=True)

    def drain(self) -> None:
        """What a send did not reach (it failed, or never began) goes into the host copy all the same, so that the
        catch-up sends the version it is labelled with."""
        try:
            for name, t in self.items:
                if name in self.names:
                    self.keep(name, t)
        except ValueError:  # still being iterated by a send stuck in NCCL: that version is lost to the catch-up
            pass

    def keep(self, name: str, t: torch.Tensor) -> None:
        if self.host is not None and t is not self.host[name]:
            self.host[name].copy_(t)  # blocking: a bucket's tensors may be freed once the next is pulled

    def host_round(self) -> list[Mapping[str, torch.Tensor]]:
        return [{s.name: self.host[s.name] for s in self.slots}]


class _Client:
    """vLLM's `VLLMWeightSyncClient` for epoch `epoch`'s group: each call posts its step on the store and returns once
    every member has done it (or raises: a searcher's error, a dead searcher, a deadline)."""

    def __init__(self, sender: VLLMSender, epoch: int):
        self.sender, self.prefix, self.key = sender, f"e{epoch}", None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.sender.store.set(f"{self.prefix}/init", json.dumps(init_info))
        self.sender.wait_all(f"{self.prefix}/joined", self.sender.timeout_s, "join the weight group")

    def start_weight_update(self) -> None:
        self.sender.store.set(f"{self.key}/go", "1")
        self.sender.wait_all(f"{self.key}/started", self.sender.op_s, "start the update")

    def update_weights(self, update_info: dict) -> None:
        self.sender.store.set(f"{self.key}/u", json.dumps(update_info))
        self.sender.wait_all(f"{self.key}/updated", self.sender.op_s, "receive the weights")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.sender.wait_all(f"{self.key}/finished", self.sender.op_s, "finish the update")


@dataclass(frozen=True)
class VLLMSpec:
    host: str
    port: int
    offsets: tuple[int | None, ...]
    timeout_s: float

    def open(self, searcher: int, device: torch.device, host: str | None = None) -> VLLMReceiver:
        return VLLMReceiver(self, searcher)


class VLLMSender:
    kind = "vllm"

    def __init__(self, layout: WeightLayout, device: torch.device, *, members: list[int], host: str, timeout_s: float,
                 alive: Callable[[], bool] = lambda: True, buffers: int = 2, bucket_bytes: int = PACKED_BYTES,
                 host_copy: bool = True):
        """`members`: each searcher's tensor-parallel size, 0 for one that does not load the trainer's weights;
        `alive`: False once a searcher process has died (a wait for it ends early); `buffers`: vLLM's packed
        buffers in flight (1 in a sharded trainer's rank 0); `host_copy`: keep the newest weights in host memory
        for catch-ups (without it a new group waits for the next publish). `device`: where the weights are (vLLM's
        NCCL needs a GPU; tests on a CPU replace its communicator)."""
        self.layout, self.device, self.host, self.timeout_s, self.alive = layout, device, host, timeout_s, alive
        self.offsets, self.world = group_ranks(members)
        self.size = sum(1 for m in members if m)
        self.op_s = send_timeout_s(layout.nbytes)
        self.buffers, self.bucket_bytes = buffers, bucket_bytes
        listener = socket.create_server((host, 0), backlog=256)
        self.port = listener.getsockname()[1]
        self.store = TCPStore(host, self.port, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s), master_listen_fd=listener.detach())
        pinned = torch.cuda.is_available()
        copy = [torch.empty(n, dtype=d, pin_memory=pinned) for d, n in zip(layout.dtypes, layout.sizes, strict=True)]
        self.source = _Source(layout, copy if host_copy else None, device)
        self.engine, self.epoch, self.seq, self.version = None, -1, 0, None
        self.broken: tuple[float, str] | None = None
        self.rejoin()

    def spec(self) -> VLLMSpec:
        return VLLMSpec(self.host, self.port, tuple(self.offsets), self.timeout_s)

    def attach(self, rank: int) -> tuple:
        return ()

    def rejoin(self, rank: int | None = None) -> None:
        """A new epoch: the current group (if any) is left, and the next forms once every member checks in."""
        if self.engine is not None:
            self.engine.shutdown()  # vLLM aborts its communicator
        self.engine, self.seq = None, 0
        self.epoch += 1
        self.store.set("epoch", str(self.epoch))

    def publish(self, weights: Mapping[str, torch.Tensor] | Iterable[Mapping[str, torch.Tensor]], version: int) -> None:
        """Send `weights` (one mapping, or buckets of one: each bucket's tensors complete before it is handed over)
        to every member now, as version `version`; without a group yet, keep them for its catch-up."""
        self.check()
        buckets = [weights] if isinstance(weights, Mapping) else weights
        self.version = version
        if self.engine is None:
            self._keep(buckets)
            self.check()
            return
        self._send(buckets)
        self.source.start(())

    def check(self) -> None:
        """Raise SearcherError if weights can no longer be delivered; form the group (and catch it up) once every
        member of the epoch has checked in."""
        if self.broken and time.monotonic() - self.broken[0] > self.timeout_s:
            raise SearcherError(f"vLLM weight transfer failed ({self.broken[1]}) and no group re-formed within "
                                f"{self.timeout_s:.0f}s")
        if self.engine is None and self.size and self.store.add(f"e{self.epoch}/here", 0) >= self.size:
            self._form()
            if self.engine is not None and self.version is not None and self.source.host is not None:
                self._send(self.source.host_round())

    def _keep(self, buckets) -> None:
        self.source.start(buckets)
        self.source.drain()

    def _form(self) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        with socket.create_server((self.host, 0)) as probe:  # a free port for vLLM's own rendezvous store
            port = probe.getsockname()[1]
        info = NCCLTrainerInitInfo(
            master_address=self.host, master_port=port, world_size=self.world, rank=0, packed=True,
            packed_buffer_size_bytes=self.bucket_bytes, packed_num_buffers=self.buffers)
        client = _Client(self, self.epoch)
        try:
            self.engine = self._bounded(lambda: WeightTransferTrainerFactory.trainer_init(
                info, client=client, source=self.source), self.timeout_s, "form the weight group")
            self.client, self.broken = client, None
        except Exception as e:
            self._failed(e)

    def _send(self, buckets) -> None:
        key = self.client.key = f"e{self.epoch}/a{self.seq}"
        self.seq += 1
        self.store.set(key, str(self.version))
        self.source.start(buckets)
        if self.device.type == "cuda":  # vLLM packs on streams of its own: the trainer's last update must be done
            torch.cuda.synchronize(self.device)
        try:
            self.wait_all(f"{key}/arrived", self.timeout_s, "reach a load point")
        except Exception as e:
            self.store.set(f"{key}/x", "1")  # those waiting go on with the weights they have
            self._failed(e)
            return
        try:
            self._bounded(self.engine.send_weights, self.op_s, "receive the weights")
        except Exception as e:
            self._failed(e)

    def _failed(self, e: Exception) -> None:
        """The group is unusable: start a new epoch (the catch-up follows once it forms); past `timeout_s` without
        one, `check` raises."""
        why = f"{type(e).__name__}: {e}"
        self.broken = self.broken or (time.monotonic(), why)
        self.rejoin()  # first: aborting the communicator frees a send stuck in NCCL
        self.source.drain()

    def _bounded(self, fn, timeout_s: float, what: str):
        """Run `fn` (a rendezvous or a send, in which NCCL may block for good) on a thread of its own, with this
        sender's device current; past `timeout_s` the caller's `_failed` aborts the communicator."""
        out: dict = {}

        def run():
            try:
                if self.device.type == "cuda":
                    torch.cuda.set_device(self.device)
                out["value"] = fn()
            except BaseException as e:  # noqa: BLE001 — re-raised on the caller's thread
                out["error"] = e

        thread = threading.Thread(target=run, name="tba-vllm-weights", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"searchers did not {what} within {timeout_s:.0f}s")
        if "error" in out:
            raise out["error"]
        return out.get("value")

    def wait_all(self, counter: str, timeout_s: float, what: str) -> None:
        """Until every member has added itself to `counter`; raises on a searcher's error, a dead searcher or the
        deadline."""
        deadline = time.monotonic() + timeout_s
        while self.store.add(counter, 0) < self.size:
            if self.store.check([error := f"e{self.epoch}/error"]):
                raise SearcherError(f"a searcher failed in the weight transfer:\n{self.store.get(error).decode()}")
            if not self.alive():
                raise SearcherError(f"a searcher died before it could {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.store.add(counter, 0)} of {self.size} searchers did {what} within "
                                   f"{timeout_s:.0f}s")
            time.sleep(POLL_S)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        self.engine, self.source = None, None
        self.store = None


class VLLMReceiver:
    """A searcher's end: at each load point (`poll`, `load_initial`) it checks in for a new epoch, joins a group whose
    init was posted, and takes part in every announced send, calling the sampler's engine (weight_group,
    start_update, update, finish_update)."""

    def __init__(self, spec: VLLMSpec, rank: int):
        self.spec, self.offset = spec, spec.offsets[rank]
        self.store = TCPStore(spec.host, spec.port, is_master=False, timeout=timedelta(seconds=spec.timeout_s))
        self.epoch, self.joined, self.seq, self.received = -1, False, 0, False

    def load_initial(self, searcher) -> None:
        """Check in, join the group and take its first send. The trainer forms the group inside its own calls only,
        the first of which may come after its first evaluation: the wait for it lasts as long as the trainer does
        (this process ends with it: tba.runtime.lifetime); from the join on, every wait has `timeout_s`."""
        if self.offset is None:
            return
        deadline = None
        while not self.received:
            self._serve(searcher, block=True)
            if self.joined and deadline is None:
                deadline = time.monotonic() + self.spec.timeout_s
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"no weights arrived through vLLM's weight transfer within "
                                   f"{self.spec.timeout_s:.0f}s of joining its group")
            time.sleep(POLL_S)

    def pending(self, searcher) -> bool:
        if self.offset is None:
            return False
        epoch = int(self.store.get("epoch"))
        if epoch != self.epoch:
            return True
        if not self.joined:
            return self.store.check([f"e{epoch}/init"])
        return self.store.check([f"e{epoch}/a{self.seq}"])

    def poll(self, searcher) -> float:
        if not self.pending(searcher):
            return 0.0
        t0 = time.perf_counter()
        self._serve(searcher, block=False)
        return time.perf_counter() - t0

    def _serve(self, searcher, block: bool) -> None:
        epoch = int(self.store.get("epoch"))
        try:
            if epoch != self.epoch:
                self.epoch, self.joined, self.seq = epoch, False, 0
                self.store.add(f"e{epoch}/here", 1)
            if not self.joined:
                if (init := self._wait(f"e{epoch}/init", epoch, block, forever=True)) is None:
                    return
                searcher.sampler.weight_group({**json.loads(init), "rank_offset": self.offset})
                self.joined = True
                self.store.add(f"e{epoch}/joined", 1)
            while self.store.check([f"e{epoch}/a{self.seq}"]):
                self._receive(searcher, f"e{epoch}/a{self.seq}", epoch)
                self.seq += 1
        except Exception:
            self.store.set(f"e{epoch}/error", traceback.format_exc()[-4000:])
            raise

    def _receive(self, searcher, key: str, epoch: int) -> None:
        version = int(self.store.get(key))
        self.store.add(f"{key}/arrived", 1)
        if self._wait(f"{key}/go", epoch, True, abort=f"{key}/x") is None:
            return  # the trainer gave up on this send (a searcher did not come), or a new epoch began
        searcher.sampler.start_update()
        self.store.add(f"{key}/started", 1)
        if (info := self._wait(f"{key}/u", epoch, True)) is None:
            raise RuntimeError("the trainer started a weight update and never sent it")
        searcher.sampler.update(json.loads(info))
        self.store.add(f"{key}/updated", 1)
        searcher.sampler.finish_update(version)
        searcher.loaded(version)
        self.received = True
        self.store.add(f"{key}/finished", 1)

    def _wait(self, key: str, epoch: int, block: bool, abort: str | None = None, forever=False) -> bytes | None:
        """`key`'s value once set; None at once if not `block`, or once `abort` is set or a newer epoch begins.
        Past the spec's `timeout_s` it raises, unless `forever` (the group's init: as long as the trainer lives)."""
        deadline = None if forever else time.monotonic() + self.spec.timeout_s
        while not self.store.check([key]):
            if not block or (abort and self.store.check([abort])) or int(self.store.get("epoch")) != epoch:
                return None
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"the trainer's weight transfer stalled: {key} not set within "
                                   f"{self.spec.timeout_s:.0f}s")
            time.sleep(POLL_S)
        return self.store.get(key)

    def close(self) -> None:
        self.store = None
