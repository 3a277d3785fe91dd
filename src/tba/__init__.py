"""tba: asynchronous, off-policy RL post-training of language models with Trajectory Balance."""

import logging

__version__ = "0.1.0"
__all__ = ["TBAConfig", "TBATrainer"]


def __getattr__(name: str):
    """`from tba import TBAConfig, TBATrainer` (tba.api), imported on first use: validating a config from the
    CLI imports `tba` too, and must not pay for torch."""
    if name in __all__:
        from tba import api

        return getattr(api, name)
    raise AttributeError(f"module 'tba' has no attribute {name!r}")

# transformers imports torchao whenever it is installed (search.quantize needs it): torchao then logs a warning
# per CUDA kernel library it cannot load on a machine without them, and torch's pytree a deprecation note per
# enum torchao registers — on every import, in every process, and nothing a user can act on.
for _logger in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_logger).setLevel(logging.ERROR)
