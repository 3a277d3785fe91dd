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
exits when this process does (`settle`), and the searchers it forked notice their parent is gone
(tba.runtime.local).

This module imports nothing heavy: the CLI calls it before torch is imported.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os

from tba.rollout.samplers import sampler_entry

PRELOAD = ("tba.runtime.local", "tba.rollout.samplers.hf")
"""What the server imports before its first fork: everything a searcher needs that is tba's own (a plugin of
the user's is imported in each child, so an edited file is read afresh)."""


def method(choice: str, needs_fresh_process: bool) -> str:
    """The start method for a run's searcher processes: `choice` (supervision.start_method), where auto is
    forkserver unless a searcher needs variables set before its interpreter starts (`needs_fresh_process`)."""
    if choice == "auto":
        return "spawn" if needs_fresh_process else "forkserver"
    return choice


def start() -> None:
    """Start the server (if not yet running) with tba's searcher modules preloaded, and return at once."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    multiprocessing.forkserver.ensure_running()


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
