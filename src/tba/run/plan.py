"""The memory plan of a run before it starts (`tba plan`, and the check `tba train` makes before loading anything):
per device, what the trainer's ranks and each searcher will hold, against what the device has.

Everything is computed from the config and the model's shape on torch's meta device (tba.models.shape): no weight
is read, so the plan costs the imports and a second. Each term's docstring-level reason is next to its formula
below; the terms that depend on kernels and allocators (activations, logits, KV cache, a process's libraries) are
estimates, measured against real peaks in bench/perf/plan_memory.py (docs/plan.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tba.algorithm.objectives import OBJECTIVES
from tba.config import RunConfig
from tba.errors import UserError
from tba.models.shape import ModelShape, model_shape
from tba.run.searchers import searcher_placements

GB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_PROMPT_TOKENS = 256
"""Prompt length planned when task.max_prompt_tokens is unset (capped by the model's context): the plan cannot see
the prompts without building the task and its tokenizer, and the context length (what the run would admit) is
thousands of tokens for real models — a plan of those would refuse every run. Set task.max_prompt_tokens to plan
(and cap) the real length."""
GPU_HEADROOM = 0.10
"""Share of a GPU's memory left for the CUDA context, the caching allocator's fragmentation and kernels' workspace."""
PROCESS_BYTES = int(0.55 * GB)
"""CPU: resident memory of one Python process once torch, transformers and tba are imported, before any model
(measured: bench/results/plan_memory/plan_memory.md, the "before the model" column). Forked searchers share part
of it with the fork server; the plan counts it whole."""
LOGIT_COPIES = 4
"""The trainer's log-probs hold this many [sequences × response tokens × vocab] float32 tensors at their peak
(tba.models.logprobs.response_logits/response_logprobs): the LM head's output, the gathered rows, their ÷ T copy
(kept for log-softmax's backward) and logsumexp's exp. Measured with the activations."""
SCORING_COPIES = 3
"""A searcher scores its batch under π_ref without gradients: the head's output, the gathered rows, the ÷ T copy."""

class PlanError(UserError):
    """A run whose plan does not fit: `tba train` stops before loading anything (`--ignore-plan` goes on)."""

    label = "plan"


Capacity = Callable[[str], "int | None"]


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    approximate: bool = False


@dataclass
class Occupant:
    """One thing living on a device: a trainer rank, a searcher, rank 0's evaluation copy."""

    name: str
    terms: list[Term] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.terms)


@dataclass
class DevicePlan:
    name: str
    capacity: int | None
    """Total memory of the device (RAM for `cpu`); None when it cannot be read here."""
    occupants: list[Occupant] = field(default_factory=list)

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
        return None if self.usable is None else self.need <= self.usable


@dataclass
class Plan:
    devices: list[DevicePlan]
    notes: list[str]
    """What the plan assumed (prompt length, unknown capacities, …)."""

    @property
    def fits(self) -> bool:
        return all(d.fits is not False for d in self.devices)

    def refusal(self) -> str | None:
        """The message that stops a run that cannot fit (None when it fits): device, need, capacity, what to change."""
        bad = [d for d in self.devices if d.fits is False]
        if not bad:
            return None
        lines = [f"{d.name} needs about {gb(d.need)} but has {gb(d.usable)} usable"
                 + (f" ({gb(d.capacity)} less {GPU_HEADROOM:.0%} headroom)" if d.name != "cpu" else " (RAM)")
                 + f": {', '.join(f'{o.name} {gb(o.bytes)}' for o in d.occupants)}" for d in bad]
        return ("the run does not fit in memory (`tba plan` shows every term): " + "; ".join(lines)
                + ". Change one of: trainer.world_size (shard the trainer over more ranks), model.lora.enabled=true, "
                  "trainer.fsdp.param_dtype=bfloat16, a smaller trainer.micro_batch_prompts, "
                  "trainer.activation_checkpointing=true, fewer searchers on that device (search.device, "
                  "search.num_searchers); or pass --ignore-plan")


def gb(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 1024**2:.1f} MB"


