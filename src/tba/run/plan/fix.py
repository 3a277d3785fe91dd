"""When a layout does not fit: the smallest change that does, found by planning each candidate again.

The candidates, cheapest first: activation checkpointing (costs a recomputation), smaller micro-batches (costs
utilisation), more trainer ranks (costs GPUs), fewer searchers (costs samples per second); then checkpointing with
each of the others; LoRA last (it changes what is trained). The first that fits is the answer: `tba plan` prints it,
`tba train`'s refusal names it.
"""

from __future__ import annotations

from collections.abc import Iterator

from tba.config import RunConfig, override
from tba.errors import ConfigError
from tba.run.plan import make_plan
from tba.run.plan.machine import Machine
from tba.run.plan.terms import checkpointing, checkpointing_key

MAX_WORLD_SIZE = 8
"""Trainer ranks tried when the machine does not say how many GPUs it has (one node's worth)."""


def _halvings(n: int) -> list[int]:
    out = []
    while n > 1:
        n //= 2
        out.append(n)
    return out


def _world_sizes(cfg: RunConfig, machine: Machine) -> Iterator[list[str]]:
    """trainer.world_size = w > N dividing B, with its devices: the first w of a trainer.fsdp.devices list (or
    that list and GPUs no one uses, up to the machine's count), else cuda:0 … cuda:w−1 by the device-type rule."""
    t, f = cfg.trainer, cfg.trainer.fsdp
    if (f.devices or cfg.model.device).split(",")[0].strip().startswith("cpu"):
        return  # ranks on one CPU share its RAM: more of them never needs less
    limit = machine.gpu_count() or MAX_WORLD_SIZE
    listed = [d.strip() for d in f.devices.split(",")] if f.devices and "," in f.devices else None
    used = set(listed or []) | {d.strip() for d in (cfg.search.device or "").split(",") if d.strip()}
    free = [f"cuda:{k}" for k in range(limit) if f"cuda:{k}" not in used]
    for w in range(t.world_size + 1, limit + 1):
        if t.prompts_per_step % w:
            continue
        change = [f"trainer.world_size={w}"]
        if listed is not None and w != len(listed):
            devices = listed[:w] if w < len(listed) else listed + free[:w - len(listed)]
            if len(devices) < w:
                continue
            change.append(f"trainer.fsdp.devices={','.join(devices)}")
        yield change


def candidates(cfg: RunConfig, machine: Machine) -> Iterator[list[str]]:
    """Override lists to try, in order (each checked by the config's own validation before it is planned)."""
    t = cfg.trainer
    ckpt = [] if checkpointing(cfg) else [f"{checkpointing_key(cfg)}=true"]
    singles = [[f"trainer.micro_batch_prompts={v}"]
               for v in _halvings(min(t.micro_batch_prompts, t.prompts_per_step // t.world_size))]
    singles += [[f"trainer.micro_batch_samples={v}"] for v in _halvings(t.samples_per_prompt)]  # split a group
    singles += list(_world_sizes(cfg, machine))
    if not cfg.search.groups:
        singles += [[f"search.num_searchers={v}"] for v in sorted({cfg.search.num_searchers - 1,
                                                                     *_halvings(cfg.search.num_searchers)},
                                                                    reverse=True) if v >= 1]
    if ckpt:
        yield ckpt
    yield from singles
    if ckpt:
        yield from ([*ckpt, *c] for c in singles)
    if not cfg.model.lora.enabled:
        yield ["model.lora.enabled=true"]
        if ckpt:
            yield ["model.lora.enabled=true", *ckpt]


def smallest_fix(cfg: RunConfig, machine: Machine) -> list[str] | None:
    """The first candidate change with which the run fits on `machine`, or None."""
    for change in candidates(cfg, machine):
        try:
            changed = override(cfg, *change, check_installed=False)
        except ConfigError:
            continue
        plan = make_plan(changed, machine)
        if plan.fits:
            return change
    return None


def advice(cfg: RunConfig, machine: Machine) -> str:
    """One sentence for a refusal: the change that fits, or that none of the single changes tried does."""
    change = smallest_fix(cfg, machine)
    if change is None:
        return ("no single change among activation checkpointing, smaller micro-batches, more trainer ranks, fewer "
                "searchers or LoRA makes it fit")
    return f"it fits with {' '.join(change)}"
