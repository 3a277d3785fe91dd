"""bench/claims/smollm2_reeval.py: the larger held-out set starts with the run's own test problems and shares no
question with anything the run trained on; the paired standard error is that of the per-problem differences."""

import math

import pytest

pytest.importorskip("reasoning_gym")


@pytest.fixture
def reeval(bench_script):
    return bench_script("bench.claims.smollm2_reeval")


def test_held_out_keeps_the_runs_own_problems_first_and_nothing_trained_on(reeval):
    from tba.config import load_config
    from tba.run.build import build_task

    cfg = load_config("smollm2_rg_cpu", ["task.train_size=300", "task.test_size=40"])
    task, prompts = reeval.held_out(cfg, 200)
    run = build_task(cfg)
    questions = [p.meta["entry"]["question"] for p in prompts]
    assert questions[:40] == [p.meta["entry"]["question"] for p in run.test]
    assert len(set(questions)) == len(questions) > 40 + 100  # most extra draws survive the filter
    assert not set(questions) & {p.meta["entry"]["question"] for p in run.train}
    assert [p.id for p in prompts] == list(range(len(prompts))) and task.test == prompts


def test_paired_standard_error(reeval):
    a, b = [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]  # differences 0, 1, 0, 0: mean 0.25, sample sd 0.5
    assert reeval.paired_se(a, b) == pytest.approx(100 * 0.5 / math.sqrt(4))
    assert reeval.paired_se(a, a) == 0.0
    assert reeval.stderr(0.5, 100) == pytest.approx(5.0)
