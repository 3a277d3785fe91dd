"""Training objectives: one short file each, all fed by the same searchers and buffer — and this registry.

`OBJECTIVES` declares each objective once: where its loss lives and what it needs. Config validation, the
run builder and the benchmarks read it, so adding an objective is one file plus one line here. It imports no
torch (config validation must stay light): the loss is a `tba.plugins` target, loaded on first use.

    per_token        the loss takes [N, R] per-token log-probs and a mask; otherwise [N] sequence sums
    reads_behaviour  it uses the searchers' behaviour log-probs (importance ratios): samples must carry them
    owns_reference   the trainer keeps and updates its own π_ref copy (TBA′ resets it every ρ steps)
    options          the loss's keyword arguments: "beta" is the scheduled β, "tb.<field>" a field of the
                     `tb` config section, any other value a field of the `baselines` section

Calls: per-token  fn(logp, behaviour_logp, ref_logp, mask, reward, group, **options, max_tokens=R)
       sequence   fn(seq_logp, seq_ref_logp, reward, group, **options)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tba.plugins import load_object


@dataclass(frozen=True)
class Objective:
    name: str
    target: str
    """The loss function, `module:function`."""
    summary: str
    per_token: bool = False
    reads_behaviour: bool = False
    owns_reference: bool = False
    options: tuple[tuple[str, str], ...] = ()

    @cached_property
    def fn(self):
        return load_object(self.target, "objective")

    def loss(self, *, logp, mask, ref_logp, behaviour_logp, reward, group, beta: float, baselines, tb,
             max_tokens: int):
        """logp, ref_logp, behaviour_logp, mask: [N, R] per-token (padding masked); reward, group: [N].
        baselines, tb: the `baselines` and `tb` config sections. Returns the scalar loss."""
        options = {kw: beta if source == "beta" else getattr(tb, source[3:]) if source.startswith("tb.")
                   else getattr(baselines, source) for kw, source in self.options}
        if self.per_token:
            return self.fn(logp, behaviour_logp, ref_logp, mask, reward, group, **options, max_tokens=max_tokens)
        # sequence-level: log π(y|x) = Σ_t log π(y_t | x, y_<t) over the response tokens, [N]
        return self.fn((logp * mask).sum(-1), (ref_logp * mask).sum(-1), reward, group, **options)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("tb", "tba.algorithm.objectives.tb:vargrad_tb_loss", "VarGrad Trajectory Balance (the paper's objective)",
              options=(("beta", "beta"), ("residual_clip", "tb.residual_clip"))),
    Objective("dr_grpo", "tba.algorithm.objectives.dr_grpo:dr_grpo_loss",
              "Dr. GRPO: clipped PPO ratio to the behaviour policy, group-mean baseline",
              per_token=True, reads_behaviour=True, options=(("clip_eps", "clip_eps"), ("kl_coef", "kl_coef"))),
    Objective("rloo", "tba.algorithm.objectives.rloo:rloo_loss", "REINFORCE leave-one-out with a KL-shaped reward",
              options=(("beta", "beta"),)),
    Objective("online_dpo", "tba.algorithm.objectives.online_dpo:online_dpo_loss",
              "online DPO on the best and worst sample of each group", options=(("beta", "beta"),)),
    Objective("tba_prime", "tba.algorithm.objectives.tba_prime:tba_prime_loss",
              "TBA′: the VarGrad-TB advantage with clipped importance weights, π_ref reset every ρ",
              per_token=True, reads_behaviour=True, owns_reference=True,
              options=(("beta", "beta"), ("clip_ratio", "importance_clip"))),
)}

__all__ = ["OBJECTIVES", "Objective"]
