"""`tba serve` as a user runs it: a subprocess on a free port that prints its URL and token on one line, answers
the `openai` client and verifiers' token route, and on Ctrl-C stops with nothing left running."""

import os
import re
import selectors
import signal
import subprocess
import sys
import time

import httpx
import pytest
from paths import TINY
from procs import alive, descendants

LINE = re.compile(r"^tba serve: (http://127\.0\.0\.1:\d+)/v1 token=(\S+) model=(\S+)")


def _line(proc, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=1.0):
            line = proc.stdout.readline()
            if line:
                return line
            break
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no URL line from tba serve (exit {proc.poll()}): {proc.stderr.read()[-2000:]}")


def test_serve_prints_its_url_answers_and_stops_cleanly():
    pytest.importorskip("uvicorn")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tba", "serve", TINY, "sft.enabled=false", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        match = LINE.match(_line(proc, timeout=180))
        assert match, "the line names the URL, the token and the model"
        url, token, model = match.groups()
        assert httpx.post(url + "/inference/v1/generate", json={"model": model, "token_ids": [1]}).status_code == 401
        r = httpx.post(url + "/inference/v1/generate", headers={"Authorization": f"Bearer {token}"}, timeout=60,
                       json={"model": model, "token_ids": [1, 5, 6], "sampling_params": {"max_tokens": 4,
                                                                                         "logprobs": 1}})
        assert r.status_code == 200 and 1 <= len(r.json()["choices"][0]["token_ids"]) <= 4
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-2000:]
        assert not [p for p in children if alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
