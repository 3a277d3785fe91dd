"""A trainer of N ranks (trainer.world_size > 1): rank 0 is the run's own process, ranks 1..N−1 are processes it
starts, and all of them step together on FSDP2 shards of the policy (tba.runtime.fsdp).

Rank 0 owns everything the run owns (buffer, loop, evaluation, metrics, checkpoints, searchers) and drives the
other ranks by commands on a queue each: "step" with the update's prompt groups (each rank trains on its equal
share, in order), "gather" for a publication, "save"/"load" for the optimizer state. A rank answers every command
on one shared queue. Between commands the ranks hold no collective open, so rank 0 may evaluate or wait for
searchers as long as it likes; inside a command every collective has `trainer.fsdp.collective_timeout_s`.

Failure: a rank that raises sends its traceback; one that dies or stops answering leaves rank 0's collective to
fail or time out. Either way rank 0 raises `TrainerRankError` naming the rank (its traceback, its exit code, or
"did not answer within …"), ends every rank, and `tba train --resume` continues from the last checkpoint. A rank
never outlives rank 0 (it watches rank 0's pid, tba.runtime.lifetime).

Rank 0 also keeps the policy whole (`copy`, the model the run built): evaluation, checkpoints' model/ and the
searchers' first weights read it, and it is brought up to date from the gathered shards only when one of them
needs it (`sync_copy`) — at a publication it is updated anyway.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tba.algorithm.trainer import Trainer, _Tally
from tba.algorithm.types import Draw
from tba.config.fsdp import FSDPConfig
from tba.errors import UserError
from tba.models import synced_tensors
from tba.runtime import fsdp
from tba.runtime.lifetime import Child, Lifeline

logger = logging.getLogger(__name__)


class TrainerRankError(UserError, RuntimeError):
    """A trainer rank failed, died or stopped answering; the message names it."""

    label = "trainer rank failed"


@dataclass(frozen=True)
class RankParts:
    """What a rank builds its trainer from; `build(device)` is picklable (tba.run.build makes it) and returns
    (the policy, unsharded, any weights: rank 0's are broadcast over them; the Trainer's other keyword arguments)."""

    build: Callable[[torch.device], tuple[torch.nn.Module, dict]]
    fsdp: FSDPConfig
    dtype: str
    """model.dtype: the master weights', and the published weights'."""
    threads: int


def rank_devices(cfg: FSDPConfig, world: int, model_device: str) -> list[torch.device]:
    """One device per rank: trainer.fsdp.devices as a list, or a type (cuda: rank r on cuda:r), or model.device's
    type."""
    given = [d.strip() for d in (cfg.devices or model_device).split(",")]
    if len(given) == world:
        return [torch.device(d) for d in given]
    kind = torch.device(given[0].replace("auto", "cuda" if torch.cuda.is_available() else "cpu")).type
    return [torch.device(kind, r) if kind != "cpu" else torch.device("cpu") for r in range(world)]


class RankGroup(Protocol):
    """Rank 0's handle on ranks 1..N−1, wherever they run (processes here: `LocalRanks`; Ray actors:
    tba.runtime.ray_ranks)."""

    def arrived(self) -> None:
        """Wait (up to fsdp.RENDEZVOUS_S) until every other rank has started and is about to join the process
        group; raises TrainerRankError naming a rank that died on the way."""

    def send(self, command: str, payload) -> None:
        """Start `command` on every other rank; returns at once."""

    def answers(self, command: str, what: str = "done") -> None:
        """Wait (within the collective timeout) until every other rank has carried out `command` (`what` =
        "ready": has started); raises TrainerRankError naming a rank that failed, died or did not answer."""

    def failure(self, command: str, cause: Exception) -> TrainerRankError:
        """The error to raise when rank 0's own part of `command` failed (`cause`): whatever the other ranks say."""

    def close(self) -> None:
        """End every other rank and the trainer's process group."""


def stopped(group: RankGroup, command: str, why: str) -> TrainerRankError:
    """End every rank of `group` and say why, naming the command it failed in and the way back."""
    group.close()
    return TrainerRankError(f"{why} (during {command!r}); every rank is stopped. `tba train --resume RUN_DIR` "
                            "continues from the last checkpoint")


