"""FSDP2 for the trainer's policy: how it is sharded, how its weights are gathered (for the searchers, for an
evaluation, for a checkpoint), how its optimizer state is saved and loaded sharded. Every function here is
collective: all ranks call it, in the same order (tba.ranks.rank makes sure of that).

Sharding follows the model's own split: every module whose class the model lists in `_no_split_modules` (its
decoder layers, for every HF causal LM) is one FSDP unit, then the root (embeddings, final norm, head: tied
weights stay together in it). An explicit CPU or GPU mesh is always passed: on a machine with GPUs a gloo group
without one puts parameters on CUDA (pytorch #132471).

Gradients: each rank back-propagates its share of the batch with its loss multiplied by the world size, so FSDP's
averaging reduce-scatter yields the sum over ranks — the full-batch gradient of the single-process trainer.
(Setting the divide factor to 1 instead needs ReduceOp.PREMUL_SUM, which gloo does not have.)

Two kinds of whole tensors come out of the shards:
* `forward_buckets` — whole FSDP units (`unshard`: FSDP's own all-gather, one per unit), grouped into buckets of
  `publish_bucket_mb`, in the forward dtype (`fsdp.param_dtype`): what the trainer scores with, so what searchers and
  evaluation use. Every rank waits for a bucket's gathers, the caller takes its tensors, every rank frees them
  (`reshard`) before the next: no rank holds more than one bucket beyond its shard, and every gather of a bucket
  completes before its tensors leave (a transport's own group never interleaves with the trainer's: TRL #7103).
* `master_buckets` — the sharded master weights themselves (model.dtype, fp32), tensor by tensor (`full_tensor`),
  copied to host memory on rank 0 only: what a checkpoint's `model/` is written from, so a resume never rounds the
  masters to the forward dtype.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from tba.config.fsdp import FSDPConfig
from tba.models import DTYPES
from tba.models.recompute import decoder_layers

Bucket = dict[str, torch.Tensor]


def shard(model: torch.nn.Module, cfg: FSDPConfig, *, dtype: str, device: torch.device) -> torch.nn.Module:
    """Shard `model` in place over the default process group: each decoder layer, then the root. `dtype`: the
    master weights' (the forward runs in cfg.param_dtype, default the same). Activation checkpointing wraps each
    layer's forward, not the module (tba.models.recompute): the units and the names stay the model's own."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    param = DTYPES[cfg.param_dtype or dtype]
    policy = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=DTYPES[cfg.reduce_dtype])
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
    return model


def clean(name: str) -> str:
    """A parameter's name without activation checkpointing's wrapper, as an unwrapped model names it."""
    return name.replace("_checkpoint_wrapped_module.", "")


def _units(model: torch.nn.Module) -> list[tuple[str, FSDPModule]]:
    """(prefix, unit) of every FSDP unit, root first, in module order (the same on every rank)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def _own(unit: torch.nn.Module, prefix: str, wanted: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The unsharded parameters of `unit` (not those of units inside it, still DTensors) under their full names."""
    for name, p in unit.named_parameters(remove_duplicate=False):
        full = clean(f"{prefix}.{name}" if prefix else name)
        if not isinstance(p, DTensor) and full in wanted:
            yield full, p


def _bytes(unit: torch.nn.Module) -> int:
    """What unsharding `unit` gathers: its parameters less those of the units inside it (a decoder layer's live in
    its submodules, so `recurse=False` would count nothing and put every unit into one bucket)."""
    inner = {id(p) for m in unit.modules() if m is not unit and isinstance(m, FSDPModule) for p in m.parameters()}
    return sum(p.numel() * p.element_size() for p in unit.parameters() if id(p) not in inner)


def forward_buckets(model: torch.nn.Module, wanted: set[str], *, bucket_mb: float) -> Iterator[Bucket]:
    """The whole forward-dtype tensors of the parameters and buffers named in `wanted`, bucket by bucket, on every
    rank. A bucket's tensors are FSDP's unsharded parameters, valid only until the generator resumes (the caller
    copies what it keeps); buffers, and parameters FSDP left whole, come last as they are."""
    done, units, limit = set(), _units(model), bucket_mb * 2**20
    buckets, size = [[]], 0
    for prefix, unit in units:
        if buckets[-1] and size + _bytes(unit) > limit:
            buckets.append([])
            size = 0
        buckets[-1].append((prefix, unit))
        size += _bytes(unit)
    with torch.no_grad():
        for bucket in buckets:
            handles = [unit.unshard(async_op=True) for _, unit in bucket]
            for h in handles:
                if h is not None:
                    h.wait()
            try:
                out = {}
                for prefix, unit in bucket:
                    for name, p in _own(unit, prefix, wanted):
                        if name not in done:
                            out[name] = p
                            done.add(name)
                yield out
            finally:
                for _, unit in bucket:
                    unit.reshard()
        rest = {clean(k): v for k, v in model.state_dict().items() if clean(k) in wanted - done}
        yield {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in rest.items()}


