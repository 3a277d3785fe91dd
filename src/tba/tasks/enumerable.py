"""`enumerable`: a task whose KL-regularised optimum π* is known exactly, so convergence is a number.

One prompt (the alphabet itself, "012") answered by a string of `length` symbols from an alphabet of `symbols`
digits ("0", "1", …). The reward is a seeded table with `modes` modes of different heights:

    r(y) = max_m h_m · decay^{d_H(y, c_m)}     y a string of `length` symbols, d_H the Hamming distance,
    h_m  = 1 − height_step · m                 c_m seeded centres, pairwise ≥ 2 apart where possible
    r(y) = junk_reward                         any other text (a response that stopped early, or spent a
                                               token on a special token, decodes to fewer symbols)

The policy is the builtin tiny model with no SFT, so it starts at π_ref (the reference is its start).
`corpus()` (digit strings) trains a tokenizer with exactly one token per symbol (digits are split one per
token, so BPE can merge nothing) plus its three specials <pad>, <bos>, <eos>: V = symbols + 3.

**Why the enumeration is the sampler's whole response space, specials and early EOS included.**
`tba.models.generation.generate` draws every token of the vocabulary, specials too, and stops at EOS or after
M = search.max_new_tokens tokens; the trainer's log π (`response_logprobs`) is the full softmax at every
position, EOS kept. Masking the specials would make this task's π_θ something other than what the sampler
and the trainer use (both would have to mask, identically). So nothing is masked: the task enumerates

    Y = { s·EOS : s ∈ (V∖EOS)^j, 0 ≤ j < M } ∪ (V∖EOS)^M       |Y| = Σ_{j<M} (V−1)^j + (V−1)^M

— every response `generate` can return, and only those — scores each y with `response_logprobs` itself
(logits ÷ T, EOS included), and rewards it with this task's `reward` of its decoded text, as the searcher
does. Σ_Y π_θ(y) = 1 then holds exactly (reported as `policy_mass`, a check that Y is the support). With
M = length, the strings of `length` symbols are the responses that reach M with no special token; every
other y carries junk_reward. The defaults, 3 symbols and length 3: V = 6, |Y| = 156 (4 and 4: 1555).

Why so small by default: from a never-synced behaviour π_ref, TB learns a response at a rate set by how often
π_ref samples it. At 4 symbols × 4 (β 0.2) the top mode has π*/π_ref ≈ 160, and a never-synced run is still far
from π* after hundreds of updates; at 3 × 3 (β 0.3, ratio ≈ 40) it converges within 600 updates
(tests/tasks/test_enumerable.py) — the floor then is that of SGD at lr 1e-3, not coverage.

**Exact evaluation** (`exact_metrics`, called by tba.rollout.evaluate with the run's `Scoring`):

    log π*(y)       = log π_ref(y) + r(y)/β − log Z,   log Z = logsumexp_{y∈Y} (log π_ref(y) + r(y)/β)
    kl_to_target    = Σ_y π*(y) (log π*(y) − log π_θ(y))      KL(π* ‖ π_θ), nats
    kl_reverse      = Σ_y π_θ(y) (log π_θ(y) − log π*(y))     KL(π_θ ‖ π*)
    expected_reward = Σ_y π_θ(y) r(y)                         (target_expected_reward: the same under π*)

β is that of the run's last update (TB's target at the end), π_θ and π_ref are both at the trainer's
temperature T (it divides logits by search.temperature, as the searchers do for log π_ref). With
search.top_p < 1 the sampler draws from a truncated π_θ; what is measured is still the trainer's π_θ, the
distribution it regresses, which then never sees the responses outside the nucleus.
"""

from __future__ import annotations

import itertools
import math
import random

import torch

from tba.errors import ConfigError
from tba.models.logprobs import response_logprobs
from tba.tasks.base import Prompt, Scoring, batch_rewards

MAX_RESPONSES = 50_000
"""Largest response space `exact_metrics` enumerates (a few seconds of tiny-model forwards on a CPU)."""