class ShardedTrainer(Trainer):
    """One rank's trainer: the algorithm's Trainer on its shard of the policy and its share of each batch. On
    rank 0 it is also the run's trainer, and each public call first tells the other ranks to do the same."""

    sharded = True

    def __init__(self, model, *, rank: int, world: int, parts: RankParts, ranks: RankGroup | None = None,
                 whole: torch.nn.Module | None = None, **trainer_args):
        super().__init__(model, **trainer_args)
        self.rank, self.world, self.parts, self.ranks = rank, world, parts, ranks
        self.copy, self.copy_version = whole, 0

    # ---- rank 0: the run's trainer ----------------------------------------------------------------------------
    def step(self, draws: list[Draw]) -> dict[str, float]:
        return self._together("step", draws, lambda: super(ShardedTrainer, self).step(draws))

    def weights(self) -> dict[str, torch.Tensor]:
        """The synced tensors gathered from every rank's shards, in the whole copy (which they update)."""
        self.sync_copy()
        return {k: v.detach() for k, v in synced_tensors(self.copy).items()}

    def sync_copy(self, *, force: bool = False, bucket_mb: float | None = None) -> None:
        """Gather the shards into the whole copy if it is behind (`force`: anyway, e.g. to time it; `bucket_mb`:
        another bucket size than trainer.fsdp.publish_bucket_mb, for every rank)."""
        if force or self.copy_version != self.version:
            self._together("gather", bucket_mb, lambda: self.gather(bucket_mb))
            self.copy_version = self.version

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's whole state dict, gathered from the shards of the master weights (model.dtype)."""
        return self._together("state", None, self.full_state)

    def save_optimizer(self, path: Path) -> None:
        self._together("save", path, lambda: fsdp.save_optimizer(self.model, self.optimizer, path))

    def load_optimizer(self, path: Path | None, state: dict | None = None) -> None:
        """From a sharded checkpoint's DCP directory `path`, or a single-process checkpoint's optimizer `state`."""
        self._together("load", path, lambda: self.run("load", path, state))

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None

    def _together(self, command: str, payload, mine: Callable):
        ranks = self.ranks
        ranks.send(command, payload)
        try:
            result = mine()
        except Exception as e:  # a collective failed or timed out: which rank, and why
            raise ranks.failure(command, e) from None
        ranks.answers(command)
        return result

    # ---- every rank ----------------------------------------------------------------------------------------
    def run(self, command: str, payload, state: dict | None = None):
        """Carry out one command of rank 0 on this rank."""
        if command == "step":
            return Trainer.step(self, payload)
        if command == "state":
            return self.full_state()
        if command == "gather":
            return self.gather(payload)
        if command == "save":
            return fsdp.save_optimizer(self.model, self.optimizer, payload)
        if command == "load":
            if payload is not None:
                return fsdp.load_optimizer(self.model, self.optimizer, payload)
            return fsdp.load_full_optimizer(self.model, self.optimizer, state)
        raise ValueError(f"unknown trainer command {command!r}")

    def gather(self, bucket_mb: float | None = None) -> None:
        """Rank 0: the whole copy's synced tensors filled from the shards, in place; other ranks: their part."""
        into = synced_tensors(self.copy) if self.copy is not None else None
        fsdp.gather(self.model, into, bucket_mb=bucket_mb or self.parts.fsdp.publish_bucket_mb)

    def share(self, draws: list[Draw]) -> list[Draw]:
        n = len(draws) // self.world
        return draws[self.rank * n:(self.rank + 1) * n]

    def merged(self, tally: _Tally) -> _Tally:
        everyone = [None] * self.world
        dist.all_gather_object(everyone, (tally.loss, tally.tokens, tally.logp, tally.log_ratio, tally.log_zs,
                                          tally.residuals))
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
        (loss * self.world).backward()  # FSDP averages over ranks: the sum of the shares' gradients (tba.runtime.fsdp)

    def grad_norm(self) -> float:
        return fsdp.grad_norm(self.model).item()

    def full_state(self) -> dict[str, torch.Tensor]:
        return fsdp.full_state(self.model)