def device_key(device: str) -> str:
    """One name per physical device: `cuda` is cuda:0 (tba.models.resolve_device takes the current device, 0 unless
    set), `auto` the first GPU when torch sees one."""
    device = device.strip()
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda:0" if device == "cuda" else device


def machine_capacity(device: str) -> int | None:
    """A CPU's RAM (MemTotal, shared by everything on `cpu`), a GPU's total memory; None when it cannot be read."""
    if device == "cpu":
        try:
            with open("/proc/meminfo") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
        except (OSError, StopIteration):
            return None
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        index = int(device.split(":")[1]) if ":" in device else 0
        if index < torch.cuda.device_count():
            return torch.cuda.get_device_properties(index).total_memory
    return None


# ---- the terms -----------------------------------------------------------------------------------------------
def prompt_tokens(cfg: RunConfig, shape: ModelShape, notes: list[str]) -> int:
    """task.max_prompt_tokens, or DEFAULT_PROMPT_TOKENS capped by the context (said in the notes)."""
    if cfg.task.max_prompt_tokens is not None:
        return cfg.task.max_prompt_tokens
    longest = max(cfg.search.max_new_tokens, cfg.eval.max_new_tokens)
    assumed = min(DEFAULT_PROMPT_TOKENS, shape.context - longest) if shape.context > longest else DEFAULT_PROMPT_TOKENS
    notes.append(f"task.max_prompt_tokens is unset: prompts planned at {assumed} tokens (set it to plan, and cap, "
                 "the real length)")
    return assumed


def activation_bytes(shape: ModelShape, sequences: int, tokens: int, response: int, dtype_bytes: int,
                     checkpointing: bool) -> int:
    """What one micro-batch's forward keeps for its backward, plus the log-probs' float32 logits.

    Per decoder layer and token a Llama-style block keeps (in the compute dtype): its two RMSNorms' input,
    normalised and scaled outputs (6h), the residual (h), q, k, v and their rotated q, k (2·heads·d + 3·kv·d), the
    attention output and o_proj's contiguous input (2·heads·d), and the SwiGLU MLP's gate, up, SiLU(gate) and product
    (4·intermediate). Activation checkpointing keeps each layer's input (h) and recomputes one layer at a time.
    Backward needs one more layer's worth of working space. The logits are over the response positions only
    (`logits_to_keep`), LOGIT_COPIES times."""
    h, d = shape.hidden, shape.head_dim
    per_layer = 7 * h + 4 * shape.heads * d + 3 * shape.kv_heads * d + 4 * shape.intermediate
    n = sequences * tokens
    kept = n * (shape.layers * h + per_layer) if checkpointing else n * (shape.layers + 1) * per_layer
    logits = sequences * (response + 1) * shape.vocab * 4 * LOGIT_COPIES
    return kept * dtype_bytes + n * 4 * h * dtype_bytes + logits


def kv_bytes(shape: ModelShape, sequences: int, tokens: int, dtype_bytes: int) -> int:
    """A generation batch's KV cache: sequences × tokens × layers × (K and V) × kv heads × head dim."""
    return sequences * tokens * shape.layers * 2 * shape.kv_heads * shape.head_dim * dtype_bytes


def quantized_bytes(shape: ModelShape, scheme: str, device: str, dtype_bytes: int) -> int:
    """The quantized copy a searcher generates with (tba.rollout.quantize), beside its full-precision model: every
    linear weight at 1 byte (int8, int8_weight, fp8; a tied LM head gets its own), the rest at the model's dtype —
    on a CPU int8 copies the model to float32 first and keeps the MLP down projections there."""
    cpu_int8 = scheme == "int8" and device == "cpu"
    rest = 4 if cpu_int8 else dtype_bytes
    kept = shape.kept_linear_params if cpu_int8 else 0
    return shape.other_params * rest + (shape.linear_params - kept) + kept * 4


