"""TBA′ (paper App. C, §5.4, §6 "TBA′"): Dr. GRPO with the KL inside the advantage and CISPO-style weights.

For sequence i of N in prompt group g(i), response tokens t with mask m_it, behaviour policy μ (the searcher's):

    KL̂_i = SG[ Σ_t m_it·(log π_θ(y_it) − log π_ref(y_it)) ]
    A_i  = SG[ (r_i − mean_g r) − β·(KL̂_i − mean_g KL̂) ]
    w_it = SG[ min(exp(log π_θ(y_it) − log μ(y_it)), clip_ratio) ]
    L    = −(1/N) Σ_i Σ_t m_it · w_it · A_i · log π_θ(y_it) / T_max      (T_max = `max_tokens`, Dr. GRPO style)

A_i is exactly the on-policy VarGrad-TB advantage of §2.3, so on-policy (w = 1) the gradient of L is that of
vargrad_tb_loss scaled by β/(2·T_max). No std normalisation.

The reference policy is reset to the current policy every ρ updates (ρ = 50 in paper Table 4): TBA′ scores π_ref
with its own copy, `ResettingReference`, which the trainer consults instead of the searchers' log-probs.

Detaching w: the paper's author describes "importance sampling with CISPO clip_ratio = 8" on PRIME-RL's ratio loss,
whose snapshot clamps π_θ/π_old into [0, 8]; whether PRIME-RL detaches that ratio could not be confirmed (reference
§6), so we detach it as true CISPO does: the clamped ratio only weights a REINFORCE term and the gradient flows
through log π_θ alone.
Padded positions are excluded with torch.where, not multiplied by 0, so any value there (even nan/inf) is inert.
"""

from __future__ import annotations

import torch

from tba.algorithm.objectives.groups import check_token_inputs, group_mean
from tba.models.logprobs import CHUNK_TOKENS, response_logprobs


def tba_prime_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                   reward: torch.Tensor, group: torch.Tensor, beta: float, *, clip_ratio: float = 8.0,
                   max_tokens: int) -> torch.Tensor:
    """Scalar loss. logp, behaviour_logp, ref_logp, mask: [N, R] per token; reward, group: [N]."""
    check_token_inputs(logp, behaviour_logp, ref_logp, mask, reward, group, max_tokens)
    valid = mask > 0  # real response tokens
    reward = reward.to(logp.dtype)
    kl = torch.where(valid, logp - ref_logp.to(logp.dtype), 0.0).sum(dim=1).detach()  # KL̂_i
    adv = ((reward - group_mean(reward, group)) - beta * (kl - group_mean(kl, group))).detach()  # A_i
    log_ratio = torch.where(valid, logp - behaviour_logp.to(logp.dtype), 0.0).detach()  # log π_θ/μ (0 on padding)
    weight = log_ratio.exp().clamp(max=clip_ratio)  # w_it = min(ρ_it, clip_ratio), detached
    per_token = torch.where(valid, weight * logp, 0.0)  # m_it·w_it·log π_θ(y_it)
    per_seq = adv * per_token.sum(dim=1) / max_tokens  # A_i Σ_t m·w·log π_θ / T_max
    return -per_seq.mean()  # −(1/N) Σ_i


class ResettingReference:
    """TBA′'s own π_ref: a frozen copy of the starting policy that scores the reference log-probs of every update,
    reset to the policy every `every` (ρ) updates — the searchers' π_ref log-probs are of the run's start and would
    not follow the resets. The trainer calls `updated` after each applied update."""

    def __init__(self, model, every: int | None, chunk_tokens: int = CHUNK_TOKENS):
        """`chunk_tokens`: the LM head's positions per chunk (trainer.logprob_chunk_tokens; 0 = plain)."""
        self.model, self.every = model.eval().requires_grad_(False), every
        self.chunk_tokens = chunk_tokens

    @torch.no_grad()
    def logprobs(self, prompts: list[list[int]], responses: list[list[int]], temperature: float,
                 pad_id: int) -> torch.Tensor:
        """[N, R] per-token log π_ref of the responses (logits ÷ T), padding 0."""
        return response_logprobs(self.model, prompts, responses, temperature, pad_id, self.chunk_tokens)[0]

    def updated(self, policy_state, version: int) -> None:
        """`policy_state()`: the policy's whole state dict (read only when a reset is due)."""
        if self.every and version % self.every == 0:
            self.model.load_state_dict(policy_state())  # π_ref ← π_θ every ρ updates
