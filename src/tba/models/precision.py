"""`model.autocast`: mixed precision for every forward of the run (the trainer's forward and backward, the
searchers' sampling and π_ref scoring, evaluation), through torch.autocast.

Why autocast and not bfloat16 weights (`model.dtype: bfloat16`): Adam's steps at RL learning rates (1e-6–1e-5
of a weight) are below bfloat16's resolution (2⁻⁸ of a weight) and would round away; under autocast the weights
and Adam's moments stay in model.dtype and only the matmuls run in the lower precision — on this project's CPU
(AMX, AVX-512 BF16) a SmolLM2 trainer update and searcher batch ran about twice as fast
(bench/results/update_cost/). TRL's `bf16=True` (its default) is the
same thing through accelerate.

Why one setting for every forward: TB compares log π_θ, computed by the trainer, with log π_ref, computed by the
searchers, sample by sample; in different precisions the two would differ by the whole rounding of every token
where θ = ref (at the start), a spurious KL. In the same precision they still differ a little, because the trainer
and the searchers batch the same tokens differently and low-precision rounding depends on that — and TB sums the
difference over a response: a group whose samples carry no reward signal then trains on rounding, at a step size
Adam sets as for any other — the likely reason TB learned less per update under autocast
(bench/results/update_cost/autocast_drift.md), and why it is off by default. The behaviour policy (the searchers'
sampling) may differ from the trained one in any way — TB's target does not depend on it — so sampling under
autocast is always sound.
"""

from __future__ import annotations

import contextlib

import torch

from tba.models import DTYPES


def autocast(device: torch.device | str, dtype: str | None) -> contextlib.AbstractContextManager:
    """A context in which forwards on `device` compute in `dtype` (model.autocast); None: as the weights are."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=DTYPES[dtype])
