"""summary.json: what a finished run says of itself — before/after evaluation, train reward at the start and end,
and its counters (the CLI prints it as the before/after table, tba.run.progress.print_summary).
"""

from __future__ import annotations

import numpy as np

from tba.algorithm.state import RunTotals


def run_summary(state, run, totals: RunTotals) -> dict:
    """summary.json: before/after evaluation, train reward at the start and end, and the run's counters.
    `state`: the loop's tba.algorithm.state.RunState; `run`: what the run trained with (tba.run.build.Run)."""
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
        "replay_ratio": t.replay_ratio,
        **({"episodes_ended": t.episodes_ended} if t.episodes_ended else {}),
        **run.identity,
        "searchers": t.placement,
        **({"trainer_ranks": trainer.placement} if trainer.sharded else {}),
        "evals": [(e.step, e.score, e.train_s) for e in state.evals],
    }
