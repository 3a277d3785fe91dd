"""FSDP2 for the trainer's policy: how it is sharded, how its weights are gathered for the searchers, how its
optimizer state is saved and loaded sharded. Every function here is collective: all ranks call it, in the same
order (tba.runtime.ranks makes sure of that).

Sharding follows the model's own split: every module whose class the model lists in `_no_split_modules` (its
decoder layers, for every HF causal LM) is one FSDP unit, then the root (embeddings, final norm, head: tied
weights stay together in it). An explicit CPU or GPU mesh is always passed: on a machine with GPUs a gloo group
without one puts parameters on CUDA (pytorch #132471).

Gradients: each rank back-propagates its share of the batch with its loss multiplied by the world size, so FSDP's
averaging reduce-scatter yields the sum over ranks — the full-batch gradient of the single-process trainer.
(Setting the divide factor to 1 instead needs ReduceOp.PREMUL_SUM, which gloo does not have.)

Publication gathers whole FSDP units (`unshard`: FSDP's own all-gather, one per unit), grouped into buckets of
`publish_bucket_mb`: every rank waits for a bucket's gathers, rank 0 copies the tensors into its whole copy of the
policy, every rank frees them (`reshard`) before the next bucket. All gathers complete before rank 0 hands anything
to a transport, so a transport's own group (the broadcast transport's) never interleaves with the trainer's (TRL
#7103's deadlock).
The gathered tensors are the units' forward weights (fsdp.param_dtype): what the trainer scores is what the
searchers sample.
"""

from __future__ import annotations

import contextlib
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


def shard(model: torch.nn.Module, cfg: FSDPConfig, *, dtype: str, device: torch.device) -> torch.nn.Module:
    """Shard `model` in place over the default process group: each decoder layer, then the root."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    param = DTYPES[cfg.param_dtype or dtype]
    policy = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=DTYPES[cfg.reduce_dtype])
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
    return model


def _clean(name: str) -> str:
    """A parameter's name without activation checkpointing's wrapper, as the searchers' model names it."""
    return name.replace("_checkpoint_wrapped_module.", "")


def _units(model: torch.nn.Module) -> list[tuple[str, FSDPModule]]:
    """(prefix, unit) of every FSDP unit, root first, in module order (the same on every rank)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def _own(unit: torch.nn.Module, prefix: str, wanted: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The unsharded parameters of `unit` (not those of units inside it, still DTensors) under their full names."""
    for name, p in unit.named_parameters(remove_duplicate=False):
        full = _clean(f"{prefix}.{name}" if prefix else name)
        if not isinstance(p, DTensor) and full in wanted:
            yield full, p


def _bytes(unit: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in unit.parameters(recurse=False))


def gather(model: torch.nn.Module, into: dict[str, torch.Tensor] | None, *, bucket_mb: float) -> None:
    """Copy the full tensors of the parameters named in `into` (rank 0: the whole copy's own tensors, cast on copy;
    None on the other ranks, which only take part) from the shards, bucket by bucket: no rank holds more than one
    bucket of gathered weights beyond what it keeps. Buffers and parameters FSDP left whole are read as they are."""
    wanted, done = set(into or ()), set()
    units, limit = _units(model), bucket_mb * 2**20
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
                for prefix, unit in bucket:
                    for name, p in _own(unit, prefix, wanted):
                        if name not in done:
                            into[name].copy_(p)
                            done.add(name)
            finally:
                for _, unit in bucket:
                    unit.reshard()
        if into is not None:
            state = {_clean(k): v for k, v in model.state_dict().items()}
            for name in wanted - done:  # buffers (never sharded) and anything FSDP left whole
                v = state[name]
                into[name].copy_(v.full_tensor() if isinstance(v, DTensor) else v)


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict, gathered on every rank (TBA′'s reference reset: every rank keeps a full π_ref)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {_clean(k): v for k, v in state.items()}


def load_full(model: torch.nn.Module, state: dict[str, torch.Tensor] | None) -> None:
    """Every rank's shards from rank 0's full `state` (None on the other ranks), broadcast by rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state or {}, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def broadcast_buffers(model: torch.nn.Module, whole: torch.nn.Module | None) -> None:
    """Every buffer of the sharded `model` (FSDP leaves buffers whole; after `to_empty` they hold garbage, the
    rotary embeddings' non-persistent ones included) from rank 0's `whole` policy (None on the other ranks)."""
    if whole is not None:
        theirs = {_clean(k): v for k, v in whole.named_buffers()}
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(theirs[_clean(name)])
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def grad_norm(model: torch.nn.Module) -> torch.Tensor:
    """The L2 norm of the whole (sharded) gradient, the same on every rank."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


# ---- the optimizer state, sharded (torch.distributed.checkpoint) -------------------------------------------------
def save_optimizer(model: torch.nn.Module, optimizer, path: Path) -> None:
    """Every rank writes its shard of the AdamW moments into directory `path` (DCP): resharded when loaded at
    another world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(path))


def load_optimizer(model: torch.nn.Module, optimizer, path: Path) -> None:
    """The AdamW moments from a DCP directory written at any world size — this one's ranks, or one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is what it is for
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_full_optimizer(model: torch.nn.Module, optimizer, state: dict | None) -> None:
    """The AdamW moments of a single-process checkpoint (`state`: torch's own optimizer state dict, on rank 0;
    None elsewhere), keyed by parameter position, sharded out to every rank by rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    full = {}
    if state is not None:
        names = [_clean(n) for n, p in model.named_parameters() if p.requires_grad]
        full = {"state": {names[i]: v for i, v in state["state"].items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


RENDEZVOUS_S = 300.0
"""Longest wait for every rank to reach the rendezvous: a rank's start (a process or Ray actor, imports ≈ 10 s, more
on a loaded machine) is not a collective, and bounding it by the collective timeout failed runs whose ranks
were merely slow to import."""


def join(backend: str, rank: int, world: int, address: str, timeout_s: float) -> None:
    """Join the trainer's default process group as `rank`: the rendezvous waits up to RENDEZVOUS_S for the other
    ranks to arrive, every collective afterwards has `timeout_s`."""
    url = urlparse(address)
    store = dist.TCPStore(url.hostname, url.port, world, rank == 0, timeout=timedelta(seconds=max(RENDEZVOUS_S,
                                                                                                  timeout_s)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


@contextlib.contextmanager
def process_group(backend: str, rank: int, world: int, address: str, timeout_s: float):
    """The trainer's default process group for the duration of the block."""
    join(backend, rank, world, address, timeout_s)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
