"""Training objectives: one short file each, all fed by the same searchers and buffer — and this registry.

`OBJECTIVES` declares each objective once: where its loss lives, what it needs, and which settings it takes.
Config validation, the run builder and the benchmarks read it, so adding an objective is one file plus one line
here. It imports no torch (config validation must stay light): the loss is a `tba.plugins` target, loaded when
a run binds it.

    per_token        the loss takes [N, R] per-token log-probs and a mask; otherwise [N] sequence sums
    reads_behaviour  it uses the searchers' behaviour log-probs (importance ratios): samples must carry them
    owns_reference   it scores π_ref with its own copy, which it updates (TBA′ resets it every ρ updates)
    targets_pi_star  its fixed point is TB's π* ∝ π_ref·exp(r/β) (data it would weigh below π_ref is warned of)
    uses_beta        it takes the scheduled β (tb.beta_*); Dr. GRPO does not
    settings         its own settings, read once from the config when a run binds it (`bind`)

A run binds its objective once (`Objective.bind`): the result, a `Loss`, is all the trainer sees —

    per-token  fn(logp, behaviour_logp, ref_logp, mask, reward, group, [beta=β,] **settings, max_tokens=R)
    sequence   fn(seq_logp, seq_ref_logp, reward, group, [beta=β,] **settings)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from tba.plugins import load_object


@dataclass(frozen=True)
class Loss:
    """An objective bound to its settings: called by the trainer with one micro-batch and the update's β."""

    name: str
    fn: Callable
    per_token: bool
    reads_behaviour: bool
    uses_beta: bool

    def __call__(self, *, logp, mask, ref_logp, behaviour_logp, reward, group, beta: float):
        """logp, ref_logp, behaviour_logp, mask: [N, R] per-token (padding masked); reward, group: [N]."""
        scheduled = {"beta": beta} if self.uses_beta else {}
        if self.per_token:
            return self.fn(logp, behaviour_logp, ref_logp, mask, reward, group, **scheduled)
        # sequence-level: log π(y|x) = Σ_t log π(y_t | x, y_<t) over the response tokens, [N]
        return self.fn((logp * mask).sum(-1), (ref_logp * mask).sum(-1), reward, group, **scheduled)


@dataclass(frozen=True)
class Objective:
    name: str
    target: str
    """The loss function, `module:function`."""
    summary: str
    per_token: bool = False
    reads_behaviour: bool = False
    owns_reference: bool = False
    targets_pi_star: bool = False
    uses_beta: bool = True
    settings: Callable = field(default=lambda tb, baselines: {}, compare=False)
    """(tb, baselines) config sections → the loss's own keyword arguments."""

    def bind(self, tb, baselines, *, max_tokens: int) -> Loss:
        """The loss with its settings (and, per token, T_max = `max_tokens`) fixed: what a trainer takes."""
        fn = partial(load_object(self.target, "objective"), **self.settings(tb, baselines),
                     **({"max_tokens": max_tokens} if self.per_token else {}))
        return Loss(self.name, fn, self.per_token, self.reads_behaviour, self.uses_beta)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("tb", "tba.algorithm.objectives.tb:vargrad_tb_loss", "VarGrad Trajectory Balance (the paper's objective)",
              targets_pi_star=True, settings=lambda tb, b: {"residual_clip": tb.residual_clip}),
    Objective("dr_grpo", "tba.algorithm.objectives.dr_grpo:dr_grpo_loss",
              "Dr. GRPO: clipped PPO ratio to the behaviour policy, group-mean baseline", per_token=True,
              reads_behaviour=True, uses_beta=False,
              settings=lambda tb, b: {"clip_eps": b.clip_eps, "kl_coef": b.kl_coef}),
    Objective("rloo", "tba.algorithm.objectives.rloo:rloo_loss", "REINFORCE leave-one-out with a KL-shaped reward"),
    Objective("online_dpo", "tba.algorithm.objectives.online_dpo:online_dpo_loss",
              "online DPO on the best and worst sample of each group"),
    Objective("tba_prime", "tba.algorithm.objectives.tba_prime:tba_prime_loss",
              "TBA′: the VarGrad-TB advantage with clipped importance weights, π_ref reset every ρ",
              per_token=True, reads_behaviour=True, owns_reference=True,
              settings=lambda tb, b: {"clip_ratio": b.importance_clip}),
)}

__all__ = ["OBJECTIVES", "Loss", "Objective"]
