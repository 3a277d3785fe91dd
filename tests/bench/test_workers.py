"""bench/lib/workers.py: a grid benchmark's pool workers exit when the benchmark is killed, instead of training their
cells to the end on cores a rerun then shares with them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import alive

REPO = Path(__file__).resolve().parents[2]

PARENT = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from bench.lib.workers import worker_pool
if __name__ == "__main__":
    with worker_pool(1) as pool:
        print(pool.submit(os.getpid).result(), flush=True)
        pool.submit(time.sleep, 120).result()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_benchmark_takes_its_pool_workers_with_it():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(REPO)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert alive(worker)
        os.kill(parent.pid, signal.SIGKILL)  # no cleanup of any kind runs in the parent
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker)
    finally:
        parent.kill()
