"""The heartbeat on the run's own time scale: a searcher that delivered a batch every fraction of a second and
then went silent (SIGSTOP) is caught within seconds, with the default 300 s cap untouched. Before the limit
was learnt from batch times, the same run finished on a frozen buffer with 0 restarts and no warning."""

import json
import os
import signal
import time

import pytest
from procs import stat
from runs import TINY, child_processes, searcher_pids

from tba.cli import main
from tba.runtime.local import LocalRuntime


@pytest.mark.slow
def test_a_stopped_fast_searcher_is_caught_long_before_the_cap(tmp_path, capsys, monkeypatch):
    original, seen = LocalRuntime.collect, {"stopped": None, "at": None}

    def collect(self, block):
        if not block and seen["stopped"] is None and self.supervisor.clocks[0].intervals:  # it has a pace
            (pid,) = searcher_pids("local")
            os.kill(pid, signal.SIGSTOP)
            seen["stopped"], seen["at"] = pid, time.monotonic()
        if seen["stopped"] is not None and self.restarts == 0:
            time.sleep(0.1)  # a trainer step slow enough that the run outlasts the learnt limit
        return original(self, block)

    monkeypatch.setattr(LocalRuntime, "collect", collect)
    out = tmp_path / "run"
    try:
        code = main(["train", *TINY, f"output_dir={out}", "runtime=local", "mode=async", "trainer.steps=120",
                     "eval.every_steps=120", "supervision.heartbeat_floor_s=2", "sft.enabled=false"])
    finally:
        if seen["stopped"] and stat(seen["stopped"])[:1] == ["T"]:
            os.kill(seen["stopped"], signal.SIGKILL)
    err = capsys.readouterr().err
    assert seen["stopped"], "the searcher delivered no batch before the run ended"
    assert code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["searcher_restarts"] >= 1, "the stopped searcher went unnoticed"
    assert "(limit " in err and "max(supervision.heartbeat_floor_s=2, 20 × its slowest recent interval" in err
    assert "supervision.heartbeat_timeout_s=300" not in err.split("sent no batch", 1)[1].split("\n", 1)[0]
    assert not child_processes()