def trainer_occupants(cfg: RunConfig, shape: ModelShape, ref_shape: ModelShape, prompt: int,
                      notes: list[str]) -> list[tuple[str, Occupant]]:
    """(device, occupant) of each trainer rank, and of rank 0's evaluation copy when the trainer is sharded."""
    m, t, f = cfg.model, cfg.trainer, cfg.trainer.fsdp
    b, n = BYTES[m.dtype], t.world_size
    lora = m.lora.enabled
    trainable = shape.lora_params(m.lora) if lora else shape.params
    t_bytes = 4 if lora else b  # PEFT keeps adapters in float32 (autocast_adapter_dtype)
    if n == 1:
        devices = [device_key(m.device)]
    elif f.devices and "," in f.devices:
        devices = [device_key(d) for d in f.devices.split(",")]
    else:
        kind = (f.devices or device_key(m.device)).split(":")[0]
        devices = [f"cuda:{r}" if kind == "cuda" else "cpu" for r in range(n)]
    param_bytes = BYTES[f.param_dtype or m.dtype]
    mb_prompts = min(t.micro_batch_prompts, t.prompts_per_step // n)
    sequences, tokens = mb_prompts * t.samples_per_prompt, prompt + cfg.search.max_new_tokens
    train = activation_bytes(shape, sequences, tokens, cfg.search.max_new_tokens, param_bytes if n > 1 else b,
                             t.activation_checkpointing and n > 1)
    evaluation = kv_bytes(shape, cfg.eval.batch_size, prompt + cfg.eval.max_new_tokens, b)
    owns = OBJECTIVES[cfg.objective].owns_reference
    out = []

    def share(x: int) -> int:
        return math.ceil(x / n)

    for r, device in enumerate(devices):
        terms = [Term(f"parameters ({m.dtype}{', sharded' if n > 1 else ''})", share(shape.params * b)),
                 Term("gradients" + (" (LoRA adapters, float32)" if lora else ""), share(trainable * t_bytes)),
                 Term("AdamW moments (2 × trainable)", share(2 * trainable * t_bytes))]
        if lora:
            terms.insert(1, Term("LoRA adapters (float32)", share(trainable * 4)))
        if n > 1:
            gathered = (shape.params - shape.layers * shape.layer_params + 2 * shape.layer_params
                        if f.reshard_after_forward else shape.params)
            terms.append(Term(f"gathered parameters ({f.param_dtype or m.dtype}, "
                              f"{'two layers + embeddings' if f.reshard_after_forward else 'whole model'})",
                              gathered * param_bytes, approximate=True))
        if evaluation > train and r == 0:
            terms.append(Term(f"evaluation batch KV cache ({cfg.eval.batch_size} sequences; larger than an update's "
                              "activations)", evaluation, approximate=True))
        else:
            terms.append(Term(f"activations + logits ({sequences} sequences × {tokens} tokens"
                              f"{', checkpointed' if t.activation_checkpointing and n > 1 else ''})", train,
                              approximate=True))
        if r == 0:
            terms.append(Term("π_ref (frozen copy)", ref_shape.params * b))
        if owns:
            terms.append(Term(f"{cfg.objective}'s resetting reference", shape.params * b))
        if device == "cpu":
            terms.append(Term("process (interpreter, torch, transformers)", PROCESS_BYTES, approximate=True))
        out.append((device, Occupant(f"trainer rank {r}" if n > 1 else "trainer", terms)))
        if r == 0 and n > 1:
            out.append((device, Occupant("rank 0's unsharded policy (evaluation, publication)",
                                         [Term(f"parameters ({m.dtype})", shape.params * b)])))
    if n > 1 and t.activation_checkpointing is False and mb_prompts < t.micro_batch_prompts:
        notes.append(f"each rank trains B/N = {t.prompts_per_step // n} prompts: micro-batches of {mb_prompts}")
    return out


def searcher_occupants(cfg: RunConfig, shape: ModelShape, ref_shape: ModelShape, prompt: int,
                       capacity: Capacity, notes: list[str]) -> list[tuple[str, Occupant]]:
    """(device, occupant) of each searcher: its policy copy (and quantized copy), its own π_ref (not inline: the
    trainer's is shared), its generation batch's KV cache and π_ref's scoring logits; vLLM: the engine's share."""
    if cfg.runtime == "offline":
        return []
    b, inline, out = BYTES[cfg.model.dtype], cfg.runtime == "inline", []
    shapes: dict[str, ModelShape] = {}
    for p in searcher_placements(cfg):
        g, s = p.group, p.search
        device = device_key(cfg.model.device) if inline else device_key(p.device)
        own = shape if g.policy is None else shapes.setdefault(g.policy, model_shape(g.policy, cfg.model.tiny))
        sequences, tokens = s.prompts_per_batch * s.generations_per_prompt, prompt + s.max_new_tokens
        terms = []
        if s.backend == "vllm":
            if device == "cpu":
                terms += [Term("vLLM weights", own.params * b), Term("vLLM KV cache (search.vllm.kv_cache_gb)",
                                                                     int(s.vllm.kv_cache_gb * GB))]
            else:
                cap = capacity(device)
                if cap is None:
                    notes.append(f"searcher {p.rank}: vLLM takes gpu_memory_utilization of {device}, unknown here")
                terms.append(Term(f"vLLM engine ({s.vllm.gpu_memory_utilization:.0%} of the GPU)",
                                  int(s.vllm.gpu_memory_utilization * (cap or 0))))
        else:
            terms.append(Term(f"policy weights ({cfg.model.dtype})", own.params * b))
            if cfg.model.lora.enabled and g.policy is None:
                terms.append(Term("LoRA adapters (float32)", own.lora_params(cfg.model.lora) * 4))
            if s.quantize != "none":
                terms.append(Term(f"{s.quantize} copy it samples from", quantized_bytes(own, s.quantize, device, b)))
            terms.append(Term(f"KV cache ({sequences} sequences × {tokens} tokens)",
                              kv_bytes(own, sequences, tokens, b), approximate=True))
            if s.backend != "hf":
                notes.append(f"searcher {p.rank}: backend {s.backend} is planned as hf")
        if not inline:
            terms.append(Term(f"π_ref ({cfg.model.dtype})", ref_shape.params * b))
            if device == "cpu":
                terms.append(Term("process (interpreter, torch, transformers)", PROCESS_BYTES, approximate=True))
        terms.append(Term("π_ref scoring logits", sequences * (s.max_new_tokens + 1) * ref_shape.vocab * 4
                          * SCORING_COPIES, approximate=True))
        out.append((device, Occupant(f"searcher {p.rank} ({g.name})", terms)))
    if cfg.runtime == "ray":
        notes.append("runtime=ray: `cuda` is each actor's own GPU; the plan puts searchers where search.device names")
    return out


def make_plan(cfg: RunConfig, capacity: Capacity | None = None) -> Plan:
    """The plan of `cfg`: per device, the trainer's ranks and the searchers with their terms. `capacity(device)`
    gives a device's total bytes (default: this machine's, `machine_capacity`); raises
    tba.models.sources.ModelLoadError when a model's config cannot be read offline."""
    capacity = capacity or machine_capacity
    notes: list[str] = []
    shape = model_shape(cfg.model.policy, cfg.model.tiny)
    ref_shape = shape if cfg.model.reference is None else model_shape(cfg.model.reference, cfg.model.tiny)
    prompt = prompt_tokens(cfg, shape, notes)
    placed = trainer_occupants(cfg, shape, ref_shape, prompt, notes)
    placed += searcher_occupants(cfg, shape, ref_shape, prompt, capacity, notes)
    devices: dict[str, DevicePlan] = {}
    for device, occupant in placed:
        if device not in devices:
            devices[device] = DevicePlan(device, capacity(device))
        devices[device].occupants.append(occupant)
    for d in devices.values():
        if d.capacity is None:
            notes.append(f"{d.name}: capacity unknown here (no such device visible), not checked")
    notes.append(f"policy: {shape.params / 1e6:.2f}M parameters, {shape.layers} layers, hidden {shape.hidden}, "
                 f"{shape.kv_heads} KV heads × {shape.head_dim}, vocab {shape.vocab}")
    return Plan(list(devices.values()), notes)
