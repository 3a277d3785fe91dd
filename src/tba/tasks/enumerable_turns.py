"""`enumerable_turns`: a two-turn episode with a random observation between the turns, solved exactly.

The policy answers the prompt (the alphabet, as in `enumerable`) with y₁ — at most M = search.max_new_tokens
tokens —, the environment answers with one symbol o drawn from P(o | y₁), the policy answers again with y₂,
and the episode ends with

    r(τ) = ( decay^{d_H(y₁, c)} + h_o · decay^{d_H(y₂, c_o)} ) / 2      both y's strings of `length` symbols
    r(τ) = junk_reward                                                  otherwise

c and c_o seeded centres (the best second answer depends on what was observed), h_o = 1 − obs_step·o.
P(o | y₁) is a seeded table over the symbols, one row per decoded y₁ text, every entry ≥ min_prob/|O|
(full support); `stochastic: false` makes o a seeded function of y₁ instead.

**Two targets, and why they differ.** With log π summed over the policy's tokens only, the environment's
P(o|y₁) cancels in π_θ/π_ref — but the trajectory distribution π_ref(τ)·exp(r/β)/Z (π_ref(τ) including
P(o|y₁)) is not one any policy can produce: its observations follow π*(o|y₁) ∝ P(o|y₁)·Z₂(y₁, o), not the
environment's P(o|y₁). The KL-regularised optimum a policy *can* reach (max E[r] − β·KL over the policy's own
tokens) is the soft-Bellman one:

    log Z₂(y₁, o) = logsumexp_{y₂} ( log π_ref(y₂ | x y₁ o) + r(τ)/β )
    π°(y₂ | x y₁ o) = π_ref(y₂ | x y₁ o) · exp(r/β) / Z₂(y₁, o)
    π°(y₁ | x)      ∝ π_ref(y₁ | x) · exp( Σ_o P(o|y₁) · log Z₂(y₁, o) )

(an expectation over o where the trajectory target has a log-sum-exp). The two coincide when the environment
is deterministic. Evaluation reports both (`exact_metrics`):

    kl_to_target            KL(π° ‖ π_θ) over trajectories τ = (y₁, o, y₂), weighted by P(o|y₁)
    kl_reverse              KL(π_θ ‖ π°)
    kl_to_trajectory_target KL(π*_traj ‖ π_θ·P), π*_traj ∝ π_ref(τ)·exp(r/β)
    trajectory_target_floor the least KL(π*_traj ‖ π_θ·P) any policy reaches: Σ_{y₁} π*_traj(y₁)·
                            KL(π*_traj(o|y₁) ‖ P(o|y₁)) (0 for a deterministic environment)
    expected_reward         E_{π_θ·P}[r]; target_expected_reward the same under π°

Responses are enumerated as in `enumerable` (every sequence `generate` can return, specials and early EOS
included): with 3 symbols and M = 2, |Y| = 31 per turn and 31·3·31 = 2,883 trajectories.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import torch

from tba.errors import ConfigError
from tba.tasks.base import Prompt, Scoring
from tba.tasks.enumerable import contextual_logprobs, response_space


class TwoTurnEnv:
    """One episode: the first answer draws an observation, the second ends the episode."""

    def __init__(self, task: EnumerableTurnsTask, rng: random.Random):
        self.task, self.rng, self.actions, self.observation = task, rng, [], None

    def step(self, action: str) -> str | None:
        self.actions.append(action)
        if len(self.actions) == 1:
            probs = self.task.observation_probs(action)
            self.observation = self.rng.choices(self.task.alphabet, weights=probs)[0]
            return self.observation
        return None

    def get_reward(self) -> float:
        if len(self.actions) < 2:
            return self.task.junk_reward
        return self.task.trajectory_reward(self.actions[0], self.observation, self.actions[1])


class EnumerableTurnsTask:
    name = "enumerable_turns"

    def __init__(self, symbols: int = 3, length: int = 2, seed: int = 0, decay: float = 0.5, obs_step: float = 0.45,
                 min_prob: float = 0.1, stochastic: bool = True, junk_reward: float = -1.0):
        if not 2 <= symbols <= 10 or length < 1 or not 0 < obs_step * (symbols - 1) < 1 or not 0 < min_prob <= 1:
            raise ConfigError(f"task.options: need 2 ≤ symbols ≤ 10, length ≥ 1, 0 < obs_step·(symbols−1) < 1 and "
                              f"0 < min_prob ≤ 1; got symbols {symbols}, length {length}, obs_step {obs_step}, "
                              f"min_prob {min_prob}")
        self.symbols, self.length, self.seed, self.decay = symbols, length, seed, decay
        self.min_prob, self.stochastic, self.junk_reward = min_prob, stochastic, junk_reward
        self.alphabet = "".join(str(i) for i in range(symbols))
        rng = random.Random(seed)
        strings = ["".join(p) for p in itertools.product(self.alphabet, repeat=length)]
        self.centre = rng.choice(strings)
        self.obs_centres = {o: rng.choice(strings) for o in self.alphabet}
        self.obs_heights = {o: 1.0 - obs_step * i for i, o in enumerate(self.alphabet)}
        self._episodes = random.Random(seed + 1)  # the environment's own randomness, one stream per task object
        self.train = [Prompt(0, self.alphabet, "", {})]
        self.test = [Prompt(0, self.alphabet, "", {})]

    # --- the environment -------------------------------------------------------------------------------------

    def environment(self, prompt: Prompt) -> TwoTurnEnv:
        return TwoTurnEnv(self, random.Random(self._episodes.random()))

    def observation_probs(self, first: str) -> list[float]:
        """P(o | y₁) over the alphabet: a seeded row per decoded first answer (one-hot when not stochastic)."""
        rng = random.Random(f"{self.seed}:{first}")
        raw = [rng.random() for _ in self.alphabet]
        if not self.stochastic:
            return [float(i == raw.index(max(raw))) for i in range(self.symbols)]
        total = sum(raw)
        return [self.min_prob / self.symbols + (1 - self.min_prob) * x / total for x in raw]

    def _valid(self, s: str) -> bool:
        return len(s) == self.length and all(ch in self.alphabet for ch in s)

    def trajectory_reward(self, first: str, observation: str, second: str) -> float:
        if not (self._valid(first) and self._valid(second)):
            return self.junk_reward
        d1 = sum(a != b for a, b in zip(first, self.centre, strict=True))
        d2 = sum(a != b for a, b in zip(second, self.obs_centres[observation], strict=True))
        return (self.decay ** d1 + self.obs_heights[observation] * self.decay ** d2) / 2

    # --- the Task interface ------------------------------------------------------------------------------------

    def reward(self, prompt: Prompt, completion: str) -> float:
        """Single-turn use has no meaning here: episodes are scored by the environment."""
        raise TypeError("enumerable_turns is multi-turn: its episodes are scored by the environment")

    def corpus(self) -> list[str]:
        return [self.alphabet * 4] * 8

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[list[str]]:
        """Two turns per prompt, each a uniformly drawn valid answer (played through the environment, which draws
        the observation between them): a behaviour TB needs no log-prob of."""
        rng = random.Random(seed)
        answer = lambda: "".join(rng.choice(self.alphabet) for _ in range(self.length))  # noqa: E731
        return [[answer(), answer()] for _ in prompts]

    def tables(self, policy, reference, tokenizer, max_new_tokens: int, temperature: float) -> Tables:
        """Every trajectory's log-probs under `policy` and `reference`, P(o|y₁) and r, as [y₁, o, y₂] tensors."""
        prompt = tokenizer(self.test[0].text)["input_ids"]
        ys = response_space(policy.config.vocab_size, tokenizer.eos_token_id, max_new_tokens)
        n, s = len(ys), self.symbols
        texts = tokenizer.batch_decode(ys, skip_special_tokens=True)
        obs_ids = [tokenizer(o, add_special_tokens=False)["input_ids"] for o in self.alphabet]
        histories = [prompt + ys[i] + obs_ids[k] for i in range(n) for k in range(s)]
        contexts = [h for h in histories for _ in ys]
        second = [y for _ in histories for y in ys]

        def logps(model):
            first = contextual_logprobs(model, [prompt] * n, ys, temperature, tokenizer.pad_token_id)
            then = contextual_logprobs(model, contexts, second, temperature, tokenizer.pad_token_id)
            return torch.tensor(first, dtype=F64), torch.tensor(then, dtype=F64).view(n, s, n)

        pol1, pol2 = logps(policy)
        ref1, ref2 = logps(reference)
        p_obs = torch.tensor([self.observation_probs(t) for t in texts], dtype=F64)
        r = torch.tensor([[[self.trajectory_reward(texts[i], o, texts[j]) for j in range(n)] for o in self.alphabet]
                          for i in range(n)], dtype=F64)
        return Tables(pol1, pol2, ref1, ref2, p_obs, r)

    def exact_metrics(self, policy, reference, tokenizer, scoring: Scoring) -> dict[str, float]:
        """The module docstring's quantities over every trajectory the sampler and this environment can produce."""
        t = self.tables(policy, reference, tokenizer, scoring.max_new_tokens, scoring.temperature)
        beta = scoring.beta
        opt1, opt2 = soft_bellman(t.ref1, t.ref2, t.p_obs, t.reward, beta)
        log_opt = opt1[:, None, None] + opt2  # log π°(y₁ y₂ | o), [y₁, o, y₂]
        log_pol = t.pol1[:, None, None] + t.pol2
        p = t.p_obs[..., None].expand_as(log_opt)
        live = p > 0  # trajectories the environment can produce
        w_opt, w_pol = p * log_opt.exp(), p * log_pol.exp()
        # π*_traj ∝ π_ref(τ)·exp(r/β), π_ref(τ) including P(o|y₁)
        log_u = torch.where(live, t.ref1[:, None, None] + p.log() + t.ref2 + t.reward / beta, -math.inf)
        log_traj = log_u - torch.logsumexp(log_u.flatten(), 0)
        w_traj = log_traj.exp()
        # the floor: Σ_{y₁} π*_traj(y₁) · KL(π*_traj(o | y₁) ‖ P(o | y₁))
        mass_o = w_traj.sum(-1)  # [y₁, o]
        mass_1 = mass_o.sum(-1, keepdim=True)
        floor = torch.where(mass_o > 0, mass_o * (mass_o / mass_1 / t.p_obs).log(), 0.0)

        def total(x):
            return torch.where(live, x, 0.0).sum().item()

        return {"kl_to_target": total(w_opt * (log_opt - log_pol)), "kl_reverse": total(w_pol * (log_pol - log_opt)),
                "kl_to_trajectory_target": total(w_traj * (log_traj - log_pol - p.log())),
                "trajectory_target_floor": floor.sum().item(),
                "expected_reward": total(w_pol * t.reward), "target_expected_reward": total(w_opt * t.reward),
                "policy_mass": total(w_pol)}


F64 = torch.float64


@dataclass
class Tables:
    """One evaluation's enumeration, indexed [y₁] or [y₁, o, y₂] (o: the alphabet's order)."""

    pol1: torch.Tensor
    """log π_θ(y₁ | x)"""
    pol2: torch.Tensor
    """log π_θ(y₂ | x y₁ o)"""
    ref1: torch.Tensor
    ref2: torch.Tensor
    p_obs: torch.Tensor
    """P(o | y₁), [y₁, o]"""
    reward: torch.Tensor


def soft_bellman(ref1: torch.Tensor, ref2: torch.Tensor, p_obs: torch.Tensor, reward: torch.Tensor,
                 beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π°(y₁ | x) [y₁], log π°(y₂ | x y₁ o) [y₁, o, y₂]): the module docstring's optimum."""
    log_z2 = torch.logsumexp(ref2 + reward / beta, -1)  # [y₁, o]
    opt1 = torch.log_softmax(ref1 + (p_obs * log_z2).sum(-1), 0)
    return opt1, ref2 + reward / beta - log_z2[..., None]
