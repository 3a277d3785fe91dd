"""One rank of a sharded trainer (trainer.world_size = N > 1): its shard of the policy, its share of each update,
and the commands the run's controller sends it (tba.ranks.controller). Every rank runs this same code — rank 0
included: it is an ordinary rank, with no whole copy of the policy and nothing the other ranks lack.

Commands, each carried out by every rank in the same order (so every collective inside matches):

    step      this rank's prompt groups of an update (the controller splits the batch), the batch's sample count
              and age factor: the update, its metrics merged over ranks
    publish   the forward-dtype weights gathered bucket by bucket; rank 0 sends each bucket to the controller
    evaluate  the policy made whole for a moment in the forward dtype; this rank's share of the test prompts
    save      model/ (rank 0, from the fp32 masters, streamed), reference/ (TBA′), optimizer/ (every rank, DCP)
    export    model/ alone: the run's final checkpoint/
    load      the optimizer state (DCP, or a one-process checkpoint's), the version
    masters   the master weights streamed to the controller (tests, export)
    memory    this rank's peak memory (its process; its GPU)

A rank that raises sends its traceback and exits; the controller, which never takes part in a collective, sees
that, a death or a silence, names the rank and ends the others (tba.ranks.local, tba.ranks.ray).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from tba.algorithm.trainer import Trainer, _Tally
from tba.config.fsdp import FSDPConfig
from tba.models import DTYPES, save_buckets, synced_tensors
from tba.models.logprobs import response_logprobs
from tba.models.sources import safetensors_index
from tba.ranks import fsdp

logger = logging.getLogger(__name__)

STREAMS = ("publish", "masters")
"""Commands whose answer is a stream of items (buckets of tensors in host memory) from rank 0: `RankTrainer.items`."""


@dataclass(frozen=True)
class RankParts:
    """What every rank builds its part from; `build` is picklable (tba.run.build.RankBuild makes it)."""

    build: Callable
    """build() → RankModels: the policy (on the meta device), the Trainer's other arguments, and how to make the
    rest (rank 0's start weights, π_ref, evaluation)."""
    fsdp: FSDPConfig
    dtype: str
    """model.dtype: the master weights' and Adam's."""
    publish_dtype: str
    """search.dtype resolved: what the searchers load."""
    threads: int

    @property
    def compute_dtype(self) -> str:
        return self.fsdp.param_dtype or self.dtype


@dataclass
class RankModels:
    """What `RankParts.build()` returns in a rank's process."""

    policy: torch.nn.Module
    """The policy's architecture on the meta device (LoRA-wrapped when the run trains adapters)."""
    trainer_args: dict
    """The Trainer's keyword arguments besides its model (no `reference`: a rank makes its own)."""
    start: Callable[[], torch.nn.Module]
    """The start policy, whole, in host memory (the checkpoint's on resume), loaded by rank 0 to broadcast only
    when the ranks cannot read their shards from `start_source` themselves."""
    start_source: str | None = None
    """Where the start weights are (a directory, a hub name): each rank reads its own shards from its files."""
    reference: Callable[[], torch.nn.Module] | None = None
    """The objective's own π_ref (TBA′), whole in host memory (rank 0 only, as `start`); None when the objective
    keeps none."""
    reference_source: str | None = None
    """Where that π_ref is, read as `start_source`."""
    evaluation: Callable[[], object] | None = None
    """The evaluation's parts (tba.rollout.evaluate.ShareEvaluation), made at a rank's first evaluation."""
    skeleton: Callable[[str], torch.nn.Module] | None = None
    """skeleton(dtype): the policy's architecture on the meta device in `dtype` (an evaluation's whole copy)."""


class ShardedReference:
    """TBA′'s own π_ref, sharded like the policy (FSDP2, forward only, in the compute dtype): its log-probs are a
    collective forward on every rank; a reset copies each rank's policy shards into its reference shards, locally."""

    def __init__(self, model: torch.nn.Module, every: int | None, policy: torch.nn.Module, chunk_tokens: int):
        self.model, self.every, self.policy = model.eval().requires_grad_(False), every, policy
        self.chunk_tokens = chunk_tokens

    @torch.no_grad()
    def logprobs(self, prompts, responses, temperature: float, pad_id: int) -> torch.Tensor:
        return response_logprobs(self.model, prompts, responses, temperature, pad_id, self.chunk_tokens)[0]

    def updated(self, policy_state, version: int) -> None:
        if self.every and version % self.every == 0:
            fsdp.copy_local(self.policy, self.model)  # π_ref ← π_θ every ρ updates, shard by shard


@dataclass(frozen=True)
class Update:
    """One update's part for one rank (what the controller sends with `step`)."""

    draws: list
    """This rank's prompt groups (B/N of them, in order)."""
    samples: int
    """Samples in the whole update: each rank's loss is its share of the batch mean."""
    age: float
    """The age-scaled step's factor, from the whole update's samples (trainer.stale_lr_age)."""
    version: int


class RankTrainer(Trainer):
    """One rank's trainer: the algorithm's Trainer on its shard of the policy and its share of each batch."""

    sharded = True

    def __init__(self, model, *, rank: int, world: int, parts: RankParts, models: RankModels, device: torch.device,
                 **trainer_args):
        super().__init__(model, **trainer_args)
        self.rank, self.world, self.parts, self.models, self.device = rank, world, parts, models, device
        self.checkpoints = fsdp.checkpoint_group(parts.fsdp.checkpoint_timeout_s)
        self.synced = set(synced_tensors(model))  # the names searchers load (every tensor, or LoRA's adapters)
        self._evaluation, self.rss_start_gb = None, float("nan")

    # ---- the commands ----------------------------------------------------------------------------------------
    def run(self, command: str, payload):
        """Carry out one command of the controller on this rank; returns its answer (plain data, host memory)."""
        try:
            return self._run(command, payload)
        finally:
            fsdp.release_freed()  # a command's host copies, freed, leave this process's RSS

    def _run(self, command: str, payload):
        if command == "step":
            return self.step_part(payload)
        if command == "evaluate":
            return self.evaluate(payload)
        if command == "save":
            return self.save(Path(payload))
        if command == "load":
            return self.load(*payload)
        if command == "memory":
            return self.memory(reset=bool(payload))
        if command == "export":
            return self.export(Path(payload))
        raise ValueError(f"unknown trainer command {command!r}")

    def items(self, command: str, payload) -> Iterator[dict]:
        """Carry out a streaming command (STREAMS) on this rank: rank 0 yields each bucket in host memory as it is
        gathered, the other ranks take part in the gathers and yield nothing."""
        if command == "publish":
            buckets = self.publish(payload)
        elif command == "masters":
            buckets = fsdp.master_buckets(self.model, bucket_mb=self.parts.fsdp.publish_bucket_mb)
        else:
            raise ValueError(f"unknown streaming trainer command {command!r}")
        for bucket in buckets:
            if self.rank == 0 and bucket:
                yield bucket

    def step_part(self, u: Update) -> dict[str, float] | None:
        self.version = u.version
        metrics = self.update(u.draws, samples=u.samples, age=u.age)
        return metrics if self.rank == 0 else None

    def publish(self, options: dict | None = None) -> Iterator[dict]:
        """The synced tensors in the forward dtype, bucket by bucket; rank 0 copies each bucket to host memory in
        the searchers' dtype, to be sent before the next is gathered. `options`: another `dtype` or `bucket_mb` than
        the run's (benchmarks)."""
        options = options or {}
        cast = DTYPES[options.get("dtype") or self.parts.publish_dtype]
        mb = options.get("bucket_mb") or self.parts.fsdp.publish_bucket_mb
        for bucket in fsdp.forward_buckets(self.model, self.synced, bucket_mb=mb):
            yield {k: v.detach().to("cpu", cast, copy=True) for k, v in bucket.items()} if self.rank == 0 else {}

    def evaluate(self, share) -> object:
        """This rank's part of an evaluation (`share`: its test prompts, tba.rollout.evaluate.Share): the policy is
        made whole on this device in the compute dtype (every rank takes part in the gathers), evaluated, freed."""
        if self._evaluation is None:
            self._evaluation = self.models.evaluation()
        whole = self.models.skeleton(self.parts.compute_dtype)
        whole.to_empty(device=self.device)
        try:
            mine = {fsdp.clean(k): v for k, v in whole.state_dict(keep_vars=True).items()}
            with torch.no_grad():
                for bucket in fsdp.forward_buckets(self.model, set(mine), bucket_mb=self.parts.fsdp.publish_bucket_mb):
                    for name, tensor in bucket.items():
                        mine[name].copy_(tensor)
                theirs = {fsdp.clean(k): b for k, b in self.model.named_buffers()}
                for name, buffer in whole.named_buffers():  # non-persistent ones too (rotary frequencies)
                    buffer.copy_(theirs[fsdp.clean(name)])
            return self._evaluation(whole, share, self.device)
        finally:
            whole.to_empty(device="meta")  # frees the copy
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def save(self, path: Path) -> list[dict] | None:
        """Rank 0 writes model/ (and TBA′'s reference/) from the shards' master weights, streamed; every rank writes
        its part of optimizer/. Returns rank 0's optimizer hyperparameters (for state.json)."""
        mb = self.parts.fsdp.publish_bucket_mb
        self.export(path / "model")
        if self.reference is not None:
            _write(path / "reference", fsdp.master_buckets(self.reference.model, bucket_mb=mb), self.reference.model,
                   main=self.rank == 0)
        fsdp.save_optimizer(self.model, self.optimizer, path / "optimizer", group=self.checkpoints)
        if self.rank != 0:
            return None
        return [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.state_dict()["param_groups"]]

    def memory(self, reset: bool = False) -> dict[str, float]:
        """This rank's memory in GB: its process's peak resident memory (VmHWM) and what it was before the model was
        built (`start`: the interpreter and libraries), and on a GPU the peak torch allocated there. `reset`: the
        peaks start again from now (a benchmark's phase by phase)."""
        out = {"pid": os.getpid(), "rss_peak_gb": _status_gb("VmHWM"), "rss_start_gb": self.rss_start_gb}
        if self.device.type == "cuda":
            out["gpu_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        if reset:
            reset_peaks(self.device)
        return out

    def export(self, path: Path) -> None:
        """model/ alone (the run's final `checkpoint/`), from the master weights."""
        lora = getattr(self.model, "peft_config", None)
        buckets = fsdp.master_buckets(self.model, bucket_mb=self.parts.fsdp.publish_bucket_mb,
                                      names=self.synced if lora else None)
        _write(path, buckets, self.model, main=self.rank == 0)

    def load(self, path: str | None, one_process: Callable[[], dict] | None, version: int, skipped: int) -> None:
        """The optimizer state from a sharded checkpoint's DCP directory `path`, or a one-process checkpoint's
        (`one_process()`: torch's optimizer state dict, read by rank 0); the trainer's counters."""
        if path is not None:
            fsdp.load_optimizer(self.model, self.optimizer, Path(path), group=self.checkpoints)
        else:
            fsdp.load_full_optimizer(self.model, self.optimizer, one_process() if self.rank == 0 else None)
        self.version, self.skipped_steps = version, skipped

    # ---- how a rank's update differs from one process's ------------------------------------------------------
    def merged(self, tally: _Tally) -> _Tally:
        """The update's sums over every rank. Only host values cross the gather: a CUDA tensor would be unpickled on
        the device it came from, so rank 0 would hold rank r's tensors on cuda:r (and open a context there)."""
        everyone = [None] * self.world
        mine = (tally.loss, tally.tokens, tally.logp, tally.log_ratio, [x.detach().cpu() for x in tally.log_zs],
                [x.detach().cpu() for x in tally.residuals])
        dist.all_gather_object(everyone, mine)
        merged = _Tally(samples=tally.samples)
        for loss, tokens, logp, log_ratio, log_zs, residuals in everyone:
            merged.loss += loss
            merged.tokens += tokens
            merged.logp += logp
            merged.log_ratio += log_ratio
            merged.log_zs += log_zs
            merged.residuals += residuals
        return merged

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.world).backward()  # FSDP averages over ranks: the sum of the shares' gradients (tba.ranks.fsdp)

    def grad_norm(self) -> float:
        return fsdp.grad_norm(self.model).item()


def _write(path: Path, buckets, model, *, main: bool) -> None:
    """Consume `buckets` (collective) and, on rank 0, write them as a `from_pretrained` directory."""
    if not main:
        for _ in buckets:
            pass
        return
    peft = model if getattr(model, "peft_config", None) else None
    save_buckets(path, buckets, config=_config(model), peft=peft,
                 generation_config=getattr(model, "generation_config", None))


def _config(model):
    base = model.get_base_model() if getattr(model, "peft_config", None) else model
    return base.config


def reset_peaks(device: torch.device) -> None:
    """The process's VmHWM back to its current RSS (Linux: clear_refs 5) and torch's GPU peak to what is allocated."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _status_gb(field: str) -> float:
    """A memory field of this process's /proc status in GB (NaN where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def build(parts: RankParts, rank: int, world: int, device: torch.device) -> RankTrainer:
    """This rank's trainer: the policy sharded, π_ref sharded alike for an objective that keeps its own. Collective:
    every rank, in this order."""
    rss_start = _status_gb("VmRSS")
    models = parts.build()
    policy = _filled(models.policy, models.start, models.start_source, parts.fsdp, parts.dtype, device)
    args = dict(models.trainer_args)
    every = args.pop("reference_reset_steps", None)
    reference = None
    if models.reference is not None:
        ref_cfg = dataclasses.replace(parts.fsdp, param_dtype=parts.compute_dtype)
        ref = _filled(models.skeleton(parts.compute_dtype), models.reference, models.reference_source, ref_cfg,
                      parts.compute_dtype, device)
        reference = ShardedReference(ref, every, policy, args["cfg"].logprob_chunk_tokens)
    trainer = RankTrainer(policy, rank=rank, world=world, parts=parts, models=models, device=device,
                          reference=reference, **args)
    trainer.rss_start_gb = rss_start
    return trainer


def _filled(skeleton: torch.nn.Module, whole: Callable[[], torch.nn.Module], source: str | None, cfg: FSDPConfig,
            dtype: str, device: torch.device) -> torch.nn.Module:
    """`skeleton` sharded on `device` and its shards filled: each rank reads its own from `source`'s safetensors
    files when they hold every tensor (no process ever holds the whole model), else rank 0 loads `whole()` into host
    memory and broadcasts it (a LoRA adapter directory, a checkpoint in another format)."""
    buffers = fsdp.kept_buffers(skeleton)
    model = fsdp.shard(skeleton, cfg, dtype=dtype, device=device)
    model.to_empty(device=device)
    files = safetensors_index(source) if source is not None else None
    if fsdp.readable(model, files, buffers):
        fsdp.load_own_shards(model, files, buffers)
        return model
    start = whole() if dist.get_rank() == 0 else None
    fsdp.load_full(model, start.state_dict() if start is not None else None)
    fsdp.broadcast_buffers(model, start)
    return model


@contextlib.contextmanager
def process_group(rank: int, world: int, address: str, timeout_s: float, device: torch.device):
    """The trainer's default process group for the duration of the block."""
    fsdp.join(rank, world, address, timeout_s, device)
    try:
        yield
    finally:
        fsdp.leave()