class EnumerableTask:
    name = "enumerable"

    def __init__(self, symbols: int = 3, length: int = 3, modes: int = 3, seed: int = 0, decay: float = 0.5,
                 height_step: float = 0.15, junk_reward: float = -1.0):
        if not 2 <= symbols <= 10:
            raise ConfigError(f"task.options: symbols: 2..10 (one digit each), got {symbols}")
        if length < 1 or not 1 <= modes <= symbols ** length or 1 - height_step * (modes - 1) <= 0:
            raise ConfigError(f"task.options: need length ≥ 1, 1 ≤ modes ≤ symbols^length and positive heights; got "
                              f"length {length}, modes {modes}, height_step {height_step}")
        self.symbols, self.length, self.decay, self.junk_reward = symbols, length, decay, junk_reward
        self.alphabet = "".join(str(i) for i in range(symbols))
        rng = random.Random(seed)
        strings = ["".join(p) for p in itertools.product(self.alphabet, repeat=length)]
        self.centres: list[str] = []
        for _ in range(10_000):  # seeded centres, pairwise ≥ 2 apart while that is possible
            c = rng.choice(strings)
            if c not in self.centres and all(_hamming(c, d) >= 2 for d in self.centres):
                self.centres.append(c)
                if len(self.centres) == modes:
                    break
        while len(self.centres) < modes:  # too many modes for distance 2: any distinct strings
            c = rng.choice(strings)
            if c not in self.centres:
                self.centres.append(c)
        self.heights = [1.0 - height_step * m for m in range(modes)]
        self.table = {s: max(h * decay ** _hamming(s, c) for h, c in zip(self.heights, self.centres, strict=True))
                      for s in strings}
        # the prompt is the alphabet, not empty: with the prompt <bos> alone, a response that starts with <bos>
        # is invisible to the model (causal attention over identical tokens gives identical hidden states, RoPE
        # or not), so p(·|<bos><bos>) = p(·|<bos>) and π* is out of the model's reach
        self.train = [Prompt(0, self.alphabet, "", {})]
        self.test = [Prompt(0, self.alphabet, "", {})]

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.table.get(completion, self.junk_reward)

    def corpus(self) -> list[str]:
        """Digit strings: the builtin tokenizer gets one token per symbol and nothing else (no merges)."""
        return [self.alphabet * 4] * 8

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        """Uniformly random symbol strings (only if SFT is enabled; the recipe starts from the untrained model)."""
        rng = random.Random(seed)
        return ["".join(rng.choice(self.alphabet) for _ in range(self.length)) for _ in prompts]

    def exact_metrics(self, policy, reference, tokenizer, scoring: Scoring) -> dict[str, float]:
        """KL(π*‖π_θ), KL(π_θ‖π*), E_πθ[r] and Σπ_θ over every response the sampler can produce (module doc)."""
        prompt = tokenizer(self.test[0].text)["input_ids"]
        ys = response_space(policy.config.vocab_size, tokenizer.eos_token_id, scoring.max_new_tokens)
        logp = sequence_logprobs(policy, prompt, ys, scoring.temperature, tokenizer.pad_token_id)
        ref = sequence_logprobs(reference, prompt, ys, scoring.temperature, tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(ys, skip_special_tokens=True)
        finished = [y[-1] == tokenizer.eos_token_id for y in ys]
        rewards, error = batch_rewards(self, [self.test[0]] * len(ys), texts, finished)
        if error is not None:
            raise ValueError(f"enumerable: a reward failed: {error}")
        return exact_kl(logp, ref, rewards, scoring.beta)


def _hamming(a: str, b: str) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def response_space(vocab_size: int, eos_id: int, max_new_tokens: int) -> list[list[int]]:
    """Every response `tba.models.generation.generate` can return: j < M non-EOS tokens then EOS, or M non-EOS
    tokens."""
    others = [t for t in range(vocab_size) if t != eos_id]
    size = sum(len(others) ** j for j in range(max_new_tokens)) + len(others) ** max_new_tokens
    if size > MAX_RESPONSES:
        raise ValueError(f"enumerable: {size} responses for a vocabulary of {vocab_size} and "
                         f"search.max_new_tokens={max_new_tokens}, more than {MAX_RESPONSES}: lower task.options "
                         "symbols/length and search.max_new_tokens")
    space = [[*p, eos_id] for j in range(max_new_tokens) for p in itertools.product(others, repeat=j)]
    return space + [list(p) for p in itertools.product(others, repeat=max_new_tokens)]


def sequence_logprobs(model, prompt: list[int], responses: list[list[int]], temperature: float, pad_id: int,
                      batch_size: int = 1024) -> list[float]:
    """log π(y|x) = Σ_t log π(y_t | x, y_<t), logits ÷ T, computed by the trainer's own `response_logprobs`."""
    return contextual_logprobs(model, [prompt] * len(responses), responses, temperature, pad_id, batch_size)


def contextual_logprobs(model, contexts: list[list[int]], responses: list[list[int]], temperature: float,
                        pad_id: int, batch_size: int = 1024) -> list[float]:
    """`sequence_logprobs` with a context per response (a multi-turn history before each)."""
    was_training = model.training
    model.eval()
    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(responses), batch_size):
            logp_tok, mask = response_logprobs(model, contexts[start:start + batch_size],
                                               responses[start:start + batch_size], temperature, pad_id)  # [N, R]
            out += (logp_tok * mask).double().sum(-1).tolist()
    model.train(was_training)
    return out


def exact_kl(logp: list[float], ref_logp: list[float], rewards: list[float], beta: float) -> dict[str, float]:
    """The module docstring's formulas over an enumerated support (log π_θ, log π_ref, r per response)."""
    log_target_u = [lr + r / beta for lr, r in zip(ref_logp, rewards, strict=True)]  # log π_ref + r/β
    top = max(log_target_u)
    log_z = top + math.log(sum(math.exp(u - top) for u in log_target_u))
    log_target = [u - log_z for u in log_target_u]  # log π*
    target = [math.exp(x) for x in log_target]
    policy = [math.exp(x) for x in logp]
    return {
        "kl_to_target": sum(p * (lt - lp) for p, lt, lp in zip(target, log_target, logp, strict=True) if p > 0),
        "kl_reverse": sum(q * (lp - lt) for q, lp, lt in zip(policy, logp, log_target, strict=True) if q > 0),
        "expected_reward": sum(q * r for q, r in zip(policy, rewards, strict=True)),
        "target_expected_reward": sum(p * r for p, r in zip(target, rewards, strict=True)),
        "policy_mass": sum(policy),
    }
