"""A searcher process lives no longer than its trainer, and no longer than the run that started it.

Searcher side (`Lifeline`): the searcher watches the trainer process itself, by a pidfd (Linux ≥ 5.3) that turns
readable the moment the trainer exits, from a daemon thread started before anything else in the process, which
`os._exit`s it. Why a thread: the main thread may be blocked for minutes in a C call while the searcher starts —
torch's TCPStore connect to a dead trainer retries for twice `supervision.ready_timeout_s` — and checks between
batches never run there. Why the trainer's pid and not only the parent's: a searcher forked by the fork server has
the server as its parent, which exits with the trainer only once it notices, and never if it is stopped. Where
pidfds are missing, the parent-pid check (the trainer, or the server that exits with it) is what remains.

Trainer side (`Child`): the trainer ends its searcher processes itself, each wait with a timeout, watching them
by pid rather than through multiprocessing. Why: multiprocessing learns a forked child's exit only from the fork
server; a server that stops answering (SIGSTOP, a hang) leaves `Process.is_alive` true and `Process.join` waiting
for ever — and multiprocessing's exit handler joins every child it still counts as running, so the trainer's
process would never exit. A child known to have exited, whose status the server never reported, is therefore
taken off multiprocessing's list of children (`release`).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import select
import signal
import threading
import time

POLL_S = 0.2
"""How often the searcher's watchdog looks at its trainer: the bound on how long a searcher outlives it."""


def _pidfd(pid: int) -> int | None:
    """A pidfd of `pid`; -1 if it has exited already; None where the OS has no pidfds."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1
    except OSError:  # ENOSYS (kernel < 5.3), EPERM in some sandboxes: the parent-pid check remains
        return None


def _exited(pidfd: int | None) -> bool:
    """The process of `pidfd` has exited (it may not have been reaped yet); False where unknown."""
    if pidfd is None:
        return False
    return pidfd < 0 or bool(select.select([pidfd], [], [], 0)[0])


class Lifeline:
    """A searcher's view of its trainer, made first thing in the searcher process."""

    def __init__(self, trainer_pid: int):
        self.parent = os.getppid()  # the trainer (spawn) or the fork server (which exits with it)
        self.trainer = _pidfd(trainer_pid)

    def gone(self) -> bool:
        return os.getppid() != self.parent or _exited(self.trainer)

    def watch(self, poll_s: float = POLL_S) -> None:
        """End this process (exit code 0: nobody is left to read it) within `poll_s` of the trainer's exit, whatever
        the main thread is doing. Writes nothing: the trainer's stderr may be a pipe nobody reads any more."""

        def run():
            while not self.gone():
                time.sleep(poll_s)
            os._exit(0)

        threading.Thread(target=run, name="tba-trainer-watch", daemon=True).start()


class Child:
    """A searcher process (a started multiprocessing Process) that the trainer watches and ends by pid."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid
        self._pidfd = _pidfd(self.pid)

    def reported_exitcode(self, timeout_s: float = 1.0) -> int | None:
        """The exit code as multiprocessing reports it, waiting up to `timeout_s` for the report of a process that
        has exited (a forked one's comes from the fork server, a moment after its pidfd says so); None if none
        came."""
        if self.exited():
            self.process.join(timeout=timeout_s)
        return self.process.exitcode

    def exited(self) -> bool:
        return self.process._popen.poll() is not None or _exited(self._pidfd)

    def send(self, sig: int) -> None:
        """Send `sig` unless the process has exited (a pidfd never reaches a later process with its pid)."""
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd is not None and self._pidfd >= 0:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self._pidfd is None:
                os.kill(self.pid, sig)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the process to exit; says whether it has."""
        deadline = time.monotonic() + timeout_s
        while not self.exited():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def end(self, steps: tuple[tuple[int, float], ...] = ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0))) -> None:
        """Send each (signal, timeout) in turn until the process has exited — SIGKILL ends a stopped one too; then
        `release` it."""
        for sig, wait_s in steps:
            if self.exited():
                break
            self.send(sig)
            self.wait(wait_s)
        self.release()

    def release(self, report_s: float = 1.0) -> None:
        """Let multiprocessing forget a process that has exited: its exit status is read if it comes within
        `report_s` (a spawned child is reaped; a forked one's is sent by the fork server); otherwise the process
        leaves multiprocessing's list of children, so that no `join` at exit waits for a report that never
        comes. (One that has not exited even after SIGKILL — in an uninterruptible wait — stays on the list.)"""
        if self.exited():
            self.process.join(timeout=report_s)
            if self.process.exitcode is None:
                multiprocessing.process._children.discard(self.process)
        if self._pidfd is not None and self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1  # released: counts as exited from now on
