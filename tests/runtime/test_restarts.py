"""kill -9 a searcher mid-run: it is restarted (local: by the runtime; Ray: by Ray's max_restarts), the run
completes, and summary.json reports exactly one restart. In sync mode the trainer waits for every searcher each
step, so completing the run proves the restarted searcher delivers again."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tba.cli import main

from .test_runtimes import TINY, child_processes, needs_ray, ray_processes


def _searcher_pids(runtime: str) -> list[int]:
    if runtime == "local":
        return [p for p in child_processes() if "multiprocessing.spawn" in Path(f"/proc/{p}/cmdline").read_text()]
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if "_SearcherActor" in Path(f"/proc/{pid}/cmdline").read_text():
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def _kill_searcher_after(out: Path, runtime: str, step: int, killed: list) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            lines = (out / "metrics.jsonl").read_text().splitlines()
        except OSError:
            lines = []
        pids = _searcher_pids(runtime)
        if len(lines) >= step and pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
            return
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", pytest.param("ray", marks=needs_ray)])
def test_kill_9_searcher_is_restarted_and_the_run_completes(tmp_path, capsys, runtime):
    out = tmp_path / "run"
    killed: list[int] = []
    killer = threading.Thread(target=_kill_searcher_after, args=(out, runtime, 5, killed), daemon=True)
    killer.start()
    code = main(["train", f"output_dir={out}", f"sft.cache_dir={tmp_path.parent / 'sft-cache'}", *TINY,
                 f"runtime={runtime}", "mode=sync", "trainer.steps=30", "trainer.sync_every_steps=1"])
    killer.join(timeout=1)
    err = capsys.readouterr().err
    assert killed, "no searcher process was found to kill"
    assert code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["searcher_restarts"] == 1 and summary["trainer_steps"] == 30
    assert "restart" in err and ("exit code -9" in err or "ActorDiedError" in err or "ActorUnavailableError" in err)
    assert not child_processes() and not ray_processes()
