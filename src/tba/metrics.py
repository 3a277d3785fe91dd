"""Metric sinks: metrics.jsonl (always), TensorBoard (default on), W&B (optional).

Keys are `<component>/<quantity>` (trainer/loss, buffer/size, searcher/samples_per_s, ...); metrics.jsonl
also carries the short names the README documents (step, wall_clock_s, loss, reward_mean, beta, lr,
buffer_size, tokens_per_s, staleness_mean, staleness_max) so that a line reads without a key table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tba.config import RunConfig, to_dict


class MetricsLogger:
    def __init__(self, out_dir: Path, cfg: RunConfig):
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = None
        self._wandb = None
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        if cfg.logging.wandb:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("logging.wandb=true needs `pip install wandb` (or tba[wandb])") from e
            self._wandb = wandb.init(project=cfg.logging.wandb_project, config=to_dict(cfg), dir=str(out_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and "/" in k:
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if "/" in k}, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
