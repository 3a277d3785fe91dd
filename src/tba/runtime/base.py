"""The runtime seam: what the training loop needs from whatever hosts the searchers.

Three things move: completed groups (searcher → buffer), weights with a version (trainer → searchers), and
control (start, stop, errors, metrics). A runtime implements `Runtime`; the loop in tba.loop is written
against it only, so it reads the same on one process, several local processes, or a Ray cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from tba.types import Group


class SearcherError(RuntimeError):
    """A searcher failed; the message carries its traceback."""


@dataclass
class ModelSources:
    """Where a searcher (in any process or node) loads its models from: hub names or local directories."""

    policy: str
    reference: str
    tokenizer: str


@dataclass
class RuntimeReport:
    """What the loop reads back from a runtime, besides groups: for metrics, checkpoints and the summary."""

    stats: dict[str, float]
    """Searcher-side metrics: samples, tokens, busy fraction, versions, weight loads, restarts, drops."""
    states: list[dict | None]
    """Each searcher's state as of the last batch received (prompt cursor, counters, RNG): for checkpoints."""
    placement: list[dict]
    """Where each searcher runs (rank, pid or Ray node id, host), for the run summary."""
    reward_error: str | None
    """The newest reward failure a searcher reported (the sample was dropped), for the log."""


class Runtime(Protocol):
    """Transport and lifecycle: start, move groups and weights, stop; and one `report` of everything else."""

    searchers: int
    """How many searchers produce samples (0: none, the loop trains on what the buffer was restored with)."""

    def launch(self) -> None:
        """Begin starting the searchers and return at once (processes spawn, import, load their models); they
        wait, ready, for `start`. The loop launches before its first evaluation so that the two overlap: a
        searcher process's imports and model load are seconds the trainer would otherwise wait for."""

    def start(self) -> None:
        """Start the searchers (launching them first if `launch` was not called); returns once every searcher
        is ready (or raises)."""

    def collect(self, block: bool) -> list[Group]:
        """Groups produced since the last call. block=True waits (with a timeout) for fresh ones: at least
        one per searcher in sync mode, at least one in all. block=False never waits."""

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Make `weights` (the trainer's state after `version` updates) available; never waits for searchers."""

    def report(self) -> RuntimeReport:
        """Searcher metrics, states, placement and the newest reward error, as of the last batch received."""

    def stop(self) -> None:
        """Stop every searcher and release every process or daemon this runtime started."""


def build_searcher(rank: int, cfg_dict: dict, sources: ModelSources, threads: int, state: dict | None = None):
    """Construct searcher `rank` inside a worker (process or actor) from plain, picklable inputs.

    `state` (a searcher's `state_dict`, plus `rng`: its process's RNG states) resumes a searcher where the
    trainer last heard from it. The searcher holds `sources.policy`, the run's start: version 0, whatever the
    trainer's version; the weight transport brings it the trainer's (on a resume too).
    """
    torch.set_num_threads(threads)
    from tba.config import from_dict
    from tba.models import load_model, load_tokenizer, resolve_device
    from tba.samplers import build_sampler
    from tba.searcher import Searcher
    from tba.seeding import searcher_seed, seed_everything
    from tba.tasks.prepare import build_task, fit_prompts, prompt_limit

    cfg = from_dict(cfg_dict)
    devices = (cfg.search.device or cfg.model.device).split(",")
    device = resolve_device(devices[rank % len(devices)].strip())
    if device.type == "cuda":
        torch.cuda.set_device(device)  # so that `cuda` in task options (reward models) means this GPU too
    reference = load_model(sources.reference, cfg.model.dtype).to(device)
    tokenizer = load_tokenizer(sources.tokenizer)
    task = build_task(cfg, tokenizer)
    fit_prompts(task, tokenizer, prompt_limit(cfg, reference), cfg.task.long_prompts)
    seed = searcher_seed(cfg.seed, rank)
    seed_everything(seed)  # the HF sampler draws from this process's torch generator
    sampler = build_sampler(cfg, source=sources.policy, tokenizer=tokenizer, device=device, seed=seed)
    searcher = Searcher(sampler, reference, tokenizer, task, cfg.search, seed=seed, shard=rank,
                        num_shards=cfg.search.num_searchers)
    restore_searcher(searcher, state)
    return searcher


def restore_searcher(searcher, state: dict | None) -> None:
    """Continue `searcher` from a reported state: prompt cursor and counters, and its process's RNG if
    the state carries one (workers do; the inline searcher shares the trainer's RNG, saved with it)."""
    if not state:
        return
    searcher.load_state_dict(state)
    if "rng" in state:
        from tba.checkpoint import set_rng_state

        set_rng_state(state["rng"])


def worker_state(searcher) -> dict:
    """What a worker reports with each batch so the trainer can checkpoint or restart it."""
    from tba.checkpoint import rng_state

    return {**searcher.state_dict(), "rng": rng_state()}


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
    state: dict
    """`worker_state`: prompt cursor, counters, RNG — what a restart resumes from."""
    reward_error: str | None

    @classmethod
    def of(cls, searcher, rank: int, t_start: float, busy_s: float, sync_s: float) -> WorkerStats:
        return cls(rank=rank, version=searcher.version, samples=searcher.samples_generated, busy_s=busy_s,
                   alive_s=time.perf_counter() - t_start, sync_s=sync_s, generate_s=searcher.generate_s,
                   loads=searcher.loads, state=worker_state(searcher), reward_error=searcher.last_reward_error)


def worker_report(per_searcher: dict[int, WorkerStats], states: list[dict | None], placement: list[dict],
                  restarts: int) -> RuntimeReport:
    """The report of a runtime whose searchers send `WorkerStats` with each batch (processes, Ray actors)."""
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
            "searcher/rewards_dropped": sum(x.state["rewards_dropped"] for x in s),
        })
    reward_error = next((x.reward_error for x in s if x.reward_error), None)  # lowest rank first
    return RuntimeReport(stats, list(states), placement, reward_error)


def initial_weights(policy) -> dict[str, torch.Tensor]:
    """The trainer's current synced tensors (no copy): what a worker runtime publishes before any searcher
    starts, so that every searcher begins from the trainer's policy whatever its model sources hold."""
    from tba.models import synced_tensors

    return {k: v.detach() for k, v in synced_tensors(policy).items()}
