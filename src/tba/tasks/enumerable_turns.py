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

import torch

from tba.errors import ConfigError
from tba.generation import response_logprobs
from tba.tasks.base import Prompt, Scoring
from tba.tasks.enumerable import response_space


def _logsumexp(xs: list[float]) -> float:
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


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

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        rng = random.Random(seed)
        return ["".join(rng.choice(self.alphabet) for _ in range(self.length)) for _ in prompts]

    @torch.no_grad()
    def exact_metrics(self, policy, reference, tokenizer, scoring: Scoring) -> dict[str, float]:
        """The module docstring's quantities over every trajectory the sampler and this environment can produce."""
        beta, temp, pad = scoring.beta, scoring.temperature, tokenizer.pad_token_id
        prompt = tokenizer(self.test[0].text)["input_ids"]
        ys = response_space(policy.config.vocab_size, tokenizer.eos_token_id, scoring.max_new_tokens)
        texts = tokenizer.batch_decode(ys, skip_special_tokens=True)
        obs_ids = [tokenizer(o, add_special_tokens=False)["input_ids"] for o in self.alphabet]
        was = [policy.training, reference.training]
        policy.eval(), reference.eval()
        first = {name: _logps(m, [prompt] * len(ys), ys, temp, pad) for name, m in (("p", policy), ("r", reference))}
        histories = [(i, k) for i in range(len(ys)) for k in range(self.symbols)]
        ctx = [prompt + ys[i] + obs_ids[k] for i, k in histories]
        flat_ctx = [c for c in ctx for _ in ys]
        flat_y2 = [y for _ in ctx for y in ys]
        second = {name: _logps(m, flat_ctx, flat_y2, temp, pad) for name, m in (("p", policy), ("r", reference))}
        policy.train(was[0]), reference.train(was[1])
        n = len(ys)
        out = {"kl_to_target": 0.0, "kl_reverse": 0.0, "kl_to_trajectory_target": 0.0, "trajectory_target_floor": 0.0,
               "expected_reward": 0.0, "target_expected_reward": 0.0, "policy_mass": 0.0}
        # per history h = (y₁, o): log Z₂(h), and every y₂'s reward
        rewards, log_z2 = {}, {}
        for h, (i, k) in enumerate(histories):
            o = self.alphabet[k]
            rewards[h] = [self.trajectory_reward(texts[i], o, texts[j]) for j in range(n)]
            log_z2[h] = _logsumexp([second["r"][h * n + j] + rewards[h][j] / beta for j in range(n)])
        probs = [self.observation_probs(t) for t in texts]
        value = [sum(probs[i][k] * log_z2[i * self.symbols + k] for k in range(self.symbols)) for i in range(n)]
        log_norm1 = _logsumexp([first["r"][i] + value[i] for i in range(n)])
        # π*_traj: log π_ref(τ) + r/β over every trajectory with P(o|y₁) > 0, and its normaliser
        traj = [(i, k, j) for i in range(n) for k in range(self.symbols) if probs[i][k] > 0 for j in range(n)]
        log_u = {(i, k, j): first["r"][i] + math.log(probs[i][k]) + second["r"][(i * self.symbols + k) * n + j]
                 + rewards[i * self.symbols + k][j] / beta for i, k, j in traj}
        log_z_traj = _logsumexp(list(log_u.values()))
        for i, k, j in traj:
            h = i * self.symbols + k
            p_o, r = probs[i][k], rewards[h][j]
            log_opt = (first["r"][i] + value[i] - log_norm1) + (second["r"][h * n + j] + r / beta - log_z2[h])
            log_pol = first["p"][i] + second["p"][h * n + j]
            w_opt, w_pol = p_o * math.exp(log_opt), p_o * math.exp(log_pol)
            log_traj = log_u[i, k, j] - log_z_traj
            w_traj = math.exp(log_traj)
            out["kl_to_target"] += w_opt * (log_opt - log_pol)
            out["kl_reverse"] += w_pol * (log_pol - log_opt)
            out["kl_to_trajectory_target"] += w_traj * (log_traj - log_pol - math.log(p_o))
            out["expected_reward"] += w_pol * r
            out["target_expected_reward"] += w_opt * r
            out["policy_mass"] += w_pol
        # the floor: Σ_{y₁} π*_traj(y₁) · KL(π*_traj(o | y₁) ‖ P(o | y₁))
        for i in range(n):
            mass_o = [sum(math.exp(log_u[i, k, j] - log_z_traj) for j in range(n)) if probs[i][k] > 0 else 0.0
                      for k in range(self.symbols)]
            m = sum(mass_o)
            out["trajectory_target_floor"] += sum(q * math.log(q / m / probs[i][k])
                                                  for k, q in enumerate(mass_o) if q > 0)
        return out


def _logps(model, prompts: list[list[int]], responses: list[list[int]], temperature: float, pad_id: int,
           batch_size: int = 1024) -> list[float]:
    """log π(y|context) summed over y's tokens, logits ÷ T, by the trainer's own `response_logprobs`."""
    out: list[float] = []
    for start in range(0, len(responses), batch_size):
        lp, mask = response_logprobs(model, prompts[start:start + batch_size], responses[start:start + batch_size],
                                     temperature, pad_id)
        out += (lp * mask).double().sum(-1).tolist()
    return out
