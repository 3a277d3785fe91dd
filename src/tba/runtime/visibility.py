"""Which GPUs a searcher process sees under runtime=local, and the rules that placement must meet.

search.device names GPUs in the trainer's own numbering (through its CUDA_VISIBLE_DEVICES, if it has one); a
searcher's process is started with CUDA_VISIBLE_DEVICES naming only its own GPU — or, for a vLLM engine of
tensor-parallel size k, its k GPUs (`cuda:2+cuda:3`, tba.run.searchers.searcher_placements) — so inside it is
`cuda:0` (`cuda:0..k-1`). vLLM puts its engine on the first visible GPU, so only this lets it run on any other GPU;
and the weight transports match it: `shared` uses host memory unless every searcher is on the trainer's GPU
(tba.runtime.transport.in_host_memory), and NCCL's transports (broadcast, vllm) need every rank on a GPU of its own.
"""

from __future__ import annotations

import torch

from tba.models import resolve_device
from tba.runtime.searcher_spec import SearcherSpec
from tba.runtime.worker import SearcherError


def searcher_gpus(device: str) -> list[int]:
    """The GPUs (this process's numbering) of a searcher's device: [] for a CPU; `cuda:2+cuda:3` (a tensor-parallel
    engine's, tba.run.searchers.searcher_placements) names two; a bare `cuda` or `auto` is the current GPU."""
    gpus = []
    for part in device.split("+"):
        d = resolve_device(part) if part in ("cuda", "auto") else torch.device(part)
        if d.type == "cuda":
            gpus.append(d.index if d.index is not None else torch.cuda.current_device())
    return gpus


def child_devices(device: str, visible: str | None) -> tuple[dict[str, str], str]:
    """(CUDA_VISIBLE_DEVICES for the process of a searcher on `device`, and its device inside): a GPU searcher sees
    only its GPU(s) — named through this process's own CUDA_VISIBLE_DEVICES (`visible`) when it has one — and is
    cuda:0 there (a tensor-parallel engine: cuda:0..k-1); a CPU searcher changes nothing."""
    gpus = searcher_gpus(device)
    if not gpus:
        return {}, device
    ids = visible.split(",") if visible else None
    if ids is not None and max(gpus) >= len(ids):
        raise SearcherError(f"searcher device {device}: this process sees {len(ids)} GPU(s) "
                            f"(CUDA_VISIBLE_DEVICES={visible})")
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids[i] if ids else str(i) for i in gpus)}, "cuda:0"


def vllm_engine(spec: SearcherSpec) -> bool:
    """A vLLM engine of full weights (the sampler merges LoRA adapters itself: not one vLLM's transfer can feed)."""
    return spec.sampler.target == "tba.rollout.samplers.vllm:build" and spec.sampler.lora is None


def check_vllm_members(specs: list[SearcherSpec], members: list[int]) -> None:
    """search.weight_transport=vllm feeds vLLM engines only: every searcher that loads the trainer's weights is one."""
    others = [s.rank for s, m in zip(specs, members, strict=True) if s.synced and not m]
    if others:
        raise SearcherError(f"search.weight_transport=vllm: searcher(s) {others} load the trainer's weights but are "
                            "not vLLM engines of full weights (search.backend, model.lora); use weight_transport=auto")


def check_distinct_gpus(gpus: list[list[int]], trainer: torch.device, members: list[int] | None = None) -> None:
    """NCCL cannot put two ranks on one GPU: a broadcast (or vLLM's transfer) needs the trainer and each member
    searcher's GPU(s) all distinct. `members`: which searchers join (None: all)."""
    taken = {trainer.index: "the trainer"}
    for rank, own in enumerate(gpus):
        if members is not None and not members[rank]:
            continue
        for gpu in own or [None]:
            if gpu is None or gpu in taken:
                where = "the CPU" if gpu is None else f"cuda:{gpu}, which {taken[gpu]} uses"
                raise SearcherError(f"search.weight_transport over NCCL (broadcast, vllm) needs every searcher on GPUs "
                                    f"of its own, apart from the trainer's ({trainer}); searcher {rank} is on {where} "
                                    "(search.device). Use weight_transport=shared, or give searchers their own GPUs")
            taken[gpu] = f"searcher {rank}"
