"""bench/vs_trl.py --smoke end to end (in-process): both systems run and the results file has a row each."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "vs_trl.py"


@pytest.mark.slow
def test_vs_trl_smoke_writes_a_row_per_system(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = importlib.util.spec_from_file_location("vs_trl", BENCH)
    vs_trl = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "vs_trl", vs_trl)
    spec.loader.exec_module(vs_trl)
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
