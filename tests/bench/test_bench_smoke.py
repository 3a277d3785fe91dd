"""Shortened smoke versions of the benchmarks (CI): each runs end to end and writes its results table.
No timing or accuracy is asserted here — numbers live in bench/results/, measured by the full runs."""

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))


def run_bench(name: str, argv: list[str], monkeypatch) -> None:
    # imported by its plain name from bench/ (on sys.path), so spawned pool workers can import it too
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    module.main()


def rows_of(results: Path) -> list[dict]:
    text = results.read_text()
    return json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])


@pytest.mark.slow
def test_learning_bench_smoke(tmp_path, monkeypatch):
    results = tmp_path / "learning.md"
    run_bench("learning", ["--smoke", "--seeds", "0", "--out", str(tmp_path / "out"), "--results", str(results)],
              monkeypatch)
    (row,) = rows_of(results)
    assert {"sft", "rl", "ctrl", "rl_train_s", "ctrl_s"} <= row.keys() and "| seed |" in results.read_text()


@pytest.mark.slow
def test_async_speedup_bench_smoke(tmp_path, monkeypatch):
    results = tmp_path / "async.md"
    run_bench("async_speedup", ["--smoke", "--seeds", "0", "--eval-every", "3", "--target", "0.0",
                                "--out", str(tmp_path / "out"), "--results", str(results)], monkeypatch)
    variants = {r["variant"] for r in rows_of(results)}
    assert {"async-local", "sync-inline", "sync-local"} <= variants
    assert "wall-clock for the same 200 steps" in results.read_text()


@pytest.mark.slow
def test_offpolicy_bench_smoke(tmp_path, monkeypatch):
    results = tmp_path / "offpolicy.md"
    run_bench("offpolicy", ["--smoke", "--seeds", "0", "--ks", "1", "2", "--ms", "0.5", "--workers", "2",
                            "--out", str(tmp_path / "out"), "--results", str(results)], monkeypatch)
    rows = rows_of(results)
    assert len(rows) == 10 and {r["objective"] for r in rows} == {"tb", "tba_prime", "dr_grpo", "rloo", "online_dpo"}
    assert results.with_suffix(".png").is_file()


@pytest.mark.slow
def test_resume_bench_smoke(monkeypatch, capsys):
    run_bench("resume", ["--smoke"], monkeypatch)
    table = capsys.readouterr().out
    assert "| 0 | local-async |" in table and "| 0 | inline-sync |" in table


@pytest.mark.slow
def test_soak_bench_smoke(monkeypatch, capsys):
    run_bench("soak", ["--smoke"], monkeypatch)
    out = capsys.readouterr().out
    assert "RSS growth first → last sample" in out and "exit code 130" in out
