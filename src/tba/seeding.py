"""Seeds: one rule for the trainer and one for every searcher, whatever runtime hosts it.

The trainer process is seeded with `cfg.seed`. Searcher `rank` — inline in the trainer's process, a local
child process or a Ray actor — walks its prompt shard in the order `searcher_seed(cfg.seed, rank)` gives,
and a searcher in its own process seeds that process's RNGs (Python, NumPy, torch: the HF sampler draws
from torch's global generator) with the same number. So a sync run on searcher processes is reproducible,
and the inline and process runtimes walk the same prompts in the same order.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch (CPU and, where present, every CUDA device) RNGs of this process."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def searcher_seed(seed: int, rank: int) -> int:
    """Searcher `rank`'s seed: distinct per rank, distinct from the trainer's `seed`."""
    return seed + 1000 * (rank + 1)


@contextmanager
def rng_isolated() -> Iterator[None]:
    """Run a block without moving this process's RNGs (Python, NumPy, torch CPU and CUDA). For work whose
    RNG use depends on a cache: an SFT warm start trained now or read from disk leaves the same run after it."""
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
        yield
    random.setstate(py)
    np.random.set_state(npy)
