"""bench/lib: a killed grid benchmark takes its pool workers with it; a scratch folder is removed on success and
kept, named, on failure; a header's command reads back as the arguments that were run."""

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from procs import alive

from bench.lib.header import code_span, command, recorded_command
from bench.lib.scratch import scratch_dir

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


def test_scratch_removed_on_success_kept_and_named_on_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch_dir("ok-") as root:
        (root / "run").mkdir()
    assert not root.exists()
    with pytest.raises(SystemExit), scratch_dir("bad-") as root:
        raise SystemExit("training died")
    assert root.is_dir() and f"kept for inspection in {root}" in capsys.readouterr().err
    with scratch_dir("keep-", keep=True) as kept:
        pass
    assert kept.is_dir()


def test_a_header_command_reads_back_as_the_arguments_run():
    argv = ["--conditions", "TB, fp", "TB, int8", "--title", "β 0.02 (`tool_arith_smollm2_cpu`)", "it's=1"]
    header = f"# x\n\n- date: today\n- command: {code_span(command('bench.claims.x', argv))}\n- note: `other`\n"
    assert shlex.split(recorded_command(header)) == ["python", "-m", "bench.claims.x", *argv]
    assert recorded_command("# x\n\nCommand: `python bench/x.py`.\n") is None  # only the header's own line counts
