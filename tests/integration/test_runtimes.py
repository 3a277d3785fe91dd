"""End-to-end runs on each runtime with a tiny model: weights reach searchers, stale data is trained on,
failures surface with the searcher's traceback, and nothing is left running."""

import json
import multiprocessing
import os
import time

import pytest
from procs import cmdline, is_fork_server, parent
from runs import FAULTY, child_processes, needs_ray, ray_processes, run

RUNTIMES = [("local", "async"), ("local", "sync"), pytest.param("ray", "async", marks=needs_ray),
            pytest.param("ray", "sync", marks=needs_ray)]


@pytest.mark.slow
@pytest.mark.parametrize("runtime, mode", RUNTIMES)
def test_runtime_publishes_versions_trains_on_stale_data_and_cleans_up(tmp_path, runtime, mode):
    # async: a searcher starved of CPU (a loaded machine) may not have loaded a published version before the run
    # ends; an age cap makes the trainer wait for samples of a later version, so one must be loaded
    cap = ["buffer.max_sample_age=3"] if mode == "async" else []
    code, out = run(tmp_path, f"runtime={runtime}", f"mode={mode}", "trainer.steps=24", "eval.every_steps=24", *cap)
    assert code == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("searcher/version_min", 0) for m in lines) > 0  # searchers picked up published weights
    assert max(m["staleness/max"] for m in lines) > 0  # stale samples were trained on
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runtime"] == runtime and summary["mode"] == mode and summary["trainer_steps"] == 24
    assert not multiprocessing.active_children() and not child_processes() and not ray_processes()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", pytest.param("ray", marks=needs_ray)])
def test_crashing_searcher_fails_the_run_fast_with_its_traceback(tmp_path, capsys, runtime):
    # a run too long to end before the fault does: however slow the searcher, the run must end by the fault
    code, _ = run(tmp_path, f"runtime={runtime}", f"search.backend={FAULTY}", "supervision.max_restarts=0",
                  "trainer.steps=100000", "eval.every_steps=100000", "checkpoint.every_steps=null")
    assert code == 1
    err = capsys.readouterr().err
    assert "searcher" in err and "failed" in err and "injected searcher fault" in err and "Traceback" in err
    assert "restart limit reached (supervision.max_restarts=0" in err
    assert not multiprocessing.active_children() and not child_processes() and not ray_processes()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", pytest.param("ray", marks=needs_ray)])
def test_searcher_that_keeps_failing_is_restarted_up_to_the_limit_then_stops_the_run(tmp_path, capsys, runtime):
    # the restarted searcher resumes at its last cursor and fails again 3 batches later: 1 restart, then stop
    code, out = run(tmp_path, f"runtime={runtime}", f"search.backend={FAULTY}", "supervision.max_restarts=1",
                    "trainer.steps=100000", "checkpoint.every_steps=null")
    captured = capsys.readouterr()
    assert code == 1
    assert "restarting it (1/1 restarts used)" in captured.err or "Ray restarts it (1/1" in captured.err
    assert "restart limit reached (supervision.max_restarts=1" in captured.err
    assert (out / "checkpoints" / "latest").is_file()  # the exit checkpoint: the run can be resumed
    assert not multiprocessing.active_children() and not child_processes() and not ray_processes()


@pytest.mark.slow
def test_inline_runtime_is_sync_only(tmp_path, capsys):
    code, _ = run(tmp_path, "runtime=inline", "mode=async")
    assert code == 2 and "mode: the inline runtime" in capsys.readouterr().err
    code, out = run(tmp_path, "runtime=inline", "mode=sync")
    assert code == 0 and json.loads((out / "summary.json").read_text())["trainer_steps"] == 8


@pytest.mark.slow
def test_searchers_load_during_the_first_evaluation_and_generate_only_after_it(tmp_path, monkeypatch):
    """Launched before the trainer's first evaluation, a local searcher imports and loads its models meanwhile
    (it reports ready), but sends no samples until `start`: the evaluation stays the policy's alone."""
    from tba.algorithm.loop import Loop

    original, seen = Loop.evaluate, []

    def evaluate(self):
        if not seen:  # the first evaluation: the searcher was launched before it
            q, deadline = self.runtime.queue, time.monotonic() + 120
            while q.qsize() < 1 and time.monotonic() < deadline:  # its "ready" message
                time.sleep(0.05)
            time.sleep(2.0)  # long enough for a searcher that did not wait to send a batch
            seen.append(q.qsize())
        return original(self)

    monkeypatch.setattr(Loop, "evaluate", evaluate)
    code, out = run(tmp_path, "runtime=local", "mode=async", "trainer.steps=4", "eval.every_steps=4")
    assert code == 0
    assert seen == [1]  # ready, and nothing else, before the first evaluation ended
    assert not multiprocessing.active_children() and not child_processes()


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_local_searchers_start_either_way_and_leave_nothing_running(tmp_path, monkeypatch, start_method):
    """supervision.start_method: forked from the fork server (the default) or spawned, the run is the same."""
    from tba.runtime.local import LocalRuntime

    original, seen = LocalRuntime.start, []

    def start(self):
        original(self)
        seen.append((self.start_method, [(cmdline(p.pid), parent(p.pid)) for p in self._procs]))

    monkeypatch.setattr(LocalRuntime, "start", start)
    code, out = run(tmp_path, "runtime=local", "mode=sync", "trainer.steps=4", "eval.every_steps=4",
                    f"supervision.start_method={start_method}")
    assert code == 0 and json.loads((out / "summary.json").read_text())["trainer_steps"] == 4
    (method, procs), = seen
    assert method == start_method and procs
    if start_method == "spawn":  # a fresh interpreter, a child of the trainer
        assert all("multiprocessing.spawn" in cmd and ppid == os.getpid() for cmd, ppid in procs)
    else:  # a child of the fork server, which is the trainer's
        assert all(is_fork_server(ppid, os.getpid()) for _, ppid in procs)
    assert not multiprocessing.active_children() and not child_processes()
