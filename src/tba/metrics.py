"""What a run reports: the per-step metrics, the closing summary, and where they go.

Sinks: metrics.jsonl (always), TensorBoard (default on), W&B (optional). Every quantity has one name,
`<component>/<quantity>` (trainer/loss, buffer/size, staleness/mean, eval/score, ...), plus `step` and
`wall_clock_s` on every line. The evaluation's `score` is greedy pass@1 for a 0/1 verifier and the mean
reward otherwise; docs/architecture.md lists every key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tba.algorithm.state import RunTotals
from tba.config.schema import LoggingConfig


def run_summary(state, run, totals: RunTotals) -> dict:
    """summary.json: before/after evaluation, train reward at the start and end, and the run's counters.
    `state`: the loop's tba.algorithm.state.RunState; `run`: what the run trained with (tba.build.Run)."""
    trainer, buffer, fitted, t = run.trainer, run.buffer, run.fitted, totals
    window = max(1, len(state.rewards_seen) // 10)
    seen = state.rewards_seen
    return {
        "score_start": state.evals[0].score,
        "score_end": state.evals[-1].score,
        "test_problems": len(run.task.test),
        "eval_start": state.evals[0].metrics,
        "eval_end": state.evals[-1].metrics,
        "train_reward_start": float(np.mean(seen[:window])) if seen else float("nan"),
        "train_reward_end": float(np.mean(seen[-window:])) if seen else float("nan"),
        "wall_clock_s": t.wall_clock_s,
        "train_wall_clock_s": t.train_s,
        "startup_s": t.startup_s,
        "trainer_steps": trainer.version,
        "skipped_steps": trainer.skipped_steps,
        "samples_received": state.received,
        "samples_dropped_bad_reward": t.dropped,
        "searcher_restarts": t.restarts,
        "prompts_too_long": fitted["prompts_too_long"],
        "prompts_truncated": fitted["prompts_truncated"],
        "buffer_groups": buffer.groups_added,
        "buffer_evicted_prompts": buffer.evicted_prompts,
        "resumed_at_steps": state.resumed_at,
        "sources": {name: {"samples_received": t["received"], "samples_drawn": t["drawn"],
                           "reward_mean": t["reward_sum"] / t["received"] if t["received"] else None}
                    for name, t in sorted(state.sources.items())},
        **({"data": run.data} if run.data else {}),
        "buffer_data_samples": buffer.data_size,
        "trainer_busy_fraction": t.busy_fraction,
        **run.identity,
        "searchers": t.placement,
        "evals": [(e.step, e.score, e.train_s) for e in state.evals],
    }


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
