"""Runtimes host the searchers and move data; the training loop (tba.loop) is the same for all of them."""

from __future__ import annotations

import copy
from pathlib import Path

from tba.config import RunConfig
from tba.models import synced_tensors
from tba.runtime.base import ModelSources, Runtime, SearcherError, default_threads, restore_searcher


def make_runtime(cfg: RunConfig, *, task, tokenizer, policy, reference, source: str | None, out_dir: Path,
                 reference_source: str | None = None, version: int = 0, states: list[dict] | None = None,
                 log=print) -> Runtime:
    """Build the configured runtime around searchers that start from the trainer's current policy.

    On resume, `version` is the policy version of `policy` and `states` the searchers' checkpointed states.
    """
    _, searcher_threads = default_threads(cfg.search.num_searchers, cfg.runtime)
    threads = cfg.search.threads or searcher_threads
    if cfg.runtime == "offline":
        from tba.runtime.inline import OfflineRuntime

        return OfflineRuntime()
    if cfg.runtime == "inline":
        from tba.runtime.inline import InlineRuntime
        from tba.samplers import build_sampler
        from tba.searcher import Searcher

        if cfg.search.backend == "vllm" and source is None:
            source = _write_start(policy, tokenizer, out_dir)
        sampler = build_sampler(cfg, source=source, tokenizer=tokenizer, device=reference.device, seed=cfg.seed,
                                policy=copy.deepcopy(policy) if cfg.search.backend == "hf" else None)
        searcher = Searcher(sampler, reference, tokenizer, task, cfg.search, seed=cfg.seed)
        searcher.version = version
        restore_searcher(searcher, states[0] if states else None)
        return InlineRuntime(searcher)
    if source is None:
        source = _write_start(policy, tokenizer, out_dir)
    sources = ModelSources(policy=source, reference=reference_source or cfg.model.reference or source,
                           tokenizer=source)
    kwargs = {"version": version, "states": states, "log": log}
    initial = {k: v.detach() for k, v in synced_tensors(policy).items()}
    if cfg.runtime == "local":
        from tba.runtime.local import LocalRuntime

        return LocalRuntime(cfg, sources, initial, threads, **kwargs)
    from tba.runtime.ray import RayRuntime

    return RayRuntime(cfg, sources, initial, threads, **kwargs)


def _write_start(policy, tokenizer, out_dir: Path) -> str:
    """The starting policy exists only in memory: write it once so other processes (or vLLM) can load it."""
    from tba.models import save_checkpoint

    source = out_dir / "init"
    save_checkpoint(policy, tokenizer, source)
    return str(source)


__all__ = ["ModelSources", "Runtime", "SearcherError", "make_runtime"]
