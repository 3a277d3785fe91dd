"""The sampling rule's pieces, as pure functions (the buffer's draws as a whole: test_buffer.py)."""

import numpy as np
import pytest

from tba.algorithm.sampling import Rule, draw_spread, pick_prompt, priorities, young
from tba.algorithm.types import Sample


def sample(reward=0.0, version=0, source="policy"):
    return Sample([1], [0.0], reward, version, source=source)


def test_a_pool_is_drawn_without_replacement_and_refills_when_exhausted():
    rng, used = np.random.default_rng(0), set()
    first = [pick_prompt(rng, [1, 2, 3], used) for _ in range(3)]
    assert sorted(first) == [1, 2, 3] and used == {1, 2, 3}
    assert pick_prompt(rng, [1, 2, 3], used) in (1, 2, 3) and len(used) == 1  # a new pass


def test_offline_priorities_are_softmax_of_iota_times_reward():
    items = [sample(0.0), sample(1.0), sample(2.0)]
    assert priorities(items, 0.0) is None  # ι = 0: uniform
    p = priorities(items, 1.0)
    assert p == pytest.approx(np.exp([0, 1, 2]) / np.exp([0, 1, 2]).sum())


def test_the_age_cap_spares_the_sources_that_do_not_age():
    items = [sample(version=1), sample(version=9), sample(version=1, source="teacher")]
    rule = Rule(online_prob=1.0, inverse_temperature=0.0, max_sample_age=3, aging=frozenset({"policy"}))
    assert young(items, 10, rule) == items[1:]  # the stale policy sample goes; the fixed teacher's stays
    assert young(items, 10, Rule(1.0, 0.0)) == items  # no cap
    assert young(items, None, rule) == items  # no version given: nothing to measure against


def test_a_spread_draw_takes_one_of_each_reward_value_first():
    rng = np.random.default_rng(0)
    one_right = [sample(0.0) for _ in range(5)] + [sample(1.0)]
    one_wrong = [sample(1.0) for _ in range(5)] + [sample(0.0)]
    for _ in range(50):  # a uniform 4 of 6 would leave the odd one out a third of the time
        assert sorted(x.reward for x in draw_spread(rng, one_right, 4)) == [0.0, 0.0, 0.0, 1.0]
        assert sorted(x.reward for x in draw_spread(rng, one_wrong, 4)) == [0.0, 1.0, 1.0, 1.0]
    drawn = draw_spread(rng, one_right, 4)
    assert len({id(x) for x in drawn}) == 4  # without replacement
    short = draw_spread(rng, one_right[4:], 4)  # fewer than K: each once, then with replacement
    assert len(short) == 4 and {id(x) for x in short} == {id(x) for x in one_right[4:]}


def test_a_spread_draw_of_distinct_rewards_is_uniform():
    items = [sample(float(r)) for r in range(6)]
    rng = np.random.default_rng(1)
    counts = np.zeros(6)
    for _ in range(3000):
        for x in draw_spread(rng, items, 2):
            counts[int(x.reward)] += 1
    assert counts / counts.sum() == pytest.approx(np.full(6, 1 / 6), abs=0.02)
