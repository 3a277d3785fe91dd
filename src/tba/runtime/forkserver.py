"""Searcher processes fork from a server that has already imported tba (multiprocessing's forkserver).

Why: a spawned searcher starts a fresh interpreter and imports torch, transformers and tba before it can load a
model — 7–10 s on a 2-core machine, most of a local run's start-up, and again at every restart. multiprocessing's
forkserver imports a list of modules once, in its own process, then forks each child from itself: the child
starts with them imported and only loads its models. `start` returns at once (the server imports in the
background), so `tba train` calls it right after reading the config — the server imports while the trainer
process does the same and builds its models (on two cores: at the same time) — and `tba.build.train` calls it
again (a no-op once running).

What a forked searcher inherits from the server instead of from the trainer: modules imported and variables read
at import time are the server's, as of its start. What a run may change later travels with each child
(`ProcessContext`: environment, working directory, sys.path) and is applied before the searcher is built. vLLM on
CPU needs LD_PRELOAD at process start, so it is spawned (`method`). The server is this process's child: it exits
when this process does, and the searchers it forked notice their parent is gone (tba.runtime.local).

This module imports nothing heavy: the CLI calls it before torch is imported.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
from dataclasses import dataclass, field

PRELOAD = ("tba.runtime.local", "tba.samplers.hf")
"""What the server imports before its first fork: everything a searcher needs that is tba's own (a plugin of
the user's is imported in each child, so an edited file is read afresh)."""

START_METHODS = ("auto", "forkserver", "spawn")
"""supervision.start_method's choices."""


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
    forks = cfg.runtime == "local" and method(cfg.supervision.start_method, "vllm" in backends) == "forkserver"
    if forks:
        start()
    return forks


@dataclass
class ProcessContext:
    """What a searcher process must share with the trainer at the moment it starts, whichever way it started."""

    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: str = field(default_factory=os.getcwd)
    sys_path: list[str] = field(default_factory=lambda: list(sys.path))

    def apply(self) -> None:
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        sys.path[:] = self.sys_path
