"""What every runtime shares: what it is built from (`RuntimeParts`), how a worker builds its searcher from a
`tba.runtime.searcher_spec.SearcherSpec`, one worker step (`Worker`) and what a worker reports with each batch
(`WorkerStats`, `worker_report`). The protocol itself — the `Runtime` the loop is written against, and the
`RuntimeReport` it reads back — is tba.algorithm.runtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tba.algorithm.runtime import RuntimeReport
from tba.algorithm.seeding import rng_state, seed_everything, set_rng_state
from tba.config.schema import RayConfig, SupervisionConfig
from tba.errors import UserError
from tba.models import load_model, load_tokenizer, resolve_device
from tba.plugins import load_object
from tba.rollout.samplers.base import Sampler, SamplerSpec
from tba.rollout.searcher import Searcher
from tba.runtime.searcher_spec import SearcherSpec
from tba.tasks.base import Task
from tba.tasks.prepare import build_task, fit_prompts


class SearcherError(UserError, RuntimeError):
    """A searcher failed; the message carries its traceback."""


@dataclass
class InlineParts:
    """runtime=inline: the trainer process's own objects, which its one searcher shares."""

    task: Task
    tokenizer: object
    policy: torch.nn.Module
    """The behaviour policy (the trainer's, or the run's start when searchers are never synced)."""
    reference: torch.nn.Module


@dataclass
class RuntimeParts:
    """What a runtime factory (tba.runtime.RUNTIMES) is built from — tba.run.build makes it; each runtime reads what
    it uses: the searchers' specs, the weights they start from, and the settings of how they are supervised."""

    searchers: list[SearcherSpec]
    weights: dict[str, torch.Tensor]
    """The behaviour policy's tensors now (tba.models.synced_tensors, not copied): published before any searcher
    starts, so every searcher begins from them whatever its model sources hold."""
    version: int
    """Policy version of `weights` (the trainer's, on a resume)."""
    states: list[dict | None] | None
    """On resume: each searcher's checkpointed state (prompt cursor, counters, RNG)."""
    sync: bool
    """mode=sync: searchers generate one batch each when the loop asks, and the loop waits."""
    transport: str
    """search.weight_transport: auto | shared | broadcast | object_store."""
    supervision: SupervisionConfig
    ray: RayConfig
    inline: InlineParts | None = None


def build_searcher(spec: SearcherSpec, state: dict | None = None) -> Searcher:
    """Construct the searcher `spec` describes inside a worker (process or actor).

    `state` (a searcher's `state_dict`, plus `rng`: its process's RNG states) resumes a searcher where the
    trainer last heard from it. The searcher holds `spec.sources.policy`, the run's start: version 0, whatever
    the trainer's version; the weight transport brings it the trainer's (on a resume too).
    """
    torch.set_num_threads(spec.threads)
    device = resolve_device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # so that `cuda` in task options (reward models) means this GPU too
    reference = load_model(spec.sources.reference, spec.dtype).to(device)
    tokenizer = load_tokenizer(spec.sources.tokenizer)
    task = build_task(spec.task, tokenizer)
    fit_prompts(task, tokenizer, spec.prompt_limit, spec.long_prompts)
    seed_everything(spec.seed)  # the HF sampler draws from this process's torch generator
    sampler = build_sampler(spec.sampler, source=spec.sources.policy, tokenizer=tokenizer, device=device,
                            seed=spec.seed)
    searcher = Searcher(sampler, reference, tokenizer, task, spec.search, seed=spec.seed, shard=spec.shard,
                        num_shards=spec.num_shards, source=spec.source, scoring_temperature=spec.scoring_temperature,
                        autocast=spec.autocast)
    restore_searcher(searcher, state)
    attach_outside(searcher)
    return searcher


def attach_outside(searcher: Searcher) -> None:
    """An agent task's searcher gets its episodes from outside: an endpoint over its own sampler, on loopback, and
    the task's agent run against it (tba.serve.agents); `searcher.close()` ends both."""
    if not searcher.task.agentic:
        return
    from tba.serve.agents import AgentStream

    limit = getattr(getattr(searcher.reference, "config", None), "max_position_embeddings", None) or 4096
    searcher.attach(AgentStream(searcher.sampler, searcher.task.task, searcher.tokenizer, searcher.cfg,
                                version=lambda: searcher.version, max_model_len=int(limit)))


def build_sampler(spec: SamplerSpec, *, source: str, tokenizer, device, seed: int, policy=None) -> Sampler:
    """The sampler `spec` names (tba.rollout.samplers). `policy`: the hf backend samples with this model (the inline
    runtime passes a copy of the trainer's) instead of loading `source`."""
    return load_object(spec.target, "search.backend")(spec, source=source, tokenizer=tokenizer, device=device,
                                                      seed=seed, policy=policy)


def restore_searcher(searcher, state: dict | None) -> None:
    """Continue `searcher` from a reported state: prompt cursor and counters, and its process's RNG if
    the state carries one (workers do; the inline searcher shares the trainer's RNG, saved with it)."""
    if not state:
        return
    searcher.load_state_dict(state)
    if "rng" in state:
        set_rng_state(state["rng"])


def worker_state(searcher, with_rng: bool = True) -> dict:
    """What a worker reports with each batch so the trainer can checkpoint or restart it: the searcher's state and
    its process's RNG (`with_rng` False: a searcher in the trainer's process, whose RNG the checkpoint saves)."""
    return {**searcher.state_dict(), **({"rng": rng_state()} if with_rng else {})}