def master_buckets(model: torch.nn.Module, *, bucket_mb: float, names: set[str] | None = None) -> Iterator[Bucket]:
    """The master weights (and persistent buffers) in host memory, tensor by tensor gathered from the shards
    (`full_tensor`, collective), grouped into buckets of about `bucket_mb`: rank 0 gets each bucket's CPU copies,
    the other ranks empty buckets. Tied tensors come once, under their first name (as save_pretrained writes them).
    `names`: only these (LoRA: the adapters). Buffers after the parameters, persistent ones only."""
    bucket, size, limit = {}, 0, bucket_mb * 2**20
    main = dist.get_rank() == 0
    persistent = set(model.state_dict())
    tensors = [*model.named_parameters(), *((k, b) for k, b in model.named_buffers() if k in persistent)]
    with torch.no_grad():
        for key, v in tensors:  # named_parameters yields a tied parameter once, under its first name
            name = clean(key)
            if names is not None and name not in names:
                continue
            full = v.full_tensor() if isinstance(v, DTensor) else v
            if main:
                bucket[name] = full.detach().to("cpu", copy=True)
                size += full.numel() * full.element_size()
            del full
            if size >= limit:
                yield bucket
                bucket, size = {}, 0
    yield bucket


def copy_local(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """target's shards ← source's, rank-locally (no communication): both sharded alike (the same architecture on the
    same mesh), e.g. TBA′'s reference reset to the policy."""
    with torch.no_grad():
        for (name, t), (_, s) in zip(target.state_dict().items(), source.state_dict().items(), strict=True):
            local_t = t.to_local() if isinstance(t, DTensor) else t
            local_s = s.to_local() if isinstance(s, DTensor) else s
            if local_t.shape != local_s.shape:
                raise ValueError(f"{name}: shards differ ({tuple(local_t.shape)} vs {tuple(local_s.shape)})")
            local_t.copy_(local_s)


def load_full(model: torch.nn.Module, state: dict[str, torch.Tensor] | None) -> None:
    """Every rank's shards from rank 0's full `state` (None on the other ranks), broadcast by rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state or {}, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def kept_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The values of `model`'s buffers that its construction computed (a skeleton's parameters are on the meta
    device, its buffers are not: the rotary frequencies), kept across `to_empty`."""
    return {clean(k): b.detach().clone() for k, b in model.named_buffers() if not b.is_meta}


def readable(model: torch.nn.Module, files: dict | None, buffers: dict[str, torch.Tensor]) -> bool:
    """Whether every rank can fill `model` from the safetensors `files` (tba.models.sources.safetensors_index)
    alone: each parameter under one of its (tied) names and each persistent buffer in them, every other buffer's
    value kept. Agreed over the ranks (collective): one rank that cannot read them makes all receive from rank 0."""
    ok = files is not None
    if ok:
        tied: dict[int, list[str]] = {}
        for key, p in model.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), []).append(clean(key))
        persistent = {clean(k) for k in model.state_dict()}
        ok = (all(any(k in files for k in keys) for keys in tied.values())
              and all((name in files) if name in persistent else (name in buffers)
                      for name in map(clean, dict(model.named_buffers()))))
    flag = torch.tensor([int(ok)], device=_mesh_device(model))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def load_own_shards(model: torch.nn.Module, files: dict, buffers: dict[str, torch.Tensor]) -> None:
    """Each rank fills its own shards from the safetensors `files`, one tensor at a time, reading only its own rows:
    its chunk along dim 0 as FSDP2 shards (torch.chunk's split), sliced out of the file (safetensors' get_slice), so
    no process reads or holds the whole model and nothing is sent (rank-local). Each file is opened per tensor: its
    mapped pages leave with it. Persistent buffers come from the files, the others from `buffers` (kept_buffers).
    Tied parameters are filled once, from whichever name the files hold."""
    from safetensors import safe_open

    def read(name: str, p: torch.Tensor | None = None) -> torch.Tensor:
        with safe_open(str(files[name]), framework="pt") as f:
            if not isinstance(p, DTensor):
                return f.get_tensor(name)
            whole = f.get_slice(name)
            rows = whole.get_shape()[0]
            size = -(-rows // p.device_mesh.size())  # torch.chunk's chunk size
            first = min(p.device_mesh.get_local_rank() * size, rows)
            return whole[first:min(first + size, rows)]

    done = set()
    with torch.no_grad():
        for key, p in model.named_parameters(remove_duplicate=False):
            if id(p) in done or clean(key) not in files:
                continue
            done.add(id(p))
            mine, local = read(clean(key), p), p.to_local() if isinstance(p, DTensor) else p
            if mine.shape != local.shape:
                raise ValueError(f"{clean(key)}: this rank's shard is {tuple(local.shape)}, the file's chunk "
                                 f"{tuple(mine.shape)}")
            local.copy_(mine)
            del mine
        persistent = {clean(k) for k in model.state_dict()}
        for key, b in model.named_buffers():
            name = clean(key)
            b.copy_(read(name) if name in persistent else buffers[name])


def _mesh_device(model: torch.nn.Module) -> torch.device:
    p = next(model.parameters())
    return torch.device(p.device_mesh.device_type) if isinstance(p, DTensor) else p.device


def broadcast_buffers(model: torch.nn.Module, whole: torch.nn.Module | None) -> None:
    """Every buffer of the sharded `model` (FSDP leaves buffers whole; after `to_empty` they hold garbage, the
    rotary embeddings' non-persistent ones included) from rank 0's `whole` policy (None on the other ranks)."""
    if whole is not None:
        theirs = {clean(k): v for k, v in whole.named_buffers()}
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(theirs[clean(name)])
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


@functools.cache
def _libc():
    """The C library, loaded once (release_freed runs after every command)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def bounded_heap(threshold: int = 1 << 20) -> None:
    """Host allocations of `threshold` bytes or more mapped and unmapped on their own (glibc's mallopt
    M_MMAP_THRESHOLD, fixed; nothing elsewhere). A rank's gathered units, gradients and host copies come and go
    every update; from glibc's heap, what they free stays in the process, and its RSS grew over an update by about
    the model's size beyond what the rank holds (bench/results/sharded). GPU memory is torch's own allocator's."""
    try:
        _libc().mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except AttributeError:  # not glibc (macOS, musl)
        pass


def release_freed() -> None:
    """Hand the C heap's free memory back to the OS (glibc's malloc_trim; nothing elsewhere): what a command freed
    below bounded_heap's threshold."""
    try:
        _libc().malloc_trim(0)
    except AttributeError:  # not glibc
        pass


def grad_norm(model: torch.nn.Module) -> torch.Tensor:
    """The L2 norm of the whole (sharded) gradient, the same on every rank."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


# ---- the optimizer state, sharded (torch.distributed.checkpoint) -------------------------------------------------
def save_optimizer(model: torch.nn.Module, optimizer, path: Path, group=None) -> None:
    """Every rank writes its shard of the AdamW moments into directory `path` (DCP), coordinating over `group` (the
    checkpoints' own, with its own timeout): resharded when loaded at another world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(path), process_group=group)


def load_optimizer(model: torch.nn.Module, optimizer, path: Path, group=None) -> None:
    """The AdamW moments from a DCP directory written at any world size — this one's ranks, or one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is what it is for
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), process_group=group)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_full_optimizer(model: torch.nn.Module, optimizer, state: dict | None) -> None:
    """The AdamW moments of a single-process checkpoint (`state`: torch's own optimizer state dict, on rank 0;
    None elsewhere), keyed by parameter position, sharded out to every rank by rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    full = {}
    if state is not None:
        names = [clean(n) for n, p in model.named_parameters() if p.requires_grad]
        full = {"state": {names[i]: v for i, v in state["state"].items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


# ---- the process group ---------------------------------------------------------------------------------------
RENDEZVOUS_S = 300.0
"""Longest wait for every rank to reach the rendezvous: a rank's start (a process or Ray actor, imports ≈ 10 s, more
on a loaded machine) is not a collective, and bounding it by the collective timeout failed runs whose ranks
were merely slow to import."""


def backend(device: torch.device) -> str:
    return "gloo" if device.type == "cpu" else "nccl"


def join(rank: int, world: int, address: str, timeout_s: float, device: torch.device) -> None:
    """Join the trainer's default process group as `rank` on `device` (its device set first, and passed as
    `device_id`: NCCL binds the communicator to it instead of guessing from the rank); the rendezvous waits up to
    RENDEZVOUS_S for the other ranks to arrive, every collective afterwards has `timeout_s`."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    url = urlparse(address)
    store = dist.TCPStore(url.hostname, url.port, world, rank == 0, timeout=timedelta(seconds=max(RENDEZVOUS_S,
                                                                                                  timeout_s)))
    dist.init_process_group(backend(device), store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s), device_id=device if device.type == "cuda" else None)


def checkpoint_group(timeout_s: float):
    """A gloo group of every rank for checkpoint saves and loads, with a timeout of their own: DCP coordinates a save
    with a few collectives around each rank's own writes, and a slow shared filesystem must not trip the training
    collectives' limit."""
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def abort() -> None:
    """Abort the default process group: a collective blocked on a rank that died returns (NCCL) instead of holding
    this process until the watchdog's timeout."""
    with contextlib.suppress(Exception):
        dist.distributed_c10d._abort_process_group()


def leave() -> None:
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
