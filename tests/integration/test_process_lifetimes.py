"""No process of a local run outlives it: a fork server that stops answering does not keep a finished run's
process from exiting (nor survive it), and a searcher ends soon after its trainer is killed — even while it is
still starting, blocked in a C call. Each run is a `python -m tba train` subprocess, so that its exit is observed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import TESTS
from paths import TINY as TINY_RECIPE
from procs import alive, children, descendants, is_fork_server, searchers_of, stat

STALLING = f"{TESTS / 'integration' / 'stalling_sampler.py'}:build"


def tba_train(tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`tba train` on the tiny recipe (no SFT), its stdout and stderr in files of tmp_path."""
    args = [sys.executable, "-m", "tba", "train", TINY_RECIPE, f"output_dir={tmp_path / 'run'}", "sft.enabled=false",
            "runtime=local", *extra]
    return subprocess.Popen(args, stdout=(tmp_path / "stdout").open("w"), stderr=(tmp_path / "stderr").open("w"),
                            env={**os.environ, **(env or {})}, start_new_session=True)


def wait_for(what: str, condition, proc: subprocess.Popen, timeout: float, tmp_path: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before {what}:\n{stderr_tail(tmp_path)}")
        time.sleep(0.05)
    pytest.fail(f"no {what} within {timeout:.0f}s:\n{stderr_tail(tmp_path)}")


def stderr_tail(tmp_path: Path) -> str:
    return (tmp_path / "stderr").read_text()[-3000:]


def cleanup(proc: subprocess.Popen, pids: list[int]) -> None:
    """Whatever a failed test left: the run and the processes it had (a stopped one is killed as well)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def gone_within(pids: list[int], timeout: float) -> tuple[list[int], float]:
    """The pids still alive after `timeout` (none: returns early), and the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)], time.monotonic() - t0


@pytest.mark.slow
def test_a_stopped_fork_server_neither_hangs_the_run_nor_outlives_it(tmp_path):
    """SIGSTOP the fork server once the searchers it forked deliver: the run trains on, prints its summary and
    exits 0 within bounded time, its searchers and the server gone. Before: the process waited for ever in
    multiprocessing's exit handler, joining a searcher whose exit status only the stopped server could report."""
    proc = tba_train(tmp_path, "mode=async", "trainer.steps=30", "eval.every_steps=30", "search.num_searchers=2")
    seen: list[int] = []
    try:
        wait_for("prefilled buffer", lambda: "buffer prefilled" in (tmp_path / "stderr").read_text(), proc, 180,
                 tmp_path)
        server = [p for p in children(proc.pid) if is_fork_server(p, proc.pid)]
        searchers = searchers_of(proc.pid)
        assert len(server) == 1 and len(searchers) == 2, (server, searchers)
        seen = descendants(proc.pid)
        os.kill(server[0], signal.SIGSTOP)
        assert proc.poll() is None, "the run ended before its fork server was stopped"
        t_stop = time.monotonic()
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not exit within 120s of its fork server's SIGSTOP; its state: "
                        f"{stat(proc.pid)[:1]}, stdout ends:\n{(tmp_path / 'stdout').read_text()[-500:]}")
        err = (tmp_path / "stderr").read_text()
        assert code == 0, err[-3000:]
        assert "before / after" in (tmp_path / "stdout").read_text()  # the summary table
        assert (tmp_path / "run" / "summary.json").is_file()
        # the trainer ended them itself before it exited: the server and every searcher are gone by now
        assert not [p for p in [*server, *searchers] if alive(p)], f"left running: {server + searchers}"
        left, _ = gone_within(seen, 10)  # multiprocessing's resource tracker ends once its pipe closes
        assert not left, f"left running after the run exited: {left}"
        print(f"exited {time.monotonic() - t_stop:.1f}s after the SIGSTOP")
    finally:
        cleanup(proc, seen)


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["auto", "spawn"])
def test_searchers_blocked_in_start_up_end_soon_after_their_trainer_is_killed(tmp_path, start_method):
    """kill -9 the trainer while both searchers are still starting, each blocked in a TCPStore connect (a C call
    torch retries for 20 minutes here): every searcher, and the fork server, must be gone within 15 s — below
    supervision.heartbeat_timeout_s=10 plus margin. Before: they lived until torch's connect gave up."""
    stall = tmp_path / "stall"
    stall.mkdir()
    proc = tba_train(tmp_path, "mode=async", "search.num_searchers=2", f"search.backend={STALLING}",
                     "supervision.heartbeat_timeout_s=10", f"supervision.start_method={start_method}",
                     env={"TBA_TEST_STALL_DIR": str(stall)})
    seen: list[int] = []
    try:
        blocked = wait_for("two searchers blocked in start-up", lambda: len(list(stall.iterdir())) == 2, proc, 180,
                           tmp_path)
        assert blocked
        searchers = searchers_of(proc.pid)
        assert sorted(searchers) == sorted(int(p.name) for p in stall.iterdir()), searchers
        seen = descendants(proc.pid)  # the searchers, the fork server (auto), the resource tracker
        proc.kill()
        proc.wait(timeout=30)
        left, waited = gone_within(seen, 15)
        assert not left, f"{left} outlived their killed trainer by more than 15s"
        print(f"every process of the run gone {waited:.1f}s after the trainer's kill -9")
    finally:
        cleanup(proc, seen)