@dataclass
class WorkerStats:
    """What a searcher worker (process or actor) sends with each batch: the trainer's view of it."""

    rank: int
    version: int
    """Policy version of the weights it generated the batch with."""
    samples: int
    busy_s: float
    """Seconds spent generating (and scoring) since the worker started."""
    alive_s: float
    sync_s: float
    """Seconds spent loading published weights."""
    generate_s: float
    """Seconds inside the sampler: tokens / generate_s is its tokens/s."""
    loads: int
    quantize_s: float
    """Seconds spent quantizing loaded policies (search.quantize), included in `sync_s`'s loads."""
    state: dict
    """`worker_state`: prompt cursor, counters, RNG — what a restart resumes from."""
    reward_error: str | None
    reward_metrics: dict[str, float]
    """The task's own metrics of its last batch (each reward function's mean: `reward/<name>`)."""

    @classmethod
    def of(cls, searcher, rank: int, t_start: float, sync_s: float = 0.0, with_rng: bool = True) -> WorkerStats:
        s = searcher.stats
        return cls(rank=rank, version=searcher.version, samples=s.samples_generated, busy_s=s.busy_s,
                   alive_s=time.perf_counter() - t_start, sync_s=sync_s, generate_s=s.generate_s, loads=s.loads,
                   quantize_s=searcher.sampler.quantize_s, state=worker_state(searcher, with_rng),
                   reward_error=s.last_reward_error, reward_metrics=s.reward_metrics)


class Worker:
    """A searcher where a runtime hosts it (a process, a Ray actor): one batch per `step`, the newest published
    weights loaded when the searcher asks (first, or in flight: search.weight_update) if it follows the trainer
    (`synced`), and what the trainer hears with each batch. The same for every runtime: only how `step` is called
    and how its result travels differ."""

    def __init__(self, searcher, rank: int, synced: bool, receiver):
        self.searcher, self.rank, self.synced, self.receiver = searcher, rank, synced, receiver
        self.t_start, self.sync_s = time.perf_counter(), 0.0

    def step(self) -> tuple[list, WorkerStats]:
        groups = self.searcher.step(self if self.synced else None)  # a fixed behaviour keeps its own weights
        return groups, WorkerStats.of(self.searcher, self.rank, self.t_start, self.sync_s)

    # the searcher's tba.rollout.stream.WeightSync: the transport's receiver
    def pending(self) -> bool:
        return self.receiver.pending(self.searcher)

    def load(self) -> None:
        self.sync_s += self.receiver.poll(self.searcher)

    def idle(self) -> None:
        """Between batches with nothing to do (waiting to start, in sync mode to be asked, for room in a full queue):
        load newer weights now. The vllm transport needs it — its publish waits for every searcher to take part — and
        for the others it only moves the next batch's load earlier."""
        if self.synced and self.receiver.pending(self.searcher):
            self.load()


def worker_report(per_searcher: dict[int, WorkerStats], states: list[dict | None], placement: list[dict],
                  restarts: int) -> RuntimeReport:
    """What a runtime reports of its searchers (the loop's `RuntimeReport`), from the `WorkerStats` of each one's
    last batch: written once for every runtime."""
    s = [per_searcher[rank] for rank in sorted(per_searcher)]
    stats = {"searcher/restarts": restarts}
    if s:
        stats.update({
            "searcher/samples": sum(x.samples for x in s),
            "searcher/version_min": min(x.version for x in s),
            "searcher/busy_fraction": sum(x.busy_s for x in s) / max(sum(x.alive_s for x in s), 1e-9),
            "searcher/tokens": sum(x.state["tokens_generated"] for x in s),
            "searcher/generate_s": sum(x.generate_s for x in s),
            "sync/searcher_load_s": sum(x.sync_s for x in s),
            "sync/searcher_loads": sum(x.loads for x in s),
            "searcher/quantize_s": sum(x.quantize_s for x in s),
            "searcher/rewards_dropped": sum(x.state["rewards_dropped"] for x in s),
        })
    stats.update(mean_reward_metrics([x.reward_metrics for x in s]))
    stats.update(episode_ends([x.state for x in s]))
    reward_error = next((x.reward_error for x in s if x.reward_error), None)  # lowest rank first
    return RuntimeReport(stats, list(states), placement, reward_error)


def episode_ends(states: list[dict]) -> dict[str, float]:
    """Multi-turn tasks: episodes ever ended, by reason (tba.rollout.episodes.END_REASONS), summed over the searchers —
    `episode/ended_<reason>`; nothing for a single-turn run."""
    totals: dict[str, int] = {}
    for state in states:
        for reason, n in state["episode_ends"].items():
            totals[reason] = totals.get(reason, 0) + n
    if not any(totals.values()):
        return {}
    return {f"episode/ended_{reason}": float(n) for reason, n in totals.items()}


def mean_reward_metrics(per_searcher: list[dict[str, float]]) -> dict[str, float]:
    """Each task metric's mean over the searchers that reported it (NaN where none did)."""
    keys = sorted({k for m in per_searcher for k in m})
    out = {}
    for k in keys:
        values = [m[k] for m in per_searcher if k in m and m[k] == m[k]]
        out[k] = sum(values) / len(values) if values else float("nan")
    return out
