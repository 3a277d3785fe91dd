"""Processes as /proc (Linux) shows them, for the tests that check what is left running after a run, a kill or a
crash. Every reader tolerates the process vanishing between listing and reading (it answers as for a dead one)."""

import os
from pathlib import Path


def stat(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses): [state, ppid, pgrp,
    session, ...]; [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    """Running, sleeping or stopped. A zombie ("Z") has exited; only its parent has yet to reap it."""
    fields = stat(pid)
    return bool(fields) and fields[0] != "Z"


def parent(pid: int) -> int:
    """The parent's PID; 0 once the process is gone."""
    fields = stat(pid)
    return int(fields[1]) if fields else 0


def cmdline(pid: int) -> str:
    """The command line, arguments separated by spaces; "" once the process is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids() -> list[int]:
    """Every process on the machine (each may be gone by the time it is read)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    return [p for p in pids() if parent(p) == pid and alive(p)]


def descendants(pid: int) -> list[int]:
    """Children, their children, and so on (live ones)."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def is_fork_server(pid: int, owner: int) -> bool:
    """`owner`'s multiprocessing fork server (tba.runtime.forkserver): a child of it running the server's main. A
    searcher forked from it shows the same command line, but its parent is the server."""
    return parent(pid) == owner and "multiprocessing.forkserver" in cmdline(pid)


def searchers_of(pid: int) -> list[int]:
    """The local runtime's searcher processes of the trainer `pid`: spawned children of it, or children of its
    fork server."""
    spawned = [p for p in children(pid) if "multiprocessing.spawn" in cmdline(p)]
    forked = [p for s in children(pid) if is_fork_server(s, pid) for p in children(s)]
    return spawned + forked
