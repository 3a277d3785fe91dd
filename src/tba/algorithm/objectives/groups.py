"""Per-prompt-group reductions shared by the objectives.

Groups are given by an explicit id per sequence (arbitrary, non-contiguous ints), never by position or reshape:
a micro-batch need not hold whole groups laid out contiguously (§7.3).
"""

from __future__ import annotations

import torch


def group_index(group: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map ids to 0..G−1: (inverse [N], G)."""
    unique, inverse = torch.unique(group, return_inverse=True)
    return inverse, len(unique)


def group_size(group: torch.Tensor) -> torch.Tensor:
    """K_g of each sequence's group, shape [N] (int64)."""
    inverse, num_groups = group_index(group)
    return torch.bincount(inverse, minlength=num_groups)[inverse]


def group_mean(x: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Each element of x [N] replaced by the mean of x over its group, shape [N]. Differentiable in x."""
    inverse, num_groups = group_index(group)
    sums = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add(0, inverse, x)  # Σ_{j∈g} x_j
    counts = torch.bincount(inverse, minlength=num_groups).to(x.dtype)  # K_g
    return (sums / counts)[inverse]


def check_sequence_inputs(logp, ref_logp, reward, group) -> None:
    """Shape check shared by the sequence-level objectives: 1-D tensors of equal length N."""
    if not (logp.shape == ref_logp.shape == reward.shape == group.shape) or logp.dim() != 1:
        raise ValueError(f"expected 1-D tensors of equal length, got {logp.shape}, {ref_logp.shape}, "
                         f"{reward.shape}, {group.shape}")


def check_token_inputs(logp, behaviour_logp, ref_logp, mask, reward, group, max_tokens: int) -> None:
    """Shape checks shared by the per-token objectives: [N, R] token tensors, [N] reward and group."""
    if logp.dim() != 2 or not (logp.shape == behaviour_logp.shape == ref_logp.shape == mask.shape):
        raise ValueError(f"expected equal [N, R] token tensors, got {logp.shape}, {behaviour_logp.shape}, "
                         f"{ref_logp.shape}, {mask.shape}")
    if reward.shape != (logp.shape[0],) or group.shape != (logp.shape[0],):
        raise ValueError(f"expected reward and group of shape [{logp.shape[0]}], got {reward.shape}, {group.shape}")
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
