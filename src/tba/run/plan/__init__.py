"""The memory plan of a run before it starts (`tba plan`, and the check `tba train` makes before loading anything):
per device, what the trainer's ranks, the controller, each searcher and the weight transport will hold, against what
the device has — on this machine, or on a target named by `tba plan --gpus 8xH100` (tba.run.plan.machine).

Everything is computed from the config and the model's shape on torch's meta device (tba.models.shape; common
models' published configs are built in, tba.models.published): no weight is read and nothing is downloaded, so
the plan costs the imports and a second. The terms and their reasons: tba.run.plan.terms, .trainer, .searchers;
when a layout does not fit, the smallest change that does: tba.run.plan.fix.
"""

from __future__ import annotations

import logging
import math

from tba.config import RunConfig
from tba.models.shape import model_shape
from tba.run.plan.ledger import GB, GPU_HEADROOM, DevicePlan, Plan, PlanError, Term, gb
from tba.run.plan.machine import Capacity, Machine, local_machine, machine_capacity, target_machine
from tba.run.plan.searchers import placed, searcher_occupants
from tba.run.plan.terms import prompt_tokens, published_dtype
from tba.run.plan.trainer import rank_devices, trainer_occupants

__all__ = ["GB", "GPU_HEADROOM", "Machine", "Plan", "PlanError", "gb", "local_machine", "machine_capacity",
           "make_plan", "prompt_tokens", "target_machine", "vllm_memory_utilization", "vllm_shares"]

logger = logging.getLogger(__name__)


def _engines(device: DevicePlan, shares: dict[int, float | None]) -> None:
    """Give each vLLM engine on `device` its share: search.vllm.gpu_memory_utilization where set, else an equal part
    of what the device's other occupants leave of its usable memory (rounded down to a hundredth), and add the
    engine's term — at least its weights and one batch's KV cache, else the device is refused."""
    engines = [o for o in device.occupants if o.engine is not None]
    if not engines:
        return
    cap, usable = device.capacity, device.usable
    fixed = sum(int(o.engine.utilization * cap) for o in engines if o.engine.utilization is not None) if cap else 0
    unset = [o for o in engines if o.engine.utilization is None]
    share = None
    if cap and unset:
        left = usable - sum(o.bytes for o in device.occupants) - fixed
        share = max(0.0, math.floor(100 * left / len(unset) / cap) / 100)
    for o in engines:
        e = o.engine
        utilization = e.utilization if e.utilization is not None else share
        granted = int(utilization * cap) if cap and utilization is not None else None
        how = "set from the plan" if e.utilization is None else "search.vllm.gpu_memory_utilization"
        label = (f"vLLM engine (gpu_memory_utilization {utilization:.2f}, {how}; its weights and one batch's KV "
                 f"cache need {gb(e.need)})" if utilization is not None else
                 "vLLM engine (its weights and one batch's KV cache; its share of an unknown device)")
        o.terms.append(Term(label, max(granted or 0, e.need), approximate=True))
        if granted is not None and granted < e.need:
            device.problems.append(f"{o.name}'s vLLM engine gets {utilization:.2f} of {device.name} "
                                   f"({gb(granted)}), less than its weights and one batch's KV cache ({gb(e.need)})")
        if e.utilization is None:
            shares[e.rank] = share


def make_plan(cfg: RunConfig, capacity: Machine | Capacity | None = None) -> Plan:
    """The plan of `cfg`: per device, its occupants with their terms. `capacity`: the machine to check against
    (default this one, `local_machine`; `target_machine` for `tba plan --gpus`), or a function giving a device's
    total bytes (None: unknown). Raises tba.models.sources.ModelLoadError when a model's config cannot be read
    offline (not local, not cached, not a published shape tba knows)."""
    machine = capacity if isinstance(capacity, Machine) else (
        local_machine() if capacity is None else Machine(capacity))
    notes: list[str] = []
    shape = model_shape(cfg.model.policy, cfg.model.tiny)
    ref_shape = shape if cfg.model.reference is None else model_shape(cfg.model.reference, cfg.model.tiny)
    prompt = prompt_tokens(cfg, shape, notes)
    published = published_dtype(cfg, [d for _, d in placed(cfg, machine)])
    sender = rank_devices(cfg, machine)[0] if cfg.trainer.world_size == 1 else "cpu"
    occupants = trainer_occupants(cfg, shape, ref_shape, prompt, machine, published)
    occupants += searcher_occupants(cfg, shape, ref_shape, prompt, machine, sender, published, notes)
    devices: dict[str, DevicePlan] = {}
    for device, occupant in occupants:
        if device not in devices:
            devices[device] = DevicePlan(device, machine.capacity(device))
        devices[device].occupants.append(occupant)
    shares: dict[int, float | None] = {}
    for d in devices.values():
        _engines(d, shares)
        if d.capacity is None:
            notes.append(f"{d.name}: capacity unknown here (not visible on {machine.label}, nor given), not checked")
    notes.append(f"policy: {shape.params / 1e6:.2f}M parameters, {shape.layers} layers, hidden {shape.hidden}, "
                 f"{shape.kv_heads} KV heads × {shape.head_dim}, vocab {shape.vocab}")
    return Plan(list(devices.values()), notes, shares)


def vllm_shares(cfg: RunConfig, machine: Machine | Capacity | None = None) -> dict[int, float]:
    """Searcher rank → the gpu_memory_utilization its vLLM engine runs with, for every vLLM searcher on a GPU whose
    search.vllm.gpu_memory_utilization is null: what the plan leaves it on its device (this machine's, at run time).
    A searcher whose GPU this process cannot read (a Ray actor's on another node) is left out: its engine takes 0.9 of
    what is free on its GPU when it starts (tba.rollout.samplers.vllm), which it logs."""
    plan = make_plan(cfg, machine)
    unknown = sorted(rank for rank, share in plan.vllm_shares.items() if share is None)
    if unknown:
        logger.info(f"searcher(s) {unknown}: their GPU's memory cannot be read here; each vLLM engine sizes itself "
                    "when it starts (0.9 of what is free on its GPU)")
    return {rank: share for rank, share in plan.vllm_shares.items() if share is not None}


def vllm_memory_utilization(cfg: RunConfig, rank: int, machine: Machine | Capacity | None = None) -> float | None:
    """The share of its GPU searcher `rank`'s vLLM engine gets (`vllm_shares`); None when its setting is not null
    or it is not a vLLM searcher on a GPU."""
    return vllm_shares(cfg, machine).get(rank)
