"""Training objectives. Each is a plain function over 1-D per-sequence tensors returning a scalar loss."""

from tba.objectives.tb import beta_at, vargrad_tb_loss

OBJECTIVES = {"tb": vargrad_tb_loss}

__all__ = ["OBJECTIVES", "beta_at", "vargrad_tb_loss"]
