"""Seeds: one rule for the trainer and one for every searcher, whatever runtime hosts it.

The trainer process is seeded with `cfg.seed`. Searcher `rank` — inline in the trainer's process, a local
child process or a Ray actor — walks its prompt shard in the order `searcher_seed(cfg.seed, rank)` gives,
and a searcher in its own process seeds that process's RNGs (Python, NumPy, torch: the HF sampler draws
from torch's global generator) with the same number. So a sync run on searcher processes is reproducible,
and the inline and process runtimes walk the same prompts in the same order.
"""

from __future__ import annotations

import random

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
