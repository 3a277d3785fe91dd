"""The searchers' occupants, and the weight transport's buffers.

A searcher (on the device search.device, or its group's, gives it — inline: the trainer's) holds, in the searchers'
dtype (search.dtype; unset: the trainer's compute dtype on a GPU, model.dtype on a CPU): its policy copy (hf: full
precision, published weights load into it in place; with search.quantize the quantized copy it samples from
beside it), its batch's KV cache, its own π_ref (not inline: there it shares the trainer's) and the chunked logits of
scoring the batch under it, the staging copy the transport lands published weights in, and its process (a CPU's
libraries, or a GPU's CUDA context). A vLLM engine on a GPU takes its share of the device (an `Engine`, resolved by
tba.run.plan.make_plan); on a CPU its weights plus search.vllm.kv_cache_gb.

The transport's flat copy of the published weights lives with the sender: with `shared` at trainer.world_size = 1
on a GPU it is CUDA IPC memory on the trainer's GPU when every searcher is on that GPU, else host shared memory;
`broadcast` keeps its buffers on the sender's device; Ray's object store holds one copy in host memory. With N > 1 the
sender is the controller, on the host.
"""

from __future__ import annotations

from tba.config import RunConfig
from tba.models.logprobs import CHUNK_TOKENS as SCORING_CHUNK_TOKENS
from tba.models.shape import ModelShape, model_shape
from tba.run.placement import Placement, searcher_placements
from tba.run.plan.ledger import BYTES, GB, Engine, Occupant, Term
from tba.run.plan.machine import Machine, device_key
from tba.run.plan.terms import (
    CUDA_CONTEXT_BYTES,
    PROCESS_BYTES,
    SCORING_CHUNK_COPIES,
    kv_bytes,
    logit_bytes,
    quantized_bytes,
    searcher_dtype,
    synced_bytes,
)


def placed(cfg: RunConfig, machine: Machine) -> list[tuple[Placement, str]]:
    """Every searcher with the device it lives on (inline: the trainer's)."""
    if cfg.runtime == "offline":
        return []
    inline = cfg.runtime == "inline"
    return [(p, device_key(cfg.model.device if inline else p.device, machine)) for p in searcher_placements(cfg)]


def _synced(p: Placement) -> bool:
    return p.group.sync if p.group.sync is not None else p.group.policy is None


def searcher_occupant(cfg: RunConfig, p: Placement, device: str, shape: ModelShape, ref_shape: ModelShape,
                      prompt: int, notes: list[str]) -> Occupant:
    g, s, inline = p.group, p.search, cfg.runtime == "inline"
    dtype = searcher_dtype(cfg, device)
    b = BYTES[dtype]
    own = shape if g.policy is None else model_shape(g.policy, cfg.model.tiny)
    sequences, tokens = s.prompts_per_batch * s.generations_per_prompt, prompt + s.max_new_tokens
    terms, engine = [], None
    lora = cfg.model.lora.enabled and g.policy is None
    adapters = own.lora_params(cfg.model.lora) * 4 if lora else 0
    if s.backend == "vllm" and device != "cpu":
        need = own.params * b + adapters + kv_bytes(own, sequences, tokens, b)
        engine = Engine(p.rank, need, s.vllm.gpu_memory_utilization)
        if s.vllm.tensor_parallel_size > 1:
            notes.append(f"searcher {p.rank}: tensor parallelism is planned as one engine on {device}")
    elif s.backend == "vllm":
        terms += [Term(f"vLLM weights ({dtype})", own.params * b + adapters),
                  Term("vLLM KV cache (search.vllm.kv_cache_gb)", int(s.vllm.kv_cache_gb * GB))]
    else:
        terms.append(Term(f"policy weights ({dtype})", own.params * b))
        if lora:
            terms.append(Term("LoRA adapters (float32)", adapters))
        if s.quantize != "none":
            terms.append(Term(f"{s.quantize} copy it samples from", quantized_bytes(own, s.quantize, device, b)))
        terms.append(Term(f"KV cache ({sequences} sequences × {tokens} tokens)", kv_bytes(own, sequences, tokens, b),
                          approximate=True))
        if s.backend != "hf":
            notes.append(f"searcher {p.rank}: backend {s.backend} is planned as hf")
    if not inline:
        terms.append(Term(f"π_ref ({dtype})", ref_shape.params * b))
        if _synced(p):
            terms.append(Term("staging copy of the published weights", synced_bytes(cfg, own, dtype)))
        terms.append(Term("process (interpreter, torch, transformers)", PROCESS_BYTES, approximate=True)
                     if device == "cpu" else Term("CUDA context", CUDA_CONTEXT_BYTES, approximate=True))
    chunk = SCORING_CHUNK_TOKENS
    terms.append(Term("π_ref scoring logits (float32, chunked)", logit_bytes(
        sequences * (s.max_new_tokens + 1), ref_shape.vocab, chunk, SCORING_CHUNK_COPIES), approximate=True))
    return Occupant(f"searcher {p.rank} ({g.name})", terms, engine)


def transport_kind(cfg: RunConfig, sender: str) -> str:
    """search.weight_transport with auto resolved as tba.runtime.transport.choose_transport does."""
    kind = cfg.search.weight_transport
    if kind != "auto":
        return kind
    if cfg.runtime == "local":
        return "shared"
    return "broadcast" if sender != "cpu" else "object_store"


def transport_occupant(cfg: RunConfig, shape: ModelShape, trainer_device: str, searchers: list[str],
                       dtype: str) -> tuple[str, Occupant] | None:
    """(device, the transport's flat copy of the published weights), or None when no searcher is in another
    process. `trainer_device` is the sender's: the one trainer process's device, or `cpu` (the controller)."""
    if cfg.runtime in ("inline", "offline") or not searchers:
        return None
    kind = transport_kind(cfg, trainer_device)
    size = synced_bytes(cfg, shape, dtype)
    if kind == "shared":
        ipc = trainer_device != "cpu" and all(d == trainer_device for d in searchers)
        where, what = (trainer_device, "CUDA IPC buffers") if ipc else ("cpu", "host shared memory")
    elif kind == "broadcast":
        where, what = trainer_device, "broadcast buffers"
    else:
        where, what = "cpu", "Ray's object store"
    return where, Occupant(f"weight transport ({kind})", [Term(f"flat copy of the published weights ({what})", size)])


def searcher_occupants(cfg: RunConfig, shape: ModelShape, ref_shape: ModelShape, prompt: int, machine: Machine,
                       sender: str, published: str, notes: list[str]) -> list[tuple[str, Occupant]]:
    """(device, occupant) of every searcher, and of the transport's buffers."""
    where = placed(cfg, machine)
    out = [(d, searcher_occupant(cfg, p, d, shape, ref_shape, prompt, notes)) for p, d in where]
    transport = transport_occupant(cfg, shape, sender, [d for _, d in where], published)
    if cfg.runtime == "ray":
        notes.append("runtime=ray: `cuda` is each actor's own GPU; the plan puts searchers where search.device names")
    return out + ([transport] if transport else [])