# ---- starting the ranks ------------------------------------------------------------------------------------------
def free_address(host: str = "127.0.0.1") -> str:
    """A rendezvous address on `host` (this machine's loopback unless the ranks are on other nodes)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


@dataclass
class RankArgs:
    rank: int
    world: int
    address: str
    device: torch.device
    parts: RankParts
    commands: object
    answers: object
    trainer_pid: int


def backend(device: torch.device) -> str:
    return "gloo" if device.type == "cpu" else "nccl"


def make_trainer(a: RankArgs, model, args: dict, whole=None, ranks=None) -> ShardedTrainer:
    """Shard `model` (built on the meta device: tba.run.build.RankBuild), allocate this rank's shards and fill them
    from rank 0's whole policy `whole` (None on the other ranks), its buffers and — for an objective that keeps its own
    π_ref — that reference too; then make the trainer over the shards. Collective: every rank, in this order."""
    model = fsdp.shard(model, a.parts.fsdp, dtype=a.parts.dtype, device=a.device)
    model.to_empty(device=a.device)
    fsdp.load_full(model, whole.state_dict() if whole is not None else None)
    fsdp.broadcast_buffers(model, whole)
    reference = args.get("reference")
    if reference is not None:
        if a.rank != 0:
            reference.model.to_empty(device=a.device)
            reference.model.tie_weights()  # to_empty unties a tied head; rank 0's is tied
        for tensor in [*reference.model.parameters(), *reference.model.buffers()]:
            dist.broadcast(tensor.data, src=0)
    return ShardedTrainer(model, rank=a.rank, world=a.world, parts=a.parts, ranks=ranks, whole=whole, **args)


def _rank_main(a: RankArgs) -> None:
    Lifeline(a.trainer_pid).watch()  # first: this process ends with rank 0, even blocked in a collective
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle; it then ends this rank
    try:
        torch.set_num_threads(a.parts.threads)
        a.answers.put(("arrived", a.rank, None))
        with fsdp.process_group(backend(a.device), a.rank, a.world, a.address, a.parts.fsdp.collective_timeout_s):
            model, args = a.parts.build(a.device)
            trainer = make_trainer(a, model, args)
            a.answers.put(("ready", a.rank, None))
            while True:
                command, payload = a.commands.get()
                if command == "stop":
                    break
                trainer.run(command, payload)
                a.answers.put(("done", a.rank, command))
    except BaseException:
        a.answers.put(("error", a.rank, traceback.format_exc()))
        sys.exit(1)


class LocalRanks:
    """Rank 0's handle on ranks 1..N−1: their processes, command queues and the queue of their answers."""

    def __init__(self, procs: list[Child], commands: list, answers, timeout_s: float):
        self.procs, self.commands, self.answers_q, self.timeout_s = procs, commands, answers, timeout_s
        self.errors: dict[int, str] = {}

    def send(self, command: str, payload) -> None:
        self._check_alive(command)
        for q in self.commands:
            q.put((command, payload))

    def arrived(self) -> None:
        self.answers("start", what="arrived", timeout_s=fsdp.RENDEZVOUS_S)

    def answers(self, command: str, what: str = "done", timeout_s: float | None = None) -> None:
        """Wait for every rank's answer to `command` (each within the collective timeout unless `timeout_s`)."""
        pending = set(range(1, len(self.procs) + 1))
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while pending:
            try:
                kind, rank, detail = self.answers_q.get(timeout=0.2)
            except queue.Empty:
                self._check_alive(command)
                if time.monotonic() > deadline:
                    bound = "a rank's start" if what == "arrived" else "trainer.fsdp.collective_timeout_s"
                    raise self._error(command, f"rank {min(pending)} did not answer within {timeout_s:g} s "
                                               f"({bound})") from None
                continue
            if kind == "error":
                raise self._error(command, f"rank {rank} raised:\n{detail}")
            if kind == what:
                pending.discard(rank)

    def failure(self, command: str, cause: Exception) -> TrainerRankError:
        """Rank 0's collective failed: the other ranks' own account if one comes within a few seconds."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                kind, rank, detail = self.answers_q.get(timeout=0.2)
            except queue.Empty:
                dead = [(r, p) for r, p in enumerate(self.procs, 1) if p.exited()]
                if dead:
                    r, p = dead[0]
                    return self._error(command, f"rank {r} (pid {p.pid}) died (exit code {p.reported_exitcode()})")
                continue
            if kind == "error":
                return self._error(command, f"rank {rank} raised:\n{detail}")
        stuck = ", ".join(f"rank {r} (pid {p.pid})" for r, p in enumerate(self.procs, 1))
        return self._error(command, f"{stuck} did not answer within trainer.fsdp.collective_timeout_s = "
                                    f"{self.timeout_s:g} s: alive but stopped or hung (rank 0's collective: "
                                    f"{type(cause).__name__}: {cause})")

    def _check_alive(self, command: str) -> None:
        for r, p in enumerate(self.procs, 1):
            if p.exited():
                try:  # its traceback, if it sent one before dying
                    while True:
                        kind, rank, detail = self.answers_q.get_nowait()
                        if kind == "error":
                            raise self._error(command, f"rank {rank} raised:\n{detail}")
                except queue.Empty:
                    pass
                raise self._error(command, f"rank {r} (pid {p.pid}) died (exit code {p.reported_exitcode()})")

    def _error(self, command: str, why: str) -> TrainerRankError:
        return stopped(self, command, why)

    def close(self) -> None:
        for q in self.commands:
            try:
                q.put(("stop", None))
            except (ValueError, OSError):
                pass
        for p in self.procs:
            if not p.wait(5.0):
                p.end()
            p.release()
        self.procs, self.commands = [], []
        if dist.is_initialized():
            dist.destroy_process_group()


def start_local(parts: RankParts, world: int, devices: list[torch.device]) -> tuple[LocalRanks, str]:
    """Ranks 1..world−1 as processes of this machine; (their handle, the rendezvous address)."""
    ctx = mp.get_context("spawn")
    address, answers = free_address(), ctx.Queue()
    commands = [ctx.Queue() for _ in range(world - 1)]
    procs = []
    for r in range(1, world):
        p = ctx.Process(target=_rank_main, name=f"tba-trainer-rank-{r}", daemon=True,
                        args=(RankArgs(r, world, address, devices[r], parts, commands[r - 1], answers,
                                        os.getpid()),))
        p.start()
        procs.append(Child(p))
    return LocalRanks(procs, commands, answers, parts.fsdp.collective_timeout_s), address


def start(parts: RankParts, *, world: int, devices: list[torch.device], whole: torch.nn.Module,
          trainer_args: dict, launch: Callable = start_local) -> ShardedTrainer:
    """Start ranks 1..world−1 with `launch` (`start_local`: processes here; runtime=ray: Ray actors in one placement
    group, tba.runtime.ray_ranks.start_actors), join them as rank 0 with `whole` (the run's policy, unsharded) as
    everyone's weights, and return rank 0's trainer. A rank that fails to start raises TrainerRankError."""
    t0 = time.perf_counter()
    ranks, address = launch(parts, world, devices)
    a = RankArgs(0, world, address, devices[0], parts, None, None, os.getpid())
    ranks.arrived()
    try:
        fsdp.join(backend(devices[0]), 0, world, address, parts.fsdp.collective_timeout_s)
        skeleton, _ = parts.build(devices[0])
        trainer = make_trainer(a, skeleton, trainer_args, whole=whole, ranks=ranks)
    except Exception as e:
        raise ranks.failure("start", e) from None
    ranks.answers("start", what="ready")
    where = "processes" if isinstance(ranks, LocalRanks) else "Ray actors"
    logger.info(f"trainer: {world} ranks ({', '.join(str(d) for d in devices)}; {where}), FSDP2, ready in "
                f"{time.perf_counter() - t0:.1f} s")
    return trainer

