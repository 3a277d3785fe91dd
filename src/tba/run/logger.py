"""Where a run's per-step metrics go: metrics.jsonl (always), and the backends of `logging.report_to` — TensorBoard
by default, W&B, trackio, MLflow (tba.run.reporters).

Every quantity has one name,
`<component>/<quantity>` (trainer/loss, buffer/size, staleness/mean, eval/score, ...), plus `step` and
`wall_clock_s` on every line. The evaluation's `score` is greedy pass@1 for a 0/1 verifier and the mean
reward otherwise; docs/runtimes.md ("Metrics") lists every key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tba.config.reporting import LoggingConfig
from tba.run.reporters import open_reporters, scalars


class MetricsLogger:
    def __init__(self, out_dir: Path, cfg: LoggingConfig, run_config: dict | None = None, callbacks=None):
        """`run_config`: the whole run's config as a dict, for the backends' run pages; `callbacks`: fn(step,
        metrics), called after each line is written (tba.api's callbacks)."""
        self.callbacks = list(callbacks or [])
        self.path = out_dir / "metrics.jsonl"
        self.reporters = open_reporters(cfg, out_dir, run_config)
        self._file = self.path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        numbers = scalars(metrics)
        for reporter in self.reporters:
            reporter.log(step, numbers)
        for callback in self.callbacks:
            callback(step, metrics)

    def close(self) -> None:
        self._file.close()
        for reporter in self.reporters:
            reporter.close()
