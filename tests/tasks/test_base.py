"""batch_rewards: the one place searchers and evaluation turn completions into rewards."""

import math

import pytest

from tba.errors import UserError
from tba.tasks.base import Prompt, RewardError, batch_rewards

P = [Prompt(id=i, text=f"q{i}", answer="") for i in range(3)]


class PerSample:
    def reward(self, prompt, completion):
        if completion == "boom":
            raise ValueError("cannot parse")
        return math.nan if completion == "nan" else float(len(completion))


class Batched(PerSample):
    def __init__(self, result):
        self.result = result

    def rewards(self, prompts, completions, finished):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_per_sample_rewards_drop_only_the_failing_ones():
    values, error = batch_rewards(PerSample(), P, ["ab", "boom", "nan"], [True] * 3)
    assert values == [2.0, None, None] and "prompt 2" in error and "nan" in error


def test_batched_reward_is_preferred_and_non_finite_values_are_dropped():
    values, error = batch_rewards(Batched([1.0, math.inf, -1.0]), P, ["a", "b", "c"], [True, True, False])
    assert values == [1.0, None, -1.0] and "prompt 1" in error


def test_a_raising_batched_reward_fails_the_batch_with_its_error():
    values, error = batch_rewards(Batched(RuntimeError("rm out of memory")), P, ["a", "b", "c"], [True] * 3)
    assert values == [None] * 3 and "rm out of memory" in error


def test_a_reward_that_returns_the_wrong_count_or_type_names_itself_in_one_line():
    """A broken contract, not a bad completion: every batch would fail alike, so it stops the run (a UserError: one
    line), naming the function, what it returned and what it must return."""
    with pytest.raises(RewardError) as e:
        batch_rewards(Batched([1.0]), P, ["a", "b", "c"], [True] * 3)
    assert str(e.value) == ("Batched.rewards returned 1 values for 3 completions; it must return a list of 3 numbers "
                            "(None to skip one)")
    with pytest.raises(RewardError, match=r"Batched.rewards returned 'high' \(str\) for completion 1; it must return "
                                          r"a number \(or None to skip\)"):
        batch_rewards(Batched([1.0, "high", 0.0]), P, ["a", "b", "c"], [True] * 3)

    class Single:
        name, train, test = "single", P, P

        def reward(self, prompt, completion):
            return "high"

    with pytest.raises(RewardError, match=r"Single.reward returned 'high' \(str\) for prompt"):
        batch_rewards(Single(), P, ["a", "b", "c"], [True] * 3)
    assert isinstance(RewardError("x"), UserError)
