"""RLOO (REINFORCE Leave-One-Out; Ahmadian et al. 2024) on a KL-shaped sequence reward.

For sequence i in prompt group g(i) of size K_g (log π summed over response tokens):

    r'_i = SG[ r_i − β·(log π_θ(y_i|x) − log π_ref(y_i|x)) ]      (KL-shaped reward)
    b_i  = (Σ_{j∈g(i), j≠i} r'_j) / (K_g − 1)                       (leave-one-out baseline, K_g ≥ 2)
    A_i  = r'_i − b_i   (= K_g/(K_g−1)·(r'_i − mean_g r')),  A_i = 0 for a singleton group
    L    = −(1/N) Σ_i A_i · log π_θ(y_i|x)

On-policy this is REINFORCE with an unbiased (leave-one-out) baseline; there is no importance ratio.
"""

from __future__ import annotations

import torch

from tba.algorithm.objectives.groups import check_sequence_inputs, group_mean, group_size


def rloo_loss(logp: torch.Tensor, ref_logp: torch.Tensor, reward: torch.Tensor, group: torch.Tensor,
              beta: float) -> torch.Tensor:
    """Scalar loss. logp, ref_logp, reward, group: 1-D tensors of length N (one per sequence)."""
    check_sequence_inputs(logp, ref_logp, reward, group)
    shaped = (reward.to(logp.dtype) - beta * (logp - ref_logp.to(logp.dtype))).detach()  # r'_i
    k = group_size(group).to(logp.dtype)  # K_g
    others = k * group_mean(shaped, group) - shaped  # Σ_{j∈g, j≠i} r'_j
    baseline = others / (k - 1.0).clamp(min=1.0)  # b_i (denominator guarded for K_g = 1)
    adv = torch.where(k > 1, shaped - baseline, 0.0)  # A_i, 0 for singleton groups
    return -(adv * logp).mean()  # −(1/N) Σ_i A_i log π_θ
