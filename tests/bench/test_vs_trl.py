"""bench.perf.vs_trl's clocks: the time to a target read from evaluations, coarse and interpolated."""

import pytest

from bench.perf.vs_trl import crossing, time_to

EVALS = [(0, 0.13, 2.0), (20, 0.498, 245.0), (40, 0.576, 439.0), (60, 0.641, 627.0)]


def test_the_first_evaluation_at_or_above_the_target_and_the_line_through_the_two_around_it():
    assert time_to(EVALS, 0.5, 5400) == 439.0
    assert crossing(EVALS, 0.5, 5400) == pytest.approx(245.0 + 0.002 / 0.078 * 194.0)
    assert crossing(EVALS, 0.1, 5400) == 2.0  # reached at the first evaluation
    assert crossing(EVALS, 0.7, 5400) is None and time_to(EVALS, 0.7, 5400) is None
    assert crossing(EVALS, 0.5, 400) is None  # the evaluation that reached it is past the budget


def test_a_merge_source_may_name_the_system_whose_rows_it_gives():
    from pathlib import Path

    from bench.perf.vs_trl import merge_source

    assert merge_source("a/b_seed5.md:trl-grpo") == (Path("a/b_seed5.md"), "trl-grpo")
    assert merge_source("a/b_seed5.md") == (Path("a/b_seed5.md"), None)
    assert merge_source("c:/odd:name.md") == (Path("c:/odd:name.md"), None)  # not a system: the whole path
