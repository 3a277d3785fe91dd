"""Training objectives: one short file each, all fed by the same searchers and buffer.

Each objective is a plain function over per-sequence (or per-token) tensors returning a scalar loss.
`objective_loss` is the single place that maps a config name to the call, so the trainer stays one loop.
"""

from __future__ import annotations

import torch

from tba.objectives.dr_grpo import dr_grpo_loss
from tba.objectives.online_dpo import online_dpo_loss
from tba.objectives.rloo import rloo_loss
from tba.objectives.tb import beta_at, vargrad_tb_loss
from tba.objectives.tba_prime import tba_prime_loss

OBJECTIVES = ("tb", "dr_grpo", "rloo", "online_dpo", "tba_prime")
USES_BEHAVIOUR_LOGPROBS = {"dr_grpo", "tba_prime"}


def objective_loss(name: str, *, logp: torch.Tensor, mask: torch.Tensor, ref_logp: torch.Tensor,
                   behaviour_logp: torch.Tensor | None, reward: torch.Tensor, group: torch.Tensor, beta: float,
                   cfg, max_tokens: int) -> torch.Tensor:
    """logp, ref_logp, behaviour_logp, mask: [N, R] per-token (padding masked); reward, group: [N]."""
    if name == "dr_grpo":
        return dr_grpo_loss(logp, behaviour_logp, ref_logp, mask, reward, group, clip_eps=cfg.clip_eps,
                            kl_coef=cfg.kl_coef, max_tokens=max_tokens)
    if name == "tba_prime":
        return tba_prime_loss(logp, behaviour_logp, ref_logp, mask, reward, group, beta,
                              clip_ratio=cfg.importance_clip, max_tokens=max_tokens)
    seq_logp, seq_ref = (logp * mask).sum(-1), (ref_logp * mask).sum(-1)  # [N] summed over response tokens
    fn = {"tb": vargrad_tb_loss, "rloo": rloo_loss, "online_dpo": online_dpo_loss}[name]
    return fn(seq_logp, seq_ref, reward, group, beta)


__all__ = ["OBJECTIVES", "beta_at", "objective_loss", "vargrad_tb_loss", "dr_grpo_loss", "rloo_loss",
           "online_dpo_loss", "tba_prime_loss"]
