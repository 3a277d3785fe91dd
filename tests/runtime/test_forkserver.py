"""tba.runtime.forkserver: which runs fork their searchers, when the server is started early, and that a child
forked from a server started before the trainer changed its environment, directory or sys.path still sees the
trainer's (the environment through `settle`, the rest through multiprocessing; runs with either start method are
in test_runtimes)."""

import multiprocessing
import os
import sys

import pytest

from tba.config import load_config
from tba.runtime import forkserver
from tba.runtime.forkserver import environment, method, settle


def test_auto_forks_unless_a_searcher_needs_a_fresh_process():
    assert method("auto", needs_fresh_process=False) == "forkserver"
    assert method("auto", needs_fresh_process=True) == "spawn"
    assert method("spawn", needs_fresh_process=False) == "spawn"
    assert method("forkserver", needs_fresh_process=True) == "forkserver"  # asked for: the user's call


@pytest.mark.parametrize("overrides, starts", [
    (["runtime=local"], True),
    (["runtime=inline", "mode=sync"], False),
    (["runtime=ray"], False),
    (["runtime=local", "supervision.start_method=spawn"], False),
    (["runtime=local", "search.backend=vllm"], False),
    (["runtime=local", "search.groups=[{name: policy}, {name: fast, backend: vllm}]"], False),
])
def test_started_early_only_for_runs_whose_searchers_fork(monkeypatch, overrides, starts):
    started = []
    monkeypatch.setattr(forkserver, "start", lambda: started.append(True))
    assert forkserver.start_early(load_config(None, overrides)) == starts
    assert started == ([True] if starts else [])


def _report(env: dict, q) -> None:
    before = os.environ.get("TBA_FORKSERVER_TEST")
    settle(env)
    q.put((before, os.environ.get("TBA_FORKSERVER_TEST"), os.getcwd(), sys.path[0]))


def test_a_forked_child_sees_the_trainers_environment_directory_and_path(tmp_path, monkeypatch):
    forkserver.start()  # before the changes below: the server keeps the environment it started with
    monkeypatch.setenv("TBA_FORKSERVER_TEST", "set after the server started")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ctx = multiprocessing.get_context("forkserver")
    q = ctx.Queue()
    p = ctx.Process(target=_report, args=(environment(), q))
    p.start()
    try:
        before, after, cwd, path0 = q.get(timeout=120)
    finally:
        p.join(timeout=30)
    assert before is None  # what the server had: without `settle` the child would miss the change …
    assert (after, cwd, path0) == ("set after the server started", str(tmp_path), str(tmp_path))  # … with it, not
    assert p.exitcode == 0
