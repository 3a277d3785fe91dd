"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like Training"), the baseline of paper App. C (§5.4).

For sequence i of N in prompt group g(i), response tokens t with mask m_it, behaviour policy μ (the searcher's):

    A_i   = r_i − mean_{j∈g(i)} r_j                       (no std normalisation)
    ρ_it  = exp(log π_θ(y_it) − log μ(y_it))
    s_it  = min(ρ_it·A_i, clip(ρ_it, 1−ε, 1+ε)·A_i)       (PPO clipped surrogate, per token)
    k3_it = exp(ref_it − logp_it) − (ref_it − logp_it) − 1  (KL(π_θ‖π_ref) estimator, only if kl_coef > 0)
    L     = −(1/N) Σ_i Σ_t m_it·s_it / T_max  +  kl_coef·(1/N) Σ_i Σ_t m_it·k3_it / T_max

T_max = `max_tokens` is a constant (not the sequence length): Dr. GRPO's fix for GRPO's length bias.
Padded positions are excluded with torch.where, not multiplied by 0, so any value there (even nan/inf) is inert.
"""

from __future__ import annotations

import torch

from tba.algorithm.objectives.groups import check_token_inputs, group_mean


def dr_grpo_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                 reward: torch.Tensor, group: torch.Tensor, *, clip_eps: float = 0.2, kl_coef: float = 0.0,
                 max_tokens: int) -> torch.Tensor:
    """Scalar loss. logp, behaviour_logp, ref_logp, mask: [N, R] per token; reward, group: [N]."""
    check_token_inputs(logp, behaviour_logp, ref_logp, mask, reward, group, max_tokens)
    valid = mask > 0  # real response tokens
    reward = reward.to(logp.dtype)
    adv = (reward - group_mean(reward, group)).detach()[:, None]  # A_i = r_i − r̄_g, broadcast over tokens
    log_ratio = torch.where(valid, logp - behaviour_logp.detach().to(logp.dtype), 0.0)  # log ρ_it (0 on padding)
    ratio = log_ratio.exp()  # ρ_it
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)  # s_it
    per_seq = torch.where(valid, surrogate, 0.0).sum(dim=1) / max_tokens  # Σ_t m·s / T_max
    loss = -per_seq.mean()  # −(1/N) Σ_i
    if kl_coef > 0:
        diff = torch.where(valid, ref_logp.detach().to(logp.dtype) - logp, 0.0)  # ref − logp (0 on padding → k3 = 0)
        k3 = diff.exp() - diff - 1.0  # k3_it
        loss = loss + kl_coef * (k3.sum(dim=1) / max_tokens).mean()  # + kl_coef·(1/N) Σ_i Σ_t m·k3 / T_max
    return loss
