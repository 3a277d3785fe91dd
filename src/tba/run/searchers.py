"""The run's searchers, from the config: the task spec and sampler every searcher process builds its part from, the
searcher groups and which of them age, where each searcher runs (its device and shard), the behaviour policy they start
from, and the runtime that hosts them. `tba.run.build` assembles a run with these; where each searcher runs is
tba.run.placement (which `tba.run.plan` plans from too).
"""

from __future__ import annotations

import dataclasses
import math
import os

from tba.algorithm.runtime import Runtime
from tba.algorithm.seeding import searcher_seed
from tba.algorithm.state import RunState
from tba.config import RunConfig
from tba.config.schema import SearchConfig
from tba.errors import ConfigError
from tba.models import apply_lora, load_model, synced_tensors
from tba.models.sources import resolve_source
from tba.plugins import load_object
from tba.rollout.samplers import sampler_entry
from tba.rollout.samplers.base import SamplerSpec
from tba.run.placement import searcher_dtype, searcher_groups, searcher_placements
from tba.run.plan import vllm_shares
from tba.runtime import RUNTIMES
from tba.runtime.searcher_spec import ModelSources, SearcherSpec
from tba.runtime.worker import InlineParts, RuntimeParts
from tba.tasks import task_target
from tba.tasks.prepare import TaskSpec


def task_spec(cfg: RunConfig) -> TaskSpec:
    """The task's resolved factory (a registered name, or the custom target itself) and its settings."""
    t = cfg.task
    target, named = task_target(t.name)
    if clash := sorted(set(named) & set(t.options or {})):
        raise ConfigError(f"task.options.{clash[0]}: task.name={t.name} sets it already")
    return TaskSpec(target, {**(t.options or {}), **named}, t.train_size, t.test_size, t.chat_template)


def sampler_spec(cfg: RunConfig, search: SearchConfig | None = None, *, trained_policy: bool = True, rank: int = 0,
                 shares: dict[int, float] | None = None, dtype: str | None = None) -> SamplerSpec:
    """The sampler of searchers with `search`'s settings (default: the run's `search` section); another model
    than the trained policy (`trained_policy` False) gets no LoRA adapters. A vLLM engine on a GPU whose
    search.vllm.gpu_memory_utilization is null gets the share of its GPU the plan leaves searcher `rank`
    (tba.run.plan.vllm_shares; `shares` when the caller has them already). `dtype`: its models' (default:
    tba.run.placement.searcher_dtype on `search`'s device)."""
    s, m = search or cfg.search, cfg.model
    entry = sampler_entry(s.backend)  # a registered backend, or your own module:build
    max_len = s.vllm.max_model_len
    if max_len is None and cfg.task.max_prompt_tokens is not None:
        max_len = cfg.task.max_prompt_tokens + s.max_new_tokens
    lora = m.lora if m.lora.enabled and trained_policy else None
    vllm = s.vllm
    if s.backend == "vllm" and vllm.gpu_memory_utilization is None:
        share = (vllm_shares(cfg) if shares is None else shares).get(rank)
        if share is not None:  # None: a CPU engine, which sizes its KV cache by search.vllm.kv_cache_gb
            vllm = dataclasses.replace(vllm, gpu_memory_utilization=share)
    return SamplerSpec(entry.target, dtype or searcher_dtype(cfg, s.device or m.device), lora, vllm, max_len,
                       s.quantize, entry.takes_policy, entry.fresh_process, entry.child_env)


def aging_sources(cfg: RunConfig) -> frozenset[str]:
    """The sources whose samples age: groups that load the trainer's weights (none when it never publishes).
    The age-scaled step and the age cap look at these only: a fixed behaviour's data do not go stale."""
    if cfg.trainer.sync_every_steps == 0:
        return frozenset()
    return frozenset(g.name for g in searcher_groups(cfg) if (g.sync if g.sync is not None else g.policy is None))


