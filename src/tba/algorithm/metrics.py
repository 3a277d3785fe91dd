"""What one update measures besides the trainer's own numbers: what was drawn (staleness = trainer version −
sample version, before the update), what the buffer holds, and — with several sources — each source's share.
Names are `<component>/<quantity>`; docs/runtimes.md ("Metrics") lists every key.
"""

from __future__ import annotations

import numpy as np


def source_metrics(draws, version: int, sources: dict[str, dict]) -> dict[str, float]:
    """Per source (searcher group, data), when the run has more than one: this update's share of the drawn
    samples, their mean reward and age, and the source's share of every sample received so far."""
    drawn = [s for d in draws for s in d.samples]
    names = sorted({s.source for s in drawn} | set(sources))
    if len(names) < 2:
        return {}
    received = sum(t["received"] for t in sources.values())
    out = {}
    for name in names:
        mine = [s for s in drawn if s.source == name]
        out[f"source/{name}/draw_share"] = len(mine) / len(drawn)
        out[f"source/{name}/draw_reward_mean"] = float(np.mean([s.reward for s in mine])) if mine else float("nan")
        out[f"source/{name}/age_mean"] = float(np.mean([version - s.version for s in mine])) if mine else float("nan")
        out[f"source/{name}/received_share"] = sources.get(name, {}).get("received", 0) / max(received, 1)
    return out


def step_metrics(update: dict[str, float], *, draws, version: int, buffer, fresh: list[float], received: int,
                 busy_fraction: float, searchers: dict[str, float], wall_clock_s: float,
                 sources: dict[str, dict] | None = None, replay_ratio: float = float("nan"),
                 search_tokens_per_s: float = float("nan")) -> dict[str, float]:
    """One step's metrics: the trainer's `update` metrics, plus what was drawn (staleness = trainer version −
    sample version, before the update), what the buffer holds, the searchers' own counters, and — with
    several sources — each source's share (tba.run.logger.source_metrics)."""
    drawn = [s for d in draws for s in d.samples]
    staleness = [version - s.version for s in drawn]  # of a sample's first (oldest) token
    token_ages = [version - (sum(s.versions) / len(s.versions) if s.versions else s.version) for s in drawn]
    extra = {}
    if buffer.rule.max_sample_age is not None:
        extra["buffer/too_old"] = buffer.too_old
    if buffer.data:
        extra["buffer/data_fraction"] = float(np.mean([d.data for d in draws]))
    return {
        **update,
        "searcher/reward_mean": float(np.mean(fresh)) if fresh else float("nan"),  # this step's fresh samples
        "searcher/samples_received": received,
        "buffer/draw_reward_mean": float(np.mean([s.reward for d in draws for s in d.samples])),
        "buffer/size": len(buffer),
        "buffer/prompts": buffer.num_prompts,
        "buffer/groups": buffer.groups_added,
        "buffer/age_mean": buffer.age_mean(version),
        "buffer/online_fraction": float(np.mean([d.online for d in draws])),
        "buffer/mixed_reward_fraction": float(np.mean([len({s.reward for s in d.samples}) > 1 for d in draws])),
        "staleness/mean": float(np.mean(staleness)),
        "staleness/max": float(np.max(staleness)),
        "staleness/token_mean": float(np.mean(token_ages)),  # per token: in-flight updates make it < mean
        "staleness/mixed_fraction": float(np.mean([s.last_version != s.version for s in drawn])),
        "trainer/busy_fraction": busy_fraction,
        **searchers,
        **extra,
        **source_metrics(draws, version, sources or {}),
        "wall_clock_s": wall_clock_s,
        "trainer/replay_ratio": replay_ratio,
        "searcher/tokens_per_s": search_tokens_per_s,
    }
