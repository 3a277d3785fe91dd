"""tba.runtime.forkserver: which runs fork their searchers, when the server is started early, and that a child
forked from a server started before the trainer changed its environment, directory or sys.path still sees the
trainer's (the environment through `settle`, the rest through multiprocessing; runs with either start method are
in test_runtimes); and that a server that stops answering is killed, both when stopped and when asked to fork."""

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import time

import pytest
from procs import alive

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


def _exit_with(code: int) -> None:
    sys.exit(code)


@pytest.fixture
def bare_server(monkeypatch):
    """A fork server of its own that imports nothing (starts in a moment), stopped again afterwards."""
    forkserver.stop()
    monkeypatch.setattr(forkserver, "PRELOAD", ())
    forkserver.start()
    ctx = multiprocessing.get_context("forkserver")
    warm = ctx.Process(target=_exit_with, args=(0,))
    warm.start()  # returns once the server serves
    warm.join(timeout=60)
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    yield ctx, pid
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    forkserver.stop()


def test_a_stopped_server_is_killed_within_the_timeout_of_stop(bare_server):
    _, pid = bare_server
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    assert forkserver.stop(timeout_s=1)
    assert time.monotonic() - t0 < 5 and not alive(pid)
    assert multiprocessing.forkserver._forkserver._forkserver_pid is None  # a later start starts a new one


def test_a_process_asked_of_a_stopped_server_is_forked_by_a_new_one(bare_server):
    """Process.start waits without a timeout for the server to report the child's pid; start_process kills a
    server that does not, and forks from a new one."""
    ctx, pid = bare_server
    os.kill(pid, signal.SIGSTOP)
    p = ctx.Process(target=_exit_with, args=(7,))
    t0 = time.monotonic()
    forkserver.start_process(p, timeout_s=2)
    p.join(timeout=60)
    assert p.exitcode == 7
    assert time.monotonic() - t0 < 30 and not alive(pid)
    assert multiprocessing.forkserver._forkserver._forkserver_pid not in (None, pid)
