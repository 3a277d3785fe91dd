"""pass@k from n sampled completions per prompt: what `tba eval --samples N --k 1 5 …` reports besides greedy pass@1.

Why the unbiased estimator (Chen et al. 2021, the Codex paper) rather than "did any of k samples pass": drawing
exactly k samples per prompt gives a noisy 0/1 per prompt; drawing n ≥ k and counting the c that pass gives, per
prompt, the exact probability that a random k-subset of the n holds at least one pass,

    pass@k = 1 − C(n − c, k) / C(n, k)         (1 when n − c < k)

averaged over prompts — unbiased for the pass@k of k fresh samples, with a variance that falls as n grows.
It is computed as a product (1 − Π_{i=n−c+1}^{n} (1 − k/i)) so that large n never overflows a binomial.

A completion *passes* when its reward is at least `threshold` (1.0: a 0/1 verifier's correct answer); a reward
that raised or was not finite counts as a fail, as in the in-run evaluation.
"""

from __future__ import annotations

import math

from tba.rollout.evaluate import Completions
from tba.tasks.base import TaskAdapter


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with `c` passing completions out of `n` (k ≤ n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def rewards(task, c: Completions) -> list[float]:
    """Each completion's reward (0 where the reward raised or was not finite), in `c`'s order."""
    values, _ = TaskAdapter.of(task).batch_rewards(c.prompts, c.texts, c.finished, c.responses)
    return [v or 0.0 for v in values]


def passes_per_prompt(values: list[float], n: int, threshold: float) -> list[int]:
    """How many of each prompt's `n` completions pass (completions prompt-major, n per prompt, as `complete` and
    `run_episodes` order them)."""
    if len(values) % n:
        raise ValueError(f"{len(values)} completions are not {n} per prompt")
    return [sum(v >= threshold for v in values[i:i + n]) for i in range(0, len(values), n)]


def pass_metrics(values: list[float], n: int, ks: list[int], threshold: float = 1.0) -> dict[str, float]:
    """{pass@k for each k, reward_mean, pass_rate (the share of all completions that pass)} over prompts."""
    counts = passes_per_prompt(values, n, threshold)
    if not counts:
        return {}
    out = {f"pass@{k}": sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ks}
    out["reward_mean"] = sum(values) / len(values)
    out["pass_rate"] = sum(counts) / (n * len(counts))
    return out
