"""Training objectives: one short file each, all fed by the same searchers and buffer — and this registry.

`OBJECTIVES` declares each objective once: where its loss lives and what it needs. Config validation,
the trainer, the run builder and the benchmarks all read it, so adding an objective is one file plus one
line here. It imports no torch (config validation must stay light): the loss function is imported on
first use.

    per_token        the loss takes [N, R] per-token log-probs and a mask; otherwise [N] sequence sums
    reads_behaviour  it uses the searchers' behaviour log-probs (importance ratios): samples must carry them
    owns_reference   the trainer keeps and updates its own π_ref copy (TBA′ resets it every ρ steps)
    options          the loss's keyword arguments: "beta" is the scheduled β, "tb.<field>" a field of the
                     `tb` config section, any other value a field of the `baselines` section

Calls: per-token  fn(logp, behaviour_logp, ref_logp, mask, reward, group, **options, max_tokens=R)
       sequence   fn(seq_logp, seq_ref_logp, reward, group, **options)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    name: str
    loss: str  # "module:function"
    per_token: bool
    reads_behaviour: bool
    owns_reference: bool
    options: tuple[tuple[str, str], ...]
    summary: str

    def fn(self) -> Callable:
        module, name = self.loss.split(":")
        return getattr(importlib.import_module(module), name)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("tb", "tba.objectives.tb:vargrad_tb_loss", False, False, False,
              (("beta", "beta"), ("residual_clip", "tb.residual_clip")),
              "VarGrad Trajectory Balance (the paper's objective)"),
    Objective("dr_grpo", "tba.objectives.dr_grpo:dr_grpo_loss", True, True, False,
              (("clip_eps", "clip_eps"), ("kl_coef", "kl_coef")),
              "Dr. GRPO: clipped PPO ratio to the behaviour policy, group-mean baseline"),
    Objective("rloo", "tba.objectives.rloo:rloo_loss", False, False, False, (("beta", "beta"),),
              "REINFORCE leave-one-out with a KL-shaped reward"),
    Objective("online_dpo", "tba.objectives.online_dpo:online_dpo_loss", False, False, False, (("beta", "beta"),),
              "online DPO on the best and worst sample of each group"),
    Objective("tba_prime", "tba.objectives.tba_prime:tba_prime_loss", True, True, True,
              (("beta", "beta"), ("clip_ratio", "importance_clip")),
              "TBA′: the VarGrad-TB advantage with clipped importance weights, π_ref reset every ρ"),
)}


def objective_loss(name: str, *, logp, mask, ref_logp, behaviour_logp, reward, group, beta: float, cfg,
                   max_tokens: int, tb=None):
    """logp, ref_logp, behaviour_logp, mask: [N, R] per-token (padding masked); reward, group: [N].
    cfg: the `baselines` config section; tb: the `tb` section. Returns the scalar loss."""
    spec = OBJECTIVES[name]
    options = {kw: beta if source == "beta" else getattr(tb, source[3:]) if source.startswith("tb.")
               else getattr(cfg, source) for kw, source in spec.options}
    if spec.per_token:
        return spec.fn()(logp, behaviour_logp, ref_logp, mask, reward, group, **options, max_tokens=max_tokens)
    # sequence-level: log π(y|x) = Σ_t log π(y_t | x, y_<t) over the response tokens, [N]
    return spec.fn()((logp * mask).sum(-1), (ref_logp * mask).sum(-1), reward, group, **options)


__all__ = ["OBJECTIVES", "Objective", "objective_loss"]
