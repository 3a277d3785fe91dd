"""What a plan is made of: terms (bytes, with why), the occupants that hold them (a trainer rank, a searcher, the
controller), the devices they live on, and the verdict. Terms that exist only during one phase of a step (an
update's activations, an evaluation's whole copy, a publication's bucket) are counted at the peak of their
occupant: what it always holds plus its largest phase, since phases follow one another and never overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tba.errors import UserError

GB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GPU_HEADROOM = 0.10
"""Share of a GPU's memory left for the caching allocator's fragmentation, kernels' workspace and the engine's CUDA
graphs (each process's CUDA context is a term of its own)."""
PHASES = ("update", "evaluation", "publication")


class PlanError(UserError):
    """A run whose plan does not fit: `tba train` stops before loading anything (`--ignore-plan` goes on)."""

    label = "plan"


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    approximate: bool = False
    phase: str | None = None
    """None: held for the whole run; else one of PHASES: held only while that phase runs."""


@dataclass
class Engine:
    """A vLLM engine on a GPU: it takes `gpu_memory_utilization` of its device, set from the plan when unset."""

    rank: int
    """Its searcher's rank."""
    need: int
    """The least it runs with: its weights and the KV cache of one search batch."""
    utilization: float | None
    """search.vllm.gpu_memory_utilization; None = the share the other occupants leave."""


@dataclass
class Occupant:
    """One thing living on a device: a trainer rank, a searcher, the controller."""

    name: str
    terms: list[Term] = field(default_factory=list)
    engine: Engine | None = None

    @property
    def bytes(self) -> int:
        """Its peak: what it always holds plus its largest phase."""
        always = sum(t.bytes for t in self.terms if t.phase is None)
        return always + max((sum(t.bytes for t in self.terms if t.phase == p) for p in PHASES), default=0)

    def peak_phase(self) -> str | None:
        sums = {p: sum(t.bytes for t in self.terms if t.phase == p) for p in PHASES}
        return max(sums, key=sums.get) if any(sums.values()) else None


@dataclass
class DevicePlan:
    name: str
    capacity: int | None
    """Total memory of the device (RAM for `cpu`); None when it cannot be read here (nor given: `tba plan --gpus`)."""
    occupants: list[Occupant] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Why the device cannot host its occupants even if the sum fits (a vLLM share smaller than its engine)."""

    @property
    def need(self) -> int:
        return sum(o.bytes for o in self.occupants)

    @property
    def usable(self) -> int | None:
        """The capacity less the GPU headroom (a CPU's RAM is counted whole: the processes' libraries are a term)."""
        if self.capacity is None:
            return None
        return self.capacity if self.name == "cpu" else int(self.capacity * (1 - GPU_HEADROOM))

    @property
    def fits(self) -> bool | None:
        return None if self.usable is None else self.need <= self.usable and not self.problems


@dataclass
class Plan:
    devices: list[DevicePlan]
    notes: list[str]
    """What the plan assumed (prompt length, unknown capacities, …)."""
    vllm_shares: dict[int, float] = field(default_factory=dict)
    """Searcher rank → the gpu_memory_utilization its vLLM engine gets (searchers whose setting is null)."""

    @property
    def fits(self) -> bool:
        return all(d.fits is not False for d in self.devices)

    def unchecked(self) -> list[str]:
        """Devices whose capacity is unknown here (not checked)."""
        return [d.name for d in self.devices if d.capacity is None]

    def refusal(self) -> str | None:
        """The message that stops a run that cannot fit (None when it fits): device, need, capacity, what to change."""
        bad = [d for d in self.devices if d.fits is False]
        if not bad:
            return None
        lines = [f"{d.name} needs about {gb(d.need)} but has {gb(d.usable)} usable"
                 + (f" ({gb(d.capacity)} less {GPU_HEADROOM:.0%} headroom)" if d.name != "cpu" else " (RAM)")
                 + f": {', '.join(f'{o.name} {gb(o.bytes)}' for o in d.occupants)}"
                 + "".join(f"; {p}" for p in d.problems) for d in bad]
        return ("the run does not fit in memory (`tba plan` shows every term): " + "; ".join(lines)
                + ". Change one of: trainer.world_size (shard the trainer over more ranks), "
                  "trainer.activation_checkpointing=true, a smaller trainer.micro_batch_prompts or "
                  "trainer.micro_batch_samples, trainer.fsdp.param_dtype=bfloat16, fewer searchers on that device "
                  "(search.device, search.num_searchers), model.lora.enabled=true; or pass --ignore-plan")


def gb(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 1024**2:.1f} MB"
