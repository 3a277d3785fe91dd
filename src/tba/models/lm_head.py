"""The LM head and its log-softmax a chunk of positions at a time, inside the model's own forward.

Why: at a 152k vocabulary one float32 logits row is 0.6 MB, so [N, R, V] logits of a micro-batch of 20 × 512-token
responses are 6 GB per copy, and the plain path keeps several (the head's output, the gathered rows, their ÷ T
copy, autograd's softmax and gradient). Here no tensor of V columns ever has more than `chunk` rows.

How: for the length of one forward the model's output-embedding module (its LM head) is replaced by a scorer
(`scored`). The model's forward hands the head the final hidden states of the positions it keeps, exactly where it
would compute logits; the scorer returns what its caller wants instead — each target token's log-prob
(`token_logprobs`, differentiable), or the hidden states themselves (evaluation's full-vocabulary KL). Inside the
forward, everything that wraps it sees the head used as usual: FSDP's gathers of the root's weights, autocast, PEFT.

A plain `nn.Linear` head (every HF causal LM's, tied or not) is scored by `_TokenLogprobs`: one [chunk, V] float32
tensor alive at a time, in forward (the logits; their logsumexp taken in place) and in backward (the logits
recomputed and turned into their gradient in place, (onehot(y) − softmax(z/T))·g/T); under autocast also the head's
output, and the gradient, in the compute dtype. Any other head (PEFT's ModulesToSaveWrapper, a LoRA'd head) is
scored under `torch.utils.checkpoint`, one chunk at a time: generic, with up to four [chunk, V] float32 tensors
alive in backward (bench/perf/update_memory.py compares the two).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)


_TRANSFORMING: set[type] = set()
"""Model classes seen to change their logits after the head: scored no more (one warning each)."""


def scored(model, run: Callable, score: Callable) -> tuple[object, torch.Tensor | None]:
    """(the output of `run()`, a forward of `model` with its LM head replaced by `score(hidden, head)`; what `score`
    returned). The second is None when the model changes its logits after the head (soft-capping, a logit scale:
    the forward's `.logits` is not the scorer's tensor) or has no output embeddings; the caller then computes from
    full logits — and for a model already seen to do so, `run` is not called at all (the output is None).

    `hidden`: the head's input [N, P, H] (the last P positions of the sequence); `head`: the head's own forward.
    The switch is the module's, undone on exit; nothing else may run this model meanwhile (no runtime does)."""
    head = model.get_output_embeddings()
    if head is None or type(model) in _TRANSFORMING:
        return None, None
    own = head.__dict__.get("forward")  # an instance forward (accelerate's hooks) is the head's forward too
    original, results = head.forward, []

    def forward(hidden):
        results.append(score(hidden, original))
        return results[-1]

    head.forward = forward
    try:
        out = run()
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
    if len(results) == 1 and out.logits is results[0]:
        return out, results[0]
    _TRANSFORMING.add(type(model))
    logger.warning("%s transforms its logits after the LM head: its log-probs are computed from full logits "
                   "(memory grows with vocabulary × length)", type(model).__name__)
    return out, None


def token_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int) -> torch.Tensor:
    """log softmax(head(hidden) / T)[target] per row, `chunk` rows at a time: hidden [M, H], targets [M] → [M]."""
    linear = getattr(head, "__self__", None)
    if type(linear) is torch.nn.Linear and getattr(head, "__func__", None) is torch.nn.Linear.forward:
        return _TokenLogprobs.apply(hidden, linear.weight, linear.bias, targets, temperature, chunk)
    parts = []
    for s in range(0, hidden.shape[0], chunk):
        args = (head, hidden[s:s + chunk], targets[s:s + chunk], temperature)
        parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if torch.is_grad_enabled()
                     else _chunk_logprobs(*args))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


def _chunk_logprobs(head, hidden, targets, temperature):
    logits = head(hidden).float() / temperature  # [c, V]
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)


def _logits(hidden, weight, bias, temperature):
    """One chunk's logits ÷ T in float32, as the plain path computes them (the head's matmul, under autocast in its
    dtype, then float32)."""
    logits = F.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def _logsumexp_(x: torch.Tensor) -> torch.Tensor:
    """torch.logsumexp(x, -1) in x's own memory (x is overwritten): the same operations as torch's (max, exp of the
    difference, sum, log, plus the max), without its temporary copy of x."""
    m = x.amax(-1, keepdim=True)
    m.masked_fill_(m.abs() == torch.inf, 0)
    return x.sub_(m).exp_().sum(-1).log_().add_(m.squeeze(-1))


class _TokenLogprobs(torch.autograd.Function):
    """log softmax((h Wᵀ + b) / T)[y] for M rows, chunked, for a plain linear head; backward recomputes each chunk's
    logits (under the forward's autocast) and saves only h, y and the M logsumexps."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, chunk: int):
        kind = hidden.device.type
        ctx.autocast = torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
        ctx.temperature, ctx.chunk = temperature, chunk
        out = hidden.new_empty(hidden.shape[0], dtype=torch.float32)  # [M]
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk):
            logits = _logits(hidden[s:s + chunk], weight, bias, temperature)  # [c, V]
            picked = logits.gather(-1, targets[s:s + chunk, None]).squeeze(-1)
            lse[s:s + chunk] = _logsumexp_(logits)
            out[s:s + chunk] = picked - lse[s:s + chunk]
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        enabled, dtype = ctx.autocast
        compute = dtype if enabled else weight.dtype  # the dtype of the forward's matmul
        w = weight.to(compute)
        with torch.autocast(hidden.device.type, dtype=dtype, enabled=enabled):
            for s in range(0, hidden.shape[0], chunk):
                h, y, g = hidden[s:s + chunk], targets[s:s + chunk], grad[s:s + chunk]
                # ∂ log p_y / ∂ z = (onehot(y) − softmax(z/T)) / T, z = h Wᵀ + b; built in place in the logits
                d = _logits(h, weight, bias, t).sub_(lse[s:s + chunk, None]).exp_().mul_(-g[:, None])  # [c, V]
                d.scatter_add_(-1, y[:, None], g[:, None])
                if t != 1.0:
                    d.div_(t)
                if want_b:
                    grad_b += d.sum(0)
                d = d.to(compute)
                if want_h:
                    grad_h[s:s + chunk] = (d @ w).to(hidden.dtype)
                if want_w and compute == torch.float32:
                    grad_w.addmm_(d.t(), h.float())
                elif want_w:  # the matmul in the forward's dtype (as autograd's under autocast), summed in float32
                    grad_w += d.t() @ h.to(compute)
                del d
        return (grad_h, grad_w.to(weight.dtype) if want_w else None, grad_b.to(bias.dtype) if want_b else None,
                None, None, None)
