"""Searcher processes fork from a server that has already imported tba (multiprocessing's forkserver).

Why: a spawned searcher starts a fresh interpreter and imports torch, transformers and tba before it can load a
model — most of a local run's start-up on a small machine, and again at every restart. multiprocessing's
forkserver imports a list of modules once, in its own process, then forks each child from itself: the child
starts with them imported and only loads its models. `start` returns at once (the server imports in the
background), so `tba train` calls it right after reading the config — the server imports while the trainer
process does the same and builds its models (on two cores: at the same time) — and `tba.run.train` calls it
again (a no-op once running).

What a forked searcher inherits from the server instead of from the trainer: modules imported, and variables read
at import time, as of the server's start. multiprocessing itself gives each child the trainer's working directory,
sys.path and main module (a script's own functions are found as with spawn); the environment the trainer has now
travels with each child (`environment`, taken by `settle` before the searcher is built). vLLM needs a fresh
process (LD_PRELOAD on CPU, its own workers), so it is spawned (`method`). The server is this process's child: it
exits when this process does (`settle`; a killed trainer), and this process stops it before exiting (`stop`,
registered at exit by `start`), so that a finished run leaves no server behind, not even one that stopped
answering. The searchers it forked watch the trainer itself (tba.runtime.lifetime).

This module imports nothing heavy: the CLI calls it before torch is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import signal
import threading
import time

from tba.rollout.samplers import sampler_entry

logger = logging.getLogger(__name__)

PRELOAD = ("tba.runtime.local", "tba.rollout.samplers.hf")
"""What the server imports before its first fork: everything a searcher needs that is tba's own (a plugin of
the user's is imported in each child, so an edited file is read afresh)."""


def method(choice: str, needs_fresh_process: bool) -> str:
    """The start method for a run's searcher processes: `choice` (supervision.start_method), where auto is
    forkserver unless a searcher needs variables set before its interpreter starts (`needs_fresh_process`)."""
    if choice == "auto":
        return "spawn" if needs_fresh_process else "forkserver"
    return choice


STOP_S = 2.0
"""How long `stop` gives the server to exit on SIGTERM (it has nothing to wind down: it exits at once, unless it
is stopped or hung) before it is killed."""

_stop_registered = False


def start() -> None:
    """Start the server (if not yet running) with tba's searcher modules preloaded, and return at once."""
    global _stop_registered
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    multiprocessing.forkserver.ensure_running()
    if not _stop_registered:  # after multiprocessing's own exit handler, so it runs first (atexit: last in, first out)
        atexit.register(stop)
        _stop_registered = True


def stop(timeout_s: float = STOP_S) -> bool:
    """Stop this process's server, if it runs, and wait for its exit: SIGTERM, then SIGKILL past `timeout_s` (which
    ends a stopped — SIGSTOP — or hung server too; waited for up to STOP_S). Every wait has a timeout; says whether
    the server is gone. Call with no searcher running: a searcher forked from it outlives it. A later `start`
    starts a new one.

    Why not multiprocessing's own way (closing the server's liveness pipe, then waiting): it waits without a
    timeout, for ever if the server is stopped; and the server's orderly exit is a second or more of interpreter
    shutdown with torch imported, for nothing — it holds no state. Left to itself, the server would exit only
    after this process, outliving the run."""
    server = multiprocessing.forkserver._forkserver
    with server._lock:
        pid = server._forkserver_pid
        if pid is None:
            return True
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
        gone = False
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, STOP_S)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)  # our own child, not yet reaped: the pid is still its
            if gone := _reap(pid, wait_s):
                break
        address = server._forkserver_address
        if address is not None and not multiprocessing.util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)
        server._forkserver_pid = server._forkserver_address = None
        return gone


def start_process(process, timeout_s: float) -> None:
    """`process.start()` for a process of the forkserver context, bounded by `timeout_s`; raises TimeoutError.

    Why: the start waits, without a timeout, for the server to report the new child's pid — for ever if the server
    is stopped or hung. Past `timeout_s` that server is killed (which ends the wait, and every child it forked that
    had not reported yet: each watches its parent) and the start is tried once more with a fresh server. The
    first start of a run waits for the server's imports: `timeout_s` must allow for them."""
    for attempt in (1, 2):
        error: list[BaseException] = []

        def run(error=error):
            try:
                process.start()
            except BaseException as e:
                error.append(e)

        starter = threading.Thread(target=run, name="tba-fork", daemon=True)
        starter.start()
        starter.join(timeout_s)
        if not starter.is_alive():
            if error:
                raise error[0]
            return
        pid = multiprocessing.forkserver._forkserver._forkserver_pid
        logger.warning(f"the fork server (pid {pid}) did not fork {process.name} within {timeout_s:.0f}s (stopped or "
                       f"hung): killing it" + ("; trying once more with a new one" if attempt == 1 else ""))
        stop(timeout_s=0)
        starter.join(STOP_S)  # the wait for the pid ends as the server's end of the pipe closes
        if starter.is_alive():
            break
        start()
    raise TimeoutError(f"no fork server forked {process.name} within {timeout_s:.0f}s, twice")


def _reap(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the child `pid` to exit, and reap it; says whether it did."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:  # reaped already
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def start_early(cfg) -> bool:
    """`start` for a run whose local searchers will fork (a config's runtime, backends and start_method), else
    nothing (an idle server importing torch would only compete with the trainer for the cores); says which."""
    backends = [cfg.search.backend, *(g.backend for g in cfg.search.groups or [] if g.backend)]
    fresh = any(sampler_entry(b).fresh_process for b in backends)  # declared by the backend
    forks = cfg.runtime == "local" and method(cfg.supervision.start_method, fresh) == "forkserver"
    if forks:
        start()
    return forks


def environment() -> dict[str, str]:
    """The variables a searcher process starts with: this process's, now (the server's are as of its start)."""
    return dict(os.environ)


def settle(env: dict[str, str]) -> None:
    """A searcher process's first act, however it started: take the trainer's variables (`environment()`) in
    place of the server's, and, if forked, let go of the server's liveness pipe. multiprocessing hands every forked
    child a copy of the pipe whose end tells the server its clients have gone (so that a child could fork in
    turn); held by a searcher, it would keep the server alive after the trainer dies, and the searcher, whose
    parent is the server, would never see that its trainer is gone."""
    os.environ.clear()
    os.environ.update(env)
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_alive_fd", None) is not None:  # None in a spawned process
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
