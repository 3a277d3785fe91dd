"""What a searcher is built from, as small picklable records: a searcher process or Ray actor receives a
`SearcherSpec` — not the run's config — and builds exactly what it describes (tba.runtime.worker.build_searcher).

tba.run.build makes them: it is the only code that reads the run's config and resolves registry names, so a spec
holds resolved `tba.plugins` targets (the task's factory, the sampler's builder), never a name to look up.
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.config.schema import SearchConfig
from tba.rollout.samplers.base import SamplerSpec
from tba.tasks.prepare import TaskSpec


@dataclass(frozen=True)
class ModelSources:
    """Where a searcher (in any process or node) loads its models from: hub names or local directories."""

    policy: str
    reference: str
    tokenizer: str


@dataclass(frozen=True)
class SearcherSpec:
    """Searcher `rank` (over every searcher of the run): its group, its shard of the train prompts within the
    group, its sampling settings, task, models, device and seed."""

    rank: int
    num_shards: int
    """Searchers in its group: each group covers every train prompt, a round-robin shard per searcher."""
    seed: int
    device: str
    """This searcher's device (`auto` is resolved where it runs)."""
    threads: int
    search: SearchConfig
    task: TaskSpec
    sampler: SamplerSpec
    sources: ModelSources
    dtype: str
    prompt_limit: int
    """Longest prompt in tokens (tba.tasks.prepare.fit_prompts), the trainer's limit."""
    long_prompts: str
    """skip | truncate: what happens to a prompt over the limit."""
    shard: int = 0
    """Its place in its group: it owns train prompts shard, shard + num_shards, …"""
    source: str = "policy"
    """Its group's name: the source every sample it produces records."""
    autocast: str | None = None
    """model.autocast: the precision it samples and scores in."""
    synced: bool = True
    """It loads every policy the trainer publishes; False: it samples its starting model for the whole run."""
    trained_policy: bool = True
    """It samples the trained policy (from the run's start); False: another model (`sources.policy`)."""
    scoring_temperature: float | None = None
    """The T of its reference log-probs (search.temperature); None = its own sampling temperature."""
