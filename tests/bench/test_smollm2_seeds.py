"""bench/claims/smollm2_seeds.py reads finished runs back (no rerun) and writes its table from their files: final, peak,
final − peak and gain per seed, and the noise of one evaluation from the held-out size the runs used."""

import json
from pathlib import Path


def _finished_run(out: Path, evals: list[float], n_test: int) -> None:
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"evals": [[25 * i, a, {}] for i, a in enumerate(evals)],
                                                  "wall_clock_s": 100.0, "test_problems": n_test}))
    rows = [{"step": s, "trainer/grad_norm": float(s), "staleness/mean": 2.0} for s in range(1, 101)]
    (out / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (out / "config.yaml").write_text("seed: 0\n")


def test_table_from_finished_runs(tmp_path, bench_script):
    seeds = bench_script("bench.claims.smollm2_seeds")
    _finished_run(tmp_path / "runs" / "seed3", [0.15, 0.50, 0.70, 0.66, 0.68], 1000)
    _finished_run(tmp_path / "runs" / "seed4", [0.15, 0.45, 0.60, 0.64, 0.65], 1000)
    results = tmp_path / "res" / "out.md"
    results.parent.mkdir()
    seeds.main(["--seeds", "3", "4", "--out", str(tmp_path / "runs"), "--results", str(results)])
    text = results.read_text()
    assert "| 3 | 15.0 | 50.0 | 70.0 | 66.0 | 68.0 | **68.0** | 70.0 (50) | -2.0 | +53.0 |" in text
    assert "| 4 | 15.0 | 45.0 | 60.0 | 64.0 | 65.0 | **65.0** | 65.0 (100) | +0.0 | +50.0 |" in text
    assert "final − peak: worst -2.0 points" in text
    assert "1000 held-out problems" in text and "±1.5 points" in text  # sqrt(.6 * .4 / 1000)
    assert (tmp_path / "res" / "out" / "seed4" / "metrics.jsonl").is_file()  # raw data copied beside the table


def test_the_tasks_own_evaluation_metrics_at_each_evaluation(tmp_path, bench_script):
    seeds = bench_script("bench.claims.smollm2_seeds")
    out = tmp_path / "runs" / "seed0"
    _finished_run(out, [0.0, 0.4], 50)
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "eval_start": {"score": 0.0, "tool/called_share": 0.0}}))
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 25, "eval/score": 0.4, "eval/tool/called_share": 0.5}) + "\n")
    results = tmp_path / "out.md"
    seeds.main(["--seeds", "0", "--out", str(tmp_path / "runs"), "--results", str(results), "--recipe", "x",
                "--title", "A tool task", "--eval-keys", "tool/called_share", "tool/score_with_call"])
    text = results.read_text()
    assert "A tool task, 1 seeds" in text
    assert "| 0 | 0 | 0.0 | 0.000 | — |" in text and "| 0 | 25 | 40.0 | 0.500 | — |" in text
