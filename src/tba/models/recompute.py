"""Activation checkpointing (trainer.activation_checkpointing): each decoder layer's activations are recomputed in
backward instead of kept, so a micro-batch's activation memory is one layer's plus the layer inputs.

The layer's forward itself is wrapped (`torch.utils.checkpoint`, non-reentrant), not the module: parameter and
state-dict names stay the model's own, so checkpoints, the searchers' weights and FSDP's units (tba.runtime.fsdp
shards each decoder layer) see the same module tree either way. Without gradients (scoring, sampling, evaluation)
the layer runs as it is. Non-reentrant checkpointing keeps tensors that leave a layer by a side door differentiable
— the keys and values a shared-prompt forward stores in its cache (tba.models.logprobs.grouped_logprobs).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers: modules of a class its `_no_split_modules` names (HF's own list of what must
    not be split across devices), under a PEFT wrapper too."""
    base = model
    while not isinstance(getattr(base, "_no_split_modules", None), (list, set, tuple)):
        inner = getattr(base, "base_model", None) or getattr(base, "model", None)
        if inner is None or inner is base:
            raise ValueError(f"cannot find the decoder layers of {type(model).__name__}: it names no decoder layer "
                             "class (_no_split_modules)")
        base = inner
    names = set(base._no_split_modules)
    return [m for m in model.modules() if type(m).__name__ in names]


def _recomputed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def recompute_layers(model: torch.nn.Module) -> None:
    """Recompute every decoder layer of `model` in backward from now on (in place; a second call changes nothing)."""
    for layer in decoder_layers(model):
        if not isinstance(layer.__dict__.get("forward"), functools.partial):
            layer.forward = functools.partial(_recomputed, layer.forward)
