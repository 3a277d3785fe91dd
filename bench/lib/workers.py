"""A process pool for the grid benchmarks whose workers die with the benchmark.

Each cell of bench/claims/offpolicy.py or bench/claims/fixed_point.py is a training run of minutes inside a pool
worker. A ProcessPoolExecutor worker only notices that its parent is gone when it next reads the call queue, so
killing the benchmark (kill, a closed terminal, an out-of-memory kill) would leave every worker training its cell
to the end, on cores a rerun then shares with them. On Linux each worker asks the kernel for SIGTERM when its
parent dies (prctl PR_SET_PDEATHSIG); tba's SIGTERM handler (train() runs in the worker's main thread) ends the
cell after its current step, with a checkpoint.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """Pool initializer: SIGTERM this worker when the process that started it exits."""
    if sys.platform != "linux":
        return  # elsewhere a killed benchmark still leaves its workers to finish their cells
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def worker_pool(workers: int) -> cf.ProcessPoolExecutor:
    """`workers` spawned processes (no forked torch state) that exit when this process does."""
    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=die_with_parent, initargs=(os.getpid(),))
