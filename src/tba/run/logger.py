"""Where a run's per-step metrics go: metrics.jsonl (always), TensorBoard (default on), W&B (optional).

Every quantity has one name,
`<component>/<quantity>` (trainer/loss, buffer/size, staleness/mean, eval/score, ...), plus `step` and
`wall_clock_s` on every line. The evaluation's `score` is greedy pass@1 for a 0/1 verifier and the mean
reward otherwise; docs/architecture.md lists every key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tba.config.schema import LoggingConfig


class MetricsLogger:
    def __init__(self, out_dir: Path, cfg: LoggingConfig, run_config: dict | None = None, callbacks=None):
        """`run_config`: the whole run's config as a dict, for W&B's run page; `callbacks`: fn(step, metrics),
        called after each line is written (tba.api's callbacks)."""
        self.callbacks = list(callbacks or [])
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = None
        self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when it is used

            self._tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        if cfg.wandb:
            try:
                import wandb  # an optional dependency
            except ImportError as e:
                raise RuntimeError("logging.wandb=true needs `pip install wandb` (or tba[wandb])") from e
            self._wandb = wandb.init(project=cfg.wandb_project, config=run_config or {}, dir=str(out_dir))

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
        for callback in self.callbacks:
            callback(step, metrics)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
