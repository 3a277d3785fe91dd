"""Where each searcher runs and with which settings, from the config: the searcher groups (search.groups, or one
group of search.num_searchers) and each searcher's placement — its rank, its shard of the prompts within its group,
its device and its group's settings. tba.run.searchers builds their specs from these and tba.run.plan plans their
memory from the same list, so the plan and the run cannot disagree on where a searcher is.
"""

from __future__ import annotations

import dataclasses

from tba.config import RunConfig
from tba.config.schema import SearchConfig, SearcherGroup


def searcher_groups(cfg: RunConfig) -> list[SearcherGroup]:
    """search.groups, or the one group "policy" of search.num_searchers searchers with `search`'s settings."""
    return cfg.search.groups or [SearcherGroup("policy", cfg.search.num_searchers)]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one searcher runs and with which settings: what its spec is made from (and what tba.run.plan plans)."""

    rank: int
    """Its rank over the run (group after group)."""
    shard: int
    """Its shard of the train prompts within its group."""
    group: SearcherGroup
    search: SearchConfig
    """`search` with the group's settings filled in (null ones are `search`'s)."""
    device: str


def searcher_placements(cfg: RunConfig) -> list[Placement]:
    """Every searcher, group after group: its device is item rank of search.device (or item shard of its group's
    device list), cyclically — a vLLM engine of search.vllm.tensor_parallel_size k takes k consecutive items from
    item k·rank (k·shard), joined by `+` (`cuda:2+cuda:3`) — and its settings are its group's, `search`'s where the
    group leaves them null."""
    s, placements = cfg.search, []
    for g in searcher_groups(cfg):
        search = dataclasses.replace(s, temperature=g.temperature or s.temperature, groups=None,
                                     top_p=s.top_p if g.top_p is None else g.top_p, backend=g.backend or s.backend,
                                     quantize=g.quantize or s.quantize)
        devices = [d.strip() for d in (g.device or s.device or cfg.model.device).split(",")]
        k = s.vllm.tensor_parallel_size if search.backend == "vllm" else 1
        for shard in range(g.num_searchers):
            rank = len(placements)
            first = k * (shard if g.device else rank)
            device = "+".join(devices[(first + j) % len(devices)] for j in range(k))
            placements.append(Placement(rank, shard, g, search, device))
    return placements


def searcher_dtype(cfg: RunConfig, device: str) -> str:
    """search.dtype, or by default: the trainer's compute dtype for a searcher on a GPU (what a sharded trainer
    computes in: trainer.fsdp.param_dtype), model.dtype otherwise — on a CPU, and beside a one-process trainer, whose
    model.autocast the searchers apply themselves (the master weights' dtype: today's behaviour)."""
    if cfg.search.dtype:
        return cfg.search.dtype
    kind = device.strip().split(":")[0]
    if kind == "auto":
        import torch

        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and cfg.trainer.world_size > 1 and cfg.trainer.fsdp.param_dtype:
        return cfg.trainer.fsdp.param_dtype
    return cfg.model.dtype


def publish_dtype(cfg: RunConfig) -> str:
    """The dtype a sharded trainer publishes in: the first GPU searcher's, else the first searcher's (a searcher of
    another dtype casts as it loads); the compute dtype when there are none."""
    placements = searcher_placements(cfg)
    if placements:
        gpu = next((p for p in placements if not p.device.strip().startswith("cpu")), placements[0])
        return searcher_dtype(cfg, gpu.device)
    return (cfg.trainer.fsdp.param_dtype if cfg.trainer.world_size > 1 else None) or cfg.model.dtype
