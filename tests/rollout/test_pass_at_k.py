"""The unbiased pass@k against brute force: the share of all k-subsets of the n samples that hold a pass."""

import itertools
import random

import pytest

from tba.rollout.pass_at_k import pass_at_k, pass_metrics, passes_per_prompt


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_pass(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_large_n_neither_overflows_nor_leaves_zero_one():
    assert 0.0 < pass_at_k(2000, 3, 10) < 1.0 and pass_at_k(2000, 1991, 10) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_pass_metrics_count_per_prompt_and_average_over_prompts():
    rng = random.Random(0)
    values = [rng.choice([0.0, 1.0, 0.5]) for _ in range(3 * 4)]  # 3 prompts × 4 samples, prompt-major
    counts = passes_per_prompt(values, 4, threshold=1.0)
    assert counts == [sum(v >= 1.0 for v in values[i:i + 4]) for i in (0, 4, 8)]
    m = pass_metrics(values, 4, [1, 2], threshold=0.5)
    assert m["pass@1"] == pytest.approx(sum(v >= 0.5 for v in values) / 12)
    assert m["reward_mean"] == pytest.approx(sum(values) / 12)
    assert m["pass@2"] >= m["pass@1"]
