"""VarGrad Trajectory Balance (paper §2.2) and its β schedule (§2.4).

For prompt x_i with responses y_i1..y_iK (log π summed over response tokens, logits ÷ T):

    δ_ij      = log Ẑ(x_i) + log π_θ(y_ij|x_i) − log π_ref(y_ij|x_i) − r(x_i, y_ij)/β
    log Ẑ(x_i) = SG[ (1/K) Σ_j ( r(x_i, y_ij)/β − log π_θ(y_ij|x_i) + log π_ref(y_ij|x_i) ) ]
    L         = mean over all sequences of δ²

The fixed point is π*(y|x) ∝ π_ref(y|x)·exp(r(x,y)/β), the KL-regularised RL optimum, and the regression
stays valid whatever policy generated y — which is why TBA needs no importance ratios for stale data.
Groups are given explicitly by id (never by reshape: the paper's reshape silently mixes prompts when the
micro-batch is not exactly one prompt's K samples, §7.3).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from tba.algorithm.objectives.groups import check_sequence_inputs, group_mean


def vargrad_log_z(logp: torch.Tensor, ref_logp: torch.Tensor, reward: torch.Tensor, group: torch.Tensor,
                  beta: float) -> torch.Tensor:
    """Per-sequence detached log Ẑ of its prompt group, shape [N]: the group mean of r/β − log π_θ + log π_ref."""
    return group_mean((reward / beta - logp + ref_logp).detach(), group)


def vargrad_tb_loss(logp: torch.Tensor, ref_logp: torch.Tensor, reward: torch.Tensor, group: torch.Tensor,
                    beta: float, residual_clip: float | None = None) -> torch.Tensor:
    """Mean squared TB residual. logp, ref_logp, reward, group: 1-D tensors of length N (one per sequence).

    residual_clip c: the Huber form ρ_c(δ) = δ² for |δ| ≤ c, 2c|δ| − c² beyond; its gradient 2·clamp(δ, −c, c)
    bounds how hard one sample pushes (a wrong answer's δ is ≈ r_max/β = 20 nats at β = 0.05) while every
    sample's zero, and so the fixed point π*, stays where δ² has it."""
    check_sequence_inputs(logp, ref_logp, reward, group)
    reward = reward.to(logp.dtype)
    ref_logp = ref_logp.to(logp.dtype)
    log_z = vargrad_log_z(logp, ref_logp, reward, group, beta)
    residual = log_z + logp - ref_logp - reward / beta  # δ
    if residual_clip is None:
        return residual.pow(2).mean()
    # ρ_c(δ) = 2·huber_c(δ), torch's huber being δ²/2 within c and c(|δ| − c/2) beyond
    return 2 * torch.nn.functional.huber_loss(residual, torch.zeros_like(residual), delta=residual_clip)


def beta_at(step: int, beta_init: float, beta_final: float, decay_end_step: int | None,
            hard_stop_step: int | None) -> float:
    """β for trainer update `step` (1-based), evaluated at the start of the update.

    β(u) = β_0·(1 − (u−1)/T_target) + β_final·(u−1)/T_target   for u < T_stop (clamped at β_final)
    β(u) = β_final                                               for u ≥ T_stop
    """
    if hard_stop_step is not None and step >= hard_stop_step:
        return beta_final
    if decay_end_step is None:
        return beta_init
    frac = min(max(step - 1, 0) / decay_end_step, 1.0)
    return beta_init * (1.0 - frac) + beta_final * frac


def beta_schedule(tb) -> Callable[[int], float]:
    """β as a function of the update (1-based), from the `tb` section: what a trainer is given."""
    return partial(beta_at, beta_init=tb.beta_init, beta_final=tb.beta_final, decay_end_step=tb.beta_decay_end_step,
                   hard_stop_step=tb.beta_hard_stop_step)
