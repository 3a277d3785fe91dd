"""Length buckets (tba.models.length_buckets): the split of responses into forwards of their own padding."""

import itertools

import numpy as np
import pytest

from tba.models.length_buckets import length_buckets


def cost(lengths, runs, overhead):
    return sum(len(r) * max(lengths[i] for i in r) + overhead for r in runs)


def test_long_tailed_lengths_split_and_equal_lengths_do_not():
    lengths = [128, 30, 128, 25, 40, 35, 20, 128]
    runs = length_buckets(lengths, overhead=60)
    assert runs == [[0, 2, 7], [4, 5, 1, 3, 6]]  # the three stragglers apart; the rest padded to 40
    assert cost(lengths, runs, 60) < cost(lengths, [list(range(8))], 60)
    assert length_buckets([50] * 6, overhead=1) == [[0, 1, 2, 3, 4, 5]]
    assert length_buckets([9, 3], overhead=100) == [[0, 1]]  # a split saving less than a forward costs: none
    assert length_buckets([], 10) == [] and length_buckets([7], 10) == [[0]]


@pytest.mark.parametrize("seed", range(20))
def test_the_split_is_the_cheapest_of_all_contiguous_splits_of_the_sorted_lengths(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 60, size=int(rng.integers(2, 9))).tolist()
    overhead = float(rng.integers(0, 80))
    runs = length_buckets(lengths, overhead)
    assert sorted(i for r in runs for i in r) == list(range(len(lengths)))
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = min(cost(lengths, [order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)), strict=True)], overhead)
               for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k))
    assert cost(lengths, runs, overhead) == pytest.approx(best)
