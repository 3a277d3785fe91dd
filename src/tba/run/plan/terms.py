"""The byte counts a plan adds up, each formula beside its reason, and the dtypes and sizes it reads from the config.

Exact: parameters, gradients, moments, copies of the weights (counts from the meta-device shape × bytes per
element). Estimates (marked ~ in `tba plan`): activations, logits, KV caches, a process's libraries, a CUDA context,
measured against real peaks in bench/perf/plan_memory.py (docs/plan.md).
"""

from __future__ import annotations

from tba.config import RunConfig
from tba.models.shape import ModelShape
from tba.run.plan.ledger import BYTES, GB

DEFAULT_PROMPT_TOKENS = 256
"""Prompt length planned when task.max_prompt_tokens is unset (capped by the model's context): the plan cannot see
the prompts without building the task and its tokenizer, and the context length (what the run would admit) is
thousands of tokens for real models — a plan of those would refuse every run. Set task.max_prompt_tokens to plan
(and cap) the real length."""
PROCESS_BYTES = int(0.55 * GB)
"""CPU: resident memory of one Python process once torch, transformers and tba are imported, before any model
(measured: bench/results/plan_memory/plan_memory.md, the "before the model" column). Forked searchers share part
of it with the fork server; the plan counts it whole."""
CUDA_CONTEXT_BYTES = 512 * 1024**2
"""Each process's CUDA context on each GPU it touches, outside torch's allocator: about 300 MB since CUDA 11.7's
lazy module loading, 300–400 MB and more before it (pytorch/pytorch issues 107667 and 20532); a process that only
opens another's CUDA IPC handles on a GPU gets one there too (github.com/pytorch/pytorch/issues/78884). Rounded up."""
LOGPROB_CHUNK_COPIES = 1
"""Live float32 [chunk × vocab] tensors at the peak of the trainer's chunked log-probs: one, in forward and backward
(tba.models.logprobs: the head's output, its logsumexp taken in place, a linear head's own backward recomputing the
chunk; counted by live storages in tests/models/test_logprobs.py). A head that is not a plain linear layer runs
checkpointed chunks instead, four copies: planned as one, the common case."""
SCORING_CHUNK_COPIES = 1
"""The same for a searcher scoring its batch under π_ref without gradients (tba.models.logprobs.CHUNK_TOKENS
positions at a time)."""


def checkpointing_key(cfg: RunConfig) -> str:
    """Where activation checkpointing is set (for one process and for ranks alike)."""
    return "trainer.activation_checkpointing"


def checkpointing(cfg: RunConfig) -> bool:
    return cfg.trainer.activation_checkpointing


def compute_dtype(cfg: RunConfig) -> str:
    """The trainer's compute dtype: trainer.fsdp.param_dtype (null = model.dtype) when sharded; model.autocast or
    model.dtype for one process."""
    if cfg.trainer.world_size > 1:
        return cfg.trainer.fsdp.param_dtype or cfg.model.dtype
    return cfg.model.autocast or cfg.model.dtype


def searcher_dtype(cfg: RunConfig, device: str) -> str:
    """What a searcher on `device` holds its models in: the run's own rule (tba.run.placement.searcher_dtype)."""
    from tba.run.placement import searcher_dtype as rule

    return rule(cfg, device)


def published_dtype(cfg: RunConfig, devices: list[str]) -> str:
    """The dtype the weights travel in: the searchers' (a GPU searcher's when any is on a GPU)."""
    return searcher_dtype(cfg, next((d for d in devices if d != "cpu"), "cpu"))


def synced_bytes(cfg: RunConfig, shape: ModelShape, dtype: str) -> int:
    """What a publication carries: the whole policy in `dtype`, or only the LoRA adapters (float32)."""
    if cfg.model.lora.enabled:
        return shape.lora_params(cfg.model.lora) * 4
    return shape.params * BYTES[dtype]


def prompt_tokens(cfg: RunConfig, shape: ModelShape, notes: list[str]) -> int:
    """task.max_prompt_tokens, or DEFAULT_PROMPT_TOKENS capped by the context (said in the notes)."""
    if cfg.task.max_prompt_tokens is not None:
        return cfg.task.max_prompt_tokens
    longest = max(cfg.search.max_new_tokens, cfg.eval.max_new_tokens)
    assumed = min(DEFAULT_PROMPT_TOKENS, shape.context - longest) if shape.context > longest else DEFAULT_PROMPT_TOKENS
    notes.append(f"task.max_prompt_tokens is unset: prompts planned at {assumed} tokens (set it to plan, and cap, "
                 "the real length)")
    return assumed


def micro_batch_sequences(cfg: RunConfig) -> int:
    """Sequences in one of a rank's micro-batches: micro_batch_prompts groups (at most B/N) of K samples, or
    trainer.micro_batch_samples of them when a group's samples are split."""
    t = cfg.trainer
    groups = min(t.micro_batch_prompts, t.prompts_per_step // t.world_size)
    split = t.micro_batch_samples
    return min(groups * t.samples_per_prompt, split) if split else groups * t.samples_per_prompt


def activation_bytes(shape: ModelShape, sequences: int, tokens: int, dtype_bytes: int, checkpointed: bool) -> int:
    """What one micro-batch's forward keeps for its backward (the logits are `logit_bytes`).

    Per decoder layer and token a Llama-style block keeps (in the compute dtype): its two RMSNorms' input,
    normalised and scaled outputs (6h), the residual (h), q, k, v and their rotated q, k (2·heads·d + 3·kv·d), the
    attention output and o_proj's contiguous input (2·heads·d), and the SwiGLU MLP's gate, up, SiLU(gate) and product
    (4·intermediate). Activation checkpointing keeps each layer's input (h) and recomputes one layer at a time.
    Backward needs one more layer's worth of working space."""
    h, d = shape.hidden, shape.head_dim
    per_layer = 7 * h + 4 * shape.heads * d + 3 * shape.kv_heads * d + 4 * shape.intermediate
    n = sequences * tokens
    kept = n * (shape.layers * h + per_layer) if checkpointed else n * (shape.layers + 1) * per_layer
    return kept * dtype_bytes + n * 4 * h * dtype_bytes


PLAIN_LOGIT_COPIES = 4
"""trainer.logprob_chunk_tokens = 0 (the plain path): [positions × vocab] float32 tensors alive at its peak — the head's
output, the gathered rows, their ÷ T copy kept for log-softmax's backward, logsumexp's exp."""


def logit_bytes(positions: int, vocab: int, chunk: int, copies: int) -> int:
    """The log-probs' float32 logits: `copies` live [chunk × vocab] tensors, a chunk being at most `chunk` of the
    batch's response positions (`logits_to_keep`: the response only); `chunk` 0: the plain path, every position at
    once, PLAIN_LOGIT_COPIES of them."""
    if not chunk:
        return positions * vocab * 4 * PLAIN_LOGIT_COPIES
    return min(chunk, positions) * vocab * 4 * copies


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


def root_params(shape: ModelShape) -> int:
    """What FSDP's root unit holds beside the decoder layers: embeddings, the LM head (its own when untied), the
    final norm."""
    return shape.params - shape.layers * shape.layer_params
