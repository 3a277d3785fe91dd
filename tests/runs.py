"""Helpers of the end-to-end runs in tests/integration: the tiny recipe's run, and the processes a run leaves."""

import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest
from paths import TESTS
from paths import TINY as TINY_RECIPE
from procs import cmdline, descendants, is_fork_server, pids, searchers_of

from tba.cli import main

TINY = [TINY_RECIPE]  # the tiny recipe: the first argument after "train"
FAULTY = f"{TESTS / 'integration' / 'faulty_sampler.py'}:build"  # a sampler that raises after 3 batches


def child_processes() -> list[int]:
    """PIDs of live processes under this test process (Python's own multiprocessing resource_tracker and the
    fork server excepted: per-interpreter singletons that exit with their parent; a searcher forked from the
    server is counted)."""
    me = os.getpid()
    return [p for p in descendants(me) if "resource_tracker" not in cmdline(p) and not is_fork_server(p, me)]


def run(tmp_path, *extra):
    out = tmp_path / "run"
    code = main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={tmp_path.parent / 'sft-cache'}", *extra])
    return code, out


def ray_processes() -> list[str]:
    """Command lines of every Ray process on the machine (GCS, raylets, workers)."""
    cmds = (cmdline(p) for p in pids())
    return [c[:80] for c in cmds if any(d in c for d in ("gcs_server", "raylet", "ray::"))]


needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed (tba[ray])")
def searcher_pids(runtime: str) -> list[int]:
    """This test's own searchers (local: its children; Ray: actors under the raylet its driver started), never
    those of another run on the machine."""
    if runtime == "local":
        return searchers_of(os.getpid())
    return [p for p in descendants(os.getpid()) if "_SearcherActor" in cmdline(p)]  # at whatever depth Ray put it


def kill_searcher_after(out: Path, runtime: str, step: int, killed: list) -> None:
    deadline = time.monotonic() + 900  # a loaded 2-core machine starts Ray's workers slowly
    while time.monotonic() < deadline:
        try:
            lines = (out / "metrics.jsonl").read_text().splitlines()
        except OSError:
            lines = []
        pids = searcher_pids(runtime)
        if len(lines) >= step and pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
            return
        time.sleep(0.05)


def train_in_a_fresh_process(args: list[str], timeout_s: float = 1200) -> dict:
    """`python -m tba train ARGS` in a new interpreter, its summary.json. For a test whose numbers must not depend
    on what earlier tests left in this process: an in-process vLLM engine changes the CPU kernels' state, and a
    learning curve that sampling makes chaotic then takes another (equally valid) path."""
    import json
    import subprocess
    import sys

    out = next(a.split("=", 1)[1] for a in args if a.startswith("output_dir="))
    proc = subprocess.run([sys.executable, "-m", "tba", "train", *args], capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((Path(out) / "summary.json").read_text())
