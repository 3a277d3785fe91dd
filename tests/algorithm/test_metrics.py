"""What one update measures besides the trainer's own numbers (tba.algorithm.metrics)."""

import pytest

from tba.algorithm.buffer import ReplayBuffer
from tba.algorithm.metrics import step_metrics
from tba.algorithm.types import Draw, Group, Sample


def sample(reward, version=0):
    return Sample([1], [0.0], reward, version)


def test_the_share_of_groups_with_a_reward_signal_and_the_staleness_of_the_draw():
    buffer = ReplayBuffer(seed=0)
    buffer.add(Group(0, [1], [sample(0.0), sample(1.0)]))
    draws = [Draw(0, [1], [sample(0.0, 1), sample(1.0, 1)], online=True),  # rewards differ: a reward signal
             Draw(1, [2], [sample(0.0, 0), sample(0.0, 0)], online=False)]  # all equal: VarGrad cancels the reward
    m = step_metrics({"trainer/loss": 1.0}, draws=draws, version=3, buffer=buffer, fresh=[1.0], received=2,
                     busy_fraction=1.0, searchers={}, wall_clock_s=1.0)
    assert m["buffer/mixed_reward_fraction"] == 0.5 and m["buffer/online_fraction"] == 0.5
    assert m["staleness/mean"] == pytest.approx(2.5) and m["staleness/max"] == 3
    assert m["buffer/draw_reward_mean"] == 0.25 and m["trainer/loss"] == 1.0
