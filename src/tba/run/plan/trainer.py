"""The trainer's occupants: one process (trainer.world_size = 1, on model.device), or N identical ranks and the
controller that drives them (N > 1, docs/sharding.md).

One process holds the policy, its gradients and AdamW's moments in model.dtype, π_ref, and per update one
micro-batch's activations and chunked logits (or, during an evaluation, the eval batch's KV cache).

Each of N ranks holds 1/N of the masters and of AdamW's moments (model.dtype) for the whole run, and 1/N of π_ref in
the compute dtype only when the objective owns a reference (TBA′; TB reads the searchers' stored log-probs). Phase by
phase, never together: an update's gradients (1/N), gathered units in trainer.fsdp.param_dtype (and the largest
unit's unsharded gradients with their trainer.fsdp.reduce_dtype copy) and one micro-batch's activations and logits;
an evaluation's whole policy copy in the compute dtype and its batch's KV cache (every rank evaluates a share of the
test prompts); a publication's one bucket of gathered weights. The controller holds no model on a training device:
one host copy of the published tensors in the searchers' dtype.
"""

from __future__ import annotations

import math

from tba.algorithm.objectives import OBJECTIVES
from tba.config import RunConfig
from tba.models.shape import ModelShape
from tba.run.plan.ledger import BYTES, Occupant, Term
from tba.run.plan.machine import Machine, device_key
from tba.run.plan.terms import (
    CUDA_CONTEXT_BYTES,
    LOGPROB_CHUNK_COPIES,
    PROCESS_BYTES,
    activation_bytes,
    checkpointing,
    compute_dtype,
    kv_bytes,
    logit_bytes,
    micro_batch_sequences,
    root_params,
    synced_bytes,
)


def rank_devices(cfg: RunConfig, machine: Machine) -> list[str]:
    """Each rank's device: the one process on model.device; N ranks on trainer.fsdp.devices (a list: one each; a
    type: rank r on cuda:r, or all on cpu)."""
    m, f, n = cfg.model, cfg.trainer.fsdp, cfg.trainer.world_size
    if n == 1:
        return [device_key(m.device, machine)]
    if f.devices and "," in f.devices:
        return [device_key(d, machine) for d in f.devices.split(",")]
    kind = device_key(f.devices or m.device, machine).split(":")[0]
    return [f"cuda:{r}" if kind == "cuda" else "cpu" for r in range(n)]


def _process(device: str) -> Term:
    if device == "cpu":
        return Term("process (interpreter, torch, transformers)", PROCESS_BYTES, approximate=True)
    return Term("CUDA context", CUDA_CONTEXT_BYTES, approximate=True)


def _update_terms(cfg: RunConfig, shape: ModelShape, prompt: int, dtype: str) -> list[Term]:
    """One micro-batch's activations (in `dtype`) and its log-probs' chunked float32 logits."""
    sequences, response = micro_batch_sequences(cfg), cfg.search.max_new_tokens
    tokens, ckpt = prompt + response, checkpointing(cfg)
    chunk = cfg.trainer.logprob_chunk_tokens
    return [Term(f"activations ({sequences} sequences × {tokens} tokens{', checkpointed' if ckpt else ''})",
                 activation_bytes(shape, sequences, tokens, BYTES[dtype], ckpt), approximate=True, phase="update"),
            Term(f"log-prob logits (float32, {chunk}-position chunks × {LOGPROB_CHUNK_COPIES})" if chunk else
                 "log-prob logits (float32, every response position: trainer.logprob_chunk_tokens=0)",
                 logit_bytes(sequences * (response + 1), shape.vocab, chunk, LOGPROB_CHUNK_COPIES),
                 approximate=True, phase="update")]


def _eval_kv(cfg: RunConfig, shape: ModelShape, prompt: int, dtype: str) -> Term:
    return Term(f"evaluation batch's KV cache ({cfg.eval.batch_size} sequences)",
                kv_bytes(shape, cfg.eval.batch_size, prompt + cfg.eval.max_new_tokens, BYTES[dtype]),
                approximate=True, phase="evaluation")


