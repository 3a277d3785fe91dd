"""tba: asynchronous, off-policy RL post-training of language models with Trajectory Balance."""

__version__ = "0.1.0"
