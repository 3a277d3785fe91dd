"""`model.autocast`: mixed precision for every forward of the run (the trainer's forward and backward, the
searchers' sampling and π_ref scoring, evaluation), through torch.autocast.

Why autocast and not bfloat16 weights (`model.dtype: bfloat16`): Adam's steps at RL learning rates (1e-6–1e-5
of a weight) are below bfloat16's resolution (2⁻⁸ of a weight) and would round away; under autocast the weights
and Adam's moments stay in model.dtype and only the matmuls run in the lower precision — on this project's CPU
(AMX, AVX-512 BF16) a SmolLM2 trainer update and searcher batch ran about twice as fast
(bench/results/update_cost/). TRL's `bf16=True` (its default) is the
same thing through accelerate.

Why one setting for every forward: TB compares log π_θ, computed by the trainer, with log π_ref, computed by the
searchers, sample by sample; both in the same precision, the two agree exactly where θ = ref (at the start), so
rounding does not show up as a spurious KL. The behaviour policy (the searchers' sampling) may differ from the
trained one in any way — TB's target does not depend on it — so sampling under autocast is always sound.
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
