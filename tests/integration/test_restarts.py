"""kill -9 a searcher mid-run: it is restarted (local: by the runtime; Ray: by Ray's max_restarts), the run
completes, and summary.json reports exactly one restart. In sync mode the trainer waits for every searcher each
step, so completing the run proves the restarted searcher delivers again. SIGSTOP one in async mode: alive but
silent, it is caught by the heartbeat (supervision.heartbeat_timeout_s), killed and restarted the same way."""

import json
import os
import signal
import threading
import time

import pytest
from procs import alive, searchers_of, stat
from runs import TINY, child_processes, kill_searcher_after, needs_ray, ray_processes, searcher_pids

from tba.cli import main
from tba.runtime.local import LocalRuntime


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", pytest.param("ray", marks=needs_ray)])
def test_kill_9_searcher_is_restarted_and_the_run_completes(tmp_path, capsys, runtime):
    out = tmp_path / "run"
    killed: list[int] = []
    killer = threading.Thread(target=kill_searcher_after, args=(out, runtime, 5, killed), daemon=True)
    killer.start()
    code = main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={tmp_path.parent / 'sft-cache'}",
                 f"runtime={runtime}", "mode=sync", "trainer.steps=30", "trainer.sync_every_steps=1",
                 "supervision.ready_timeout_s=900"])  # a loaded 2-core machine restarts a Ray worker slowly
    killer.join(timeout=1)
    err = capsys.readouterr().err
    assert killed, "no searcher process was found to kill"
    assert code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["searcher_restarts"] == 1 and summary["trainer_steps"] == 30
    assert "restart" in err and ("exit code -9" in err or "ActorDiedError" in err or "ActorUnavailableError" in err)
    assert not child_processes() and not ray_processes()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", pytest.param("ray", marks=needs_ray)])
def test_stopped_searcher_is_caught_by_the_heartbeat_restarted_and_delivers_again(tmp_path, capsys, monkeypatch,
                                                                                   runtime):
    """The only searcher is SIGSTOPped right after the prefill (alive, silent). The trainer keeps training on the
    buffer, one slow step (0.25 s) at a time, until the runtime notices; then it waits for the replacement's
    first batch. Without a heartbeat the run ends normally with 0 restarts."""
    if runtime == "local":
        cls = LocalRuntime
    else:
        from tba.runtime.ray import RayRuntime as cls
    original, seen = cls.collect, {"stopped": None, "delivered_again": False}

    def collect(self, block):
        if not block and seen["stopped"] is None:  # the first step after the prefill
            pids = searcher_pids(runtime)
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGSTOP)
            seen["stopped"] = pids[0]
        if seen["stopped"] is not None and self.restarts == 0:
            time.sleep(0.25)  # a slow trainer step: the run outlasts the timeout however fast the machine is
        elif self.restarts and not seen["delivered_again"]:
            groups = original(self, True)  # wait (supervision.collect_timeout_s) for the replacement's first batch
            seen["delivered_again"] = bool(groups)
            return groups
        return original(self, block)

    monkeypatch.setattr(cls, "collect", collect)
    out = tmp_path / "run"
    try:
        code = main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={tmp_path.parent / 'sft-cache'}",
                     f"runtime={runtime}", "mode=async", "trainer.steps=40", "eval.every_steps=40",
                     "supervision.heartbeat_timeout_s=3", "supervision.max_restarts=3", "sft.enabled=false"])
    finally:
        if seen["stopped"] and stat(seen["stopped"])[:1] == ["T"]:
            os.kill(seen["stopped"], signal.SIGKILL)  # still stopped: the runtime never noticed it
    err = capsys.readouterr().err
    assert seen["stopped"], "no searcher process was found to stop"
    assert code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 40
    assert summary["searcher_restarts"] >= 1, "the stopped searcher went unnoticed"
    assert "sent no batch for" in err and "(supervision.heartbeat_timeout_s=3): hung or stopped" in err
    assert "restarting it (1/3 restarts used)" in err or "Ray restarts it (1/3 restarts used)" in err
    assert seen["delivered_again"]  # the replacement generates
    assert not child_processes() and not ray_processes()


HUNG_TRAINER = """
import sys, time
from tba.algorithm import loop
loop.Loop.step = lambda self: time.sleep(3600)  # the trainer hangs after prefill: nobody drains the queue
if __name__ == "__main__":
    from tba.cli import main
    main(sys.argv[1:])
"""


@pytest.mark.slow
def test_a_searcher_blocked_on_a_full_queue_exits_when_its_trainer_is_killed(tmp_path):
    """The orphan check ran only between batches: a searcher retrying `put` on a full queue spun forever."""
    import subprocess
    import sys

    script = tmp_path / "hung_trainer.py"
    script.write_text(HUNG_TRAINER)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), "train", *TINY, f"output_dir={out}",
                             f"sft.cache_dir={tmp_path.parent / 'sft-cache'}", "runtime=local", "mode=async"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # start-up, SFT (cached by the tests above), prefill
            if "buffer prefilled" in line:
                break
        searchers = searchers_of(proc.pid)
        assert searchers, "no searcher process"
        time.sleep(10)  # ≥ 16 batches: the queue (maxsize 16 per searcher) is full, the searcher retries put
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(p) for p in searchers):
        time.sleep(0.2)
    assert not any(alive(p) for p in searchers), f"searchers {searchers} outlived the trainer"
