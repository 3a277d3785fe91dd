"""Seeds: one rule for the trainer and one for every searcher, whatever runtime hosts it.

The trainer process is seeded with `cfg.seed`. Searcher `rank` — inline in the trainer's process, a local
child process or a Ray actor — walks its prompt shard in the order `searcher_seed(cfg.seed, rank)` gives,
and a searcher in its own process seeds that process's RNGs (Python, NumPy, torch: the HF sampler draws
from torch's global generator) with the same number. So a sync run on searcher processes is reproducible,
and the inline and process runtimes walk the same prompts in the same order.
"""

from __future__ import annotations

import base64
import random
import warnings
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


def encode_bytes(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def decode_bytes(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def rng_state() -> dict:
    """This process's Python, NumPy and torch RNG states (JSON-able), and under "cuda" one state per CUDA
    device if this process has initialised CUDA (it is not initialised for this)."""
    np_state, (version, internal, gauss) = np.random.get_state(), random.getstate()
    state = {"python": [version, list(internal), gauss],
             "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
             "torch": encode_bytes(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [encode_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned. CUDA states are restored when this process sees as many devices
    as they were saved from, else skipped with a warning; a state saved without CUDA in use has none."""
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(decode_bytes(state["torch"]))
    cuda = state.get("cuda")
    if cuda is not None:
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if devices == len(cuda):
            torch.cuda.set_rng_state_all([decode_bytes(s) for s in cuda])
        else:
            warnings.warn(f"the saved RNG state holds {len(cuda)} CUDA generator(s) but this process sees "
                          f"{devices} CUDA device(s): CUDA RNG not restored, so CUDA sampling will not repeat "
                          "the interrupted run exactly", RuntimeWarning, stacklevel=2)
