"""bench/perf/vs_trl.py --smoke end to end (in-process): both systems run and the results file has a row each."""

import json

import pytest

pytest.importorskip("trl")


@pytest.mark.slow
def test_vs_trl_smoke_writes_a_row_per_system(tmp_path, monkeypatch, bench_script):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vs_trl = bench_script("bench.perf.vs_trl")
    results = tmp_path / "vs_trl.md"
    assert vs_trl.main(["--smoke", "--seeds", "0", "--budget-s", "5", "--out", str(tmp_path / "out"),
                        "--results", str(results), "--tba-sync", f"sft.cache_dir={tmp_path / 'cache'}"]) == 0

    text = results.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and "| 0 |" in line]
    assert [line.split("|")[1].strip() for line in table] == ["tba", "tba-sync", "trl-grpo"]
    rows = json.loads(text.split("```json\n")[1].split("```")[0])
    assert {r["system"] for r in rows} == {"tba", "tba-sync", "trl-grpo"}
    assert "tba-sync time-to" in text and "accuracy at 5 s median" in text
    assert all(r["steps"] >= 1 and r["evals"][0][0] == 0 for r in rows)
    assert results.with_suffix(".png").stat().st_size > 10_000  # the accuracy-vs-wall-clock figure
    assert rows[2]["train_s"] < 30  # the callback stopped TRL at its 5 s budget (max_steps is 10**6)
    assert all(r["startup_s"] > 0 for r in rows)


@pytest.mark.slow
def test_vs_trl_startup_clocks_from_launch(tmp_path, monkeypatch, bench_script):
    """--startup: each system's first evaluation is stamped after its start-up, not at 0."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vs_trl = bench_script("bench.perf.vs_trl")
    results = tmp_path / "vs_trl.md"
    assert vs_trl.main(["--smoke", "--startup", "--seeds", "0", "--budget-s", "15", "--out", str(tmp_path / "out"),
                        "--results", str(results), f"sft.cache_dir={tmp_path / 'cache'}"]) == 0
    rows = json.loads(results.read_text().split("```json\n")[1].split("```")[0])
    assert all(r["evals"][1][2] > r["startup_s"] > 0 for r in rows)
    assert "from launch" in results.read_text()


def _row(system: str, seed: int, t: float | None) -> dict:
    return {"system": system, "seed": seed, "acc_start": 0.15, "time_to_target_s": t, "acc_at_budget": 0.8,
            "acc_at_budget_step": 300, "steps": 300, "train_s": 100.0, "s_per_step": 0.33, "reward_end": 0.7,
            "evals": [[0, 0.15, 0.0], [20, 0.7, 40.0]]}


def test_merge_reports_the_union_of_two_files_and_refuses_a_seed_twice(tmp_path, bench_script):
    vs_trl = bench_script("bench.perf.vs_trl")
    a, b, out = tmp_path / "a.md", tmp_path / "b.md", tmp_path / "ab.md"
    a.write_text("# x\n\n```json\n" + json.dumps([_row("tba", 0, 30.0), _row("trl-grpo", 0, 40.0)]) + "\n```\n")
    b.write_text("```json\n" + json.dumps([_row("tba", 3, 50.0), _row("trl-grpo", 3, 20.0)]) + "\n```\n")
    assert vs_trl.main(["--merge", str(a), str(b), "--budget-s", "120", "--results", str(out)]) == 0
    text = out.read_text()
    assert "merged from [a.md](a.md), [b.md](b.md)" in text
    assert "- seed 0: TRL time-to-60% / tba time-to-60% = 1.33×" in text
    assert "- seed 3: TRL time-to-60% / tba time-to-60% = 0.40×" in text
    assert "tba: accuracy at 120 s median 80.0% (range 80.0%–80.0%); time to 60% median 40.0 s over the 2/2" in text
    assert len(json.loads(text.split("```json\n")[1].split("```")[0])) == 4
    with pytest.raises(SystemExit, match="more than one file"):
        vs_trl.main(["--merge", str(a), str(a), "--budget-s", "120", "--results", str(out)])
