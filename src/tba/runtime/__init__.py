"""Runtimes host the searchers and move data; the training loop (tba.loop) is the same for all of them.

inline (tba.runtime.inline): one process, search and training alternate. local (tba.runtime.local):
searcher processes on this machine. ray (tba.runtime.ray): searcher actors on a Ray cluster. offline: no
searchers, a saved buffer. `tba.build.build_runtime` picks one from the config; tba.runtime.base defines
the seam.
"""

from __future__ import annotations

from tba.runtime.base import ModelSources, Runtime, SearcherError

__all__ = ["ModelSources", "Runtime", "SearcherError"]
