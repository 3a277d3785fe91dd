"""The sharded trainer's section of the config schema (`trainer.world_size`, `trainer.fsdp.*`): how the trainer's
policy is split over N ranks with FSDP2 (tba.ranks) and how its weights are gathered for the searchers.
With trainer.world_size = 1 (the default) nothing here is used and the trainer is one process without
torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.config.rules import devices, one_of, or_none, positive, setting

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class FSDPConfig:
    devices: str | None = setting(None, devices)
    """The ranks' devices, one per rank (a comma list), or one device type for all: cpu | cuda (rank r on
    cuda:r). None = model.device's type."""
    param_dtype: str | None = setting(None, or_none(one_of(DTYPES)))
    """Dtype of the gathered parameters in forward and backward (FSDP2 MixedPrecisionPolicy). None = model.dtype;
    the sharded master weights and Adam's moments stay in model.dtype."""
    reduce_dtype: str = setting("float32", one_of(DTYPES))
    """Dtype of the gradient reduce-scatter across ranks."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (gathered again for backward): less memory,
    one more all-gather per layer."""
    publish_bucket_mb: float = setting(64.0, positive)
    """Weights travel to the searchers gathered this many MB at a time (whole FSDP units, a decoder layer each):
    a rank holds at most one bucket of unsharded weights beyond its shard while publishing."""
    checkpoint_timeout_s: float = setting(1800.0, positive)
    """Longest a checkpoint may take to save or load (model/ streamed by rank 0, every rank's optimizer shard through
    DCP; its own process group, so a slow shared filesystem does not trip the training collectives' limit)."""
    collective_timeout_s: float = setting(300.0, positive)
    """Longest wait of any collective among the trainer's ranks (and of a rank for rank 0's next command between
    updates: that wait is the searchers' collect timeout plus this). Past it the run ends with an error naming the
    rank; `tba train --resume` continues from the last checkpoint."""
