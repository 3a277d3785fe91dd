"""bench/perf/step_cost.py: the overlap limit it derives from tba sync at one and at all threads, and --smoke end to end
(every system's column, the limit, the last line)."""

import pytest

pytest.importorskip("trl")


@pytest.fixture
def step_cost(monkeypatch, bench_script):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return bench_script("bench.perf.step_cost")  # which imports vs_trl as the script would


def run(step_cost, total: float, **phases) -> dict:
    return {"per_update": {**{p: 0.0 for p in step_cost.PHASES}, **phases, "total": total}}


def test_the_limit_is_the_better_of_perfect_overlap_and_taking_turns(step_cost):
    # one thread: search 0.2 (generation 0.15 + reference 0.05), trainer 0.3; two threads: 0.12 + 0.18
    one = run(step_cost, 0.5, generation=0.15, reference=0.05, forward=0.3)
    two = run(step_cost, 0.3, generation=0.09, reference=0.03, forward=0.18)
    text = step_cost.overlap_limit({"tba-sync-1t": [one], "tba-sync": [two], "tba-async": [run(step_cost, 0.33)]})
    assert "limit 0.3000 s per update" in text  # max(0.2, 0.3) = 0.3 = 0.12 + 0.18: a tie
    assert "1.10× the limit (+10 %)" in text
    fast_turns = run(step_cost, 0.25, generation=0.1, forward=0.15)  # taking turns on both cores beats overlap
    assert "limit 0.2500 s" in step_cost.overlap_limit({"tba-sync-1t": [one], "tba-sync": [fast_turns]})
    assert step_cost.overlap_limit({"tba-sync": [two]}) == ""  # no one-thread run: no limit claimed


@pytest.mark.slow
def test_smoke_times_every_system_and_prints_the_limit(step_cost, tmp_path, capsys):
    results = tmp_path / "step_cost.md"
    assert step_cost.main(["--smoke", "--out", str(tmp_path / "out"), "--results", str(results),
                           f"sft.cache_dir={tmp_path / 'cache'}"]) == 0
    text = results.read_text()
    assert "| phase (s per update) | tba-sync | tba-async | trl | tba-sync-1t |" in text
    assert "## Overlap limit" in text and "tba-async:" in text
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("per update (s): tba-sync ") and "start-up (s): tba " in last
