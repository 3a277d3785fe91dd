"""tests/procs.py, the /proc reader the no-orphans tests rely on: a child is seen, a zombie is not alive, a reaped
process reads as gone, and a command name with spaces and parentheses does not shift the fields."""

import os
import subprocess
import sys
import time

import pytest
from procs import alive, children, cmdline, parent, stat

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")


def test_a_child_is_seen_then_a_zombie_then_gone():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in children(os.getpid()) and alive(child.pid)
        assert parent(child.pid) == os.getpid() and cmdline(child.pid) == "sleep 30 "
        child.kill()
        deadline = time.monotonic() + 10
        while stat(child.pid)[:1] != ["Z"] and time.monotonic() < deadline:  # exited, not yet reaped
            time.sleep(0.05)
        assert stat(child.pid)[0] == "Z" and not alive(child.pid) and child.pid not in children(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert stat(child.pid) == [] and not alive(child.pid) and parent(child.pid) == 0 and cmdline(child.pid) == ""


def test_a_command_name_with_spaces_and_parentheses():
    code = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0); time.sleep(30)"  # PR_SET_NAME
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while "a) b (c" not in open(f"/proc/{child.pid}/stat").read() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "a) b (c" in open(f"/proc/{child.pid}/stat").read()
        assert stat(child.pid)[0] in "RS" and parent(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