def one_process(cfg: RunConfig, shape: ModelShape, ref_shape: ModelShape, prompt: int,
                device: str) -> Occupant:
    """trainer.world_size = 1: today's trainer, every term in model.dtype (an upper bound under model.autocast)."""
    m = cfg.model
    b, lora = BYTES[m.dtype], m.lora.enabled
    trainable = shape.lora_params(m.lora) if lora else shape.params
    t_bytes = 4 if lora else b  # PEFT keeps adapters in float32 (autocast_adapter_dtype)
    terms = [Term(f"parameters ({m.dtype})", shape.params * b)]
    if lora:
        terms.append(Term("LoRA adapters (float32)", trainable * 4))
    terms += [Term("AdamW moments (2 × trainable)", 2 * trainable * t_bytes),
              Term("gradients" + (" (LoRA adapters, float32)" if lora else ""), trainable * t_bytes, phase="update"),
              *_update_terms(cfg, shape, prompt, m.dtype), _eval_kv(cfg, shape, prompt, m.dtype),
              Term("π_ref (frozen copy)", ref_shape.params * b)]
    if OBJECTIVES[cfg.objective].owns_reference:
        terms.append(Term(f"{cfg.objective}'s resetting reference", shape.params * b))
    terms.append(_process(device))
    return Occupant("trainer", terms)


def sharded_rank(cfg: RunConfig, shape: ModelShape, ref_shape: ModelShape, prompt: int, rank: int,
                 device: str) -> Occupant:
    """One of N identical ranks (trainer.world_size = N > 1)."""
    m, f, n = cfg.model, cfg.trainer.fsdp, cfg.trainer.world_size
    master, compute = m.dtype, compute_dtype(cfg)
    b, c, lora = BYTES[master], BYTES[compute], m.lora.enabled
    trainable = shape.lora_params(m.lora) if lora else shape.params
    t_bytes = 4 if lora else b

    def share(x: int) -> int:
        return math.ceil(x / n)

    terms = [Term(f"parameters ({master}, 1/{n} shard)", share(shape.params * b))]
    if lora:
        terms.append(Term(f"LoRA adapters (float32, 1/{n} shard)", share(trainable * 4)))
    terms.append(Term(f"AdamW moments (2 × trainable, 1/{n} shard)", share(2 * trainable * t_bytes)))
    if OBJECTIVES[cfg.objective].owns_reference:
        terms.append(Term(f"π_ref ({compute}, 1/{n} shard: {cfg.objective} owns a reference)",
                          share(ref_shape.params * c)))
    gathered = root_params(shape) + 2 * shape.layer_params if f.reshard_after_forward else shape.params
    unit = max(root_params(shape), shape.layer_params) * b
    bucket = max(int(f.publish_bucket_mb * 1024**2), unit)
    unit_grads = (max(root_params(shape), shape.layer_params) if not lora else 0) * (c + BYTES[f.reduce_dtype])
    terms += [Term(f"gradients (1/{n} shard)", share(trainable * t_bytes), phase="update"),
              Term(f"gathered parameters ({compute}, "
                   f"{'two layers + root' if f.reshard_after_forward else 'whole model'})",
                   gathered * c, approximate=True, phase="update"),
              Term(f"one unit's unsharded gradients ({compute}, and their {f.reduce_dtype} copy reduce-scattered)",
                   unit_grads, approximate=True, phase="update"),
              *_update_terms(cfg, shape, prompt, compute),
              Term(f"evaluation's whole policy copy ({compute})", shape.params * c, phase="evaluation"),
              _eval_kv(cfg, shape, prompt, compute),
              Term("publication bucket (trainer.fsdp.publish_bucket_mb, at least one FSDP unit)", bucket,
                   phase="publication"),
              _process(device)]
    return Occupant(f"trainer rank {rank}", terms)


def controller(cfg: RunConfig, shape: ModelShape, dtype: str) -> Occupant:
    """N > 1: the run's own process, on the host: the published tensors' host copy the transports send from."""
    what = "LoRA adapters" if cfg.model.lora.enabled else dtype
    return Occupant("controller (buffer, loop, searchers' host)",
                    [Term(f"host copy of the published weights ({what})", synced_bytes(cfg, shape, dtype)),
                     _process("cpu")])


def trainer_occupants(cfg: RunConfig, shape: ModelShape, ref_shape: ModelShape, prompt: int, machine: Machine,
                      published: str) -> list[tuple[str, Occupant]]:
    """(device, occupant) of the trainer: the one process, or every rank and the controller (on `cpu`)."""
    devices = rank_devices(cfg, machine)
    if cfg.trainer.world_size == 1:
        return [(devices[0], one_process(cfg, shape, ref_shape, prompt, devices[0]))]
    out = [(d, sharded_rank(cfg, shape, ref_shape, prompt, r, d)) for r, d in enumerate(devices)]
    return [*out, ("cpu", controller(cfg, shape, published))]
