"""Runtimes host the searchers and move data; the training loop (tba.loop) is the same for all of them."""

from __future__ import annotations

import copy
from pathlib import Path

from tba.config import RunConfig
from tba.runtime.base import ModelSources, Runtime, SearcherError, default_threads


def make_runtime(cfg: RunConfig, *, task, tokenizer, policy, reference, source: str | None, out_dir: Path) -> Runtime:
    """Build the configured runtime around searchers that start from the trainer's current policy."""
    _, searcher_threads = default_threads(cfg.search.num_searchers, cfg.runtime)
    threads = cfg.search.threads or searcher_threads
    if cfg.runtime == "inline":
        from tba.runtime.inline import InlineRuntime
        from tba.searcher import Searcher

        return InlineRuntime(Searcher(copy.deepcopy(policy), reference, tokenizer, task, cfg.search, seed=cfg.seed))
    if source is None:
        # the starting policy exists only in memory: write it once so other processes can load it
        from tba.models import save_checkpoint

        source = str(out_dir / "init")
        save_checkpoint(policy, tokenizer, Path(source))
    sources = ModelSources(policy=source, reference=cfg.model.reference or source, tokenizer=source)
    if cfg.runtime == "local":
        from tba.runtime.local import LocalRuntime

        return LocalRuntime(cfg, sources, policy.state_dict(), threads)
    from tba.runtime.ray import RayRuntime

    return RayRuntime(cfg, sources, policy.state_dict(), threads)


__all__ = ["ModelSources", "Runtime", "SearcherError", "make_runtime"]
