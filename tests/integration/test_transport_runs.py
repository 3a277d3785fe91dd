"""Whole runs whose weights travel by broadcast: on each runtime, and with a searcher killed mid-run."""

import json
import threading

import pytest
from runs import TINY, child_processes, kill_searcher_after, needs_ray, ray_processes, run

from tba.cli import main


@pytest.mark.slow
@pytest.mark.parametrize("runtime, mode", [("local", "async"), pytest.param("ray", "sync", marks=needs_ray)])
def test_run_with_broadcast_transport(tmp_path, runtime, mode):
    # Ray in sync mode: every step waits for the actor, so the test does not depend on how fast it is here
    code, out = run(tmp_path, f"runtime={runtime}", f"mode={mode}", "search.weight_transport=broadcast",
                    "trainer.steps=12", "eval.every_steps=12")
    assert code == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("searcher/version_min", 0) for m in lines) > 0  # searchers loaded broadcast weights
    assert all(m["sync/publish_s"] < 5 for m in lines if "sync/publish_s" in m)
    assert not child_processes() and not ray_processes()


@pytest.mark.slow
def test_kill_9_searcher_with_broadcast_transport(tmp_path, capsys):
    # kill -9 with the default (shared) transport: tests/runtime/test_restarts.py
    out, killed = tmp_path / "run", []
    killer = threading.Thread(target=kill_searcher_after, args=(out, "local", 4, killed), daemon=True)
    killer.start()
    code = main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={tmp_path.parent / 'sft-cache'}",
                 "runtime=local", "search.weight_transport=broadcast", "mode=sync", "trainer.steps=14",
                 "trainer.sync_every_steps=1", "eval.every_steps=14"])
    killer.join(timeout=1)
    err = capsys.readouterr().err
    assert killed and code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["searcher_restarts"] == 1 and summary["trainer_steps"] == 14
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["searcher/version_min"] >= 10  # the replacement got weights through the re-formed group
    assert not child_processes()