def searcher_specs(cfg: RunConfig, sources: ModelSources, limit: int) -> list[SearcherSpec]:
    """One spec per searcher (`searcher_placements`): each its own seed (by its rank over the run), device and
    shard of the train prompts within its group. The reference log-probs of every group are at
    search.temperature, the trainer's."""
    s, placements = cfg.search, searcher_placements(cfg)
    threads = s.threads or default_threads(len(placements), cfg.runtime)[1]
    task, specs, own = task_spec(cfg), [], {}
    planned = any(p.search.backend == "vllm" and p.search.vllm.gpu_memory_utilization is None for p in placements)
    shares = vllm_shares(cfg) if planned else {}
    for p in placements:
        g, trained = p.group, p.group.policy is None
        if g.name not in own:
            own[g.name] = sources if trained else ModelSources(resolve_source(g.policy), sources.reference,
                                                               sources.tokenizer)
        dtype = searcher_dtype(cfg, p.device)
        sampler = sampler_spec(cfg, p.search, trained_policy=trained, rank=p.rank, shares=shares, dtype=dtype)
        specs.append(SearcherSpec(p.rank, g.num_searchers, searcher_seed(cfg.seed, p.rank), p.device, threads,
                                  p.search, task, sampler, own[g.name], dtype, limit, cfg.task.long_prompts,
                                  shard=p.shard, source=g.name, synced=g.sync if g.sync is not None else trained,
                                  trained_policy=trained, scoring_temperature=s.temperature,
                                  autocast=cfg.model.autocast))
    return specs


def behaviour_weights(cfg: RunConfig, policy, trainer, state: RunState, *, resumed: bool):
    """(the tensors the searchers start from, their version, the behaviour policy's model). The trainer's — but
    searchers that are never synced (trainer.sync_every_steps = 0) sample the run's start for the whole run, on a
    resume too: there it is loaded again from its source (version 0), not taken from the checkpoint. `policy`: the
    one-process trainer's (None for a sharded trainer, whose weights come from its ranks, in host memory)."""
    if not resumed or cfg.trainer.sync_every_steps != 0:
        if policy is None:
            return trainer.weights(), trainer.version, None
        return {k: v.detach() for k, v in synced_tensors(policy).items()}, trainer.version, policy
    start = load_model(state.policy_source, cfg.model.dtype)
    if policy is not None:
        start = start.to(next(policy.parameters()).device)
    if cfg.model.lora.enabled:
        start = apply_lora(start, cfg.model.lora)  # B = 0: the base, under the trainer's tensor names
    return {k: v.detach() for k, v in synced_tensors(start).items()}, 0, start


def build_runtime(cfg: RunConfig, *, weights: dict, version: int, inline: InlineParts | None, sources: ModelSources,
                  limit: int, states: list[dict] | None = None) -> Runtime:
    """The configured runtime (tba.runtime.RUNTIMES) around searchers that start from `weights` (the behaviour
    policy's tensors) at `version`; `inline`: runtime=inline's shared objects; on resume `states` are the
    searchers' checkpointed states."""
    parts = RuntimeParts(searchers=searcher_specs(cfg, sources, limit), weights=weights, version=version,
                         states=states, sync=cfg.mode == "sync", transport=cfg.search.weight_transport,
                         supervision=cfg.supervision, ray=ray_section(cfg), inline=inline)
    return load_object(RUNTIMES[cfg.runtime].target, "runtime")(parts)


def ray_section(cfg: RunConfig):
    """The `ray` section, with a private Ray (no ray.address, no ray.num_cpus) sized to hold the whole run: the trainer
    ranks' bundles and every searcher actor. Ray's CPUs are a scheduling count, not cores; sized by the cores alone,
    two ranks and a searcher on a 2-core laptop would wait for ever for the searcher's CPU."""
    r = cfg.ray
    if r.address or r.num_cpus is not None:
        return r
    searchers = sum(g.num_searchers for g in searcher_groups(cfg))
    threads = cfg.threads or default_threads(searchers, cfg.runtime)[0]
    ranks = cfg.trainer.world_size * threads if cfg.trainer.world_size > 1 else 0
    need = math.ceil(ranks + searchers * r.searcher_cpus)
    return dataclasses.replace(r, num_cpus=max(os.cpu_count() or 1, need))


def default_threads(num_searchers: int, runtime: str) -> tuple[int, int]:
    """(trainer threads, threads per searcher): one share of the cores per process, at least one."""
    cores = os.cpu_count() or 1
    if runtime == "inline":
        return cores, cores
    share = max(1, cores // (num_searchers + 1))
    return share, share
