"""Trainer ranks 1..N−1 as Ray actors (runtime=ray), placed together by one placement group (STRICT_PACK: one
node, so the trainer's collectives never cross the network between ranks); rank 0 stays the driver.

Each actor joins the trainer's process group at the driver's address (127.0.0.1 for a private Ray, the driver's
node IP on a cluster) and carries out rank 0's commands as actor calls; a call that raises comes back with its
traceback, an actor that dies as RayActorError, one that hangs as a timeout: each a TrainerRankError naming the
rank. Ray ends the actors with the driver's job; `close` ends them, the placement group, and Ray itself if the
trainer started it.
"""

from __future__ import annotations

import os
import socket

import torch

from tba.runtime import fsdp
from tba.runtime.ranks import (
    RankArgs,
    RankParts,
    TrainerRankError,
    backend,
    free_address,
    make_trainer,
    stopped,
)
from tba.runtime.ray import connect, kill, ray


class _RankActor:
    def __init__(self, a: RankArgs):
        torch.set_num_threads(a.parts.threads)
        fsdp.join(backend(a.device), a.rank, a.world, a.address, a.parts.fsdp.collective_timeout_s)
        model, args = a.parts.build(a.device)
        self.trainer = make_trainer(a, model, args)

    def ready(self) -> dict:
        return {"rank": self.trainer.rank, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname()}

    def run(self, command: str, payload) -> str:
        self.trainer.run(command, payload)
        return command


class RayRanks:
    """Rank 0's handle on the rank actors (a `tba.runtime.ranks.RankGroup`)."""

    def __init__(self, actors: list, group, timeout_s: float, started_ray: bool):
        self.actors, self.group, self.timeout_s, self.started_ray = actors, group, timeout_s, started_ray
        self.pending = [a.ready.remote() for a in actors]

    def arrived(self) -> None:
        pass  # each actor joins in its constructor; the rendezvous's own wait (fsdp.RENDEZVOUS_S) bounds its start

    def send(self, command: str, payload) -> None:
        self.pending = [a.run.remote(command, payload) for a in self.actors]

    def answers(self, command: str, what: str = "done") -> None:
        for rank, ref in enumerate(self.pending, 1):
            try:
                ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise self._error(command, f"rank {rank} did not answer within {self.timeout_s:g} s "
                                           "(trainer.fsdp.collective_timeout_s)") from None
            except ray.exceptions.RayActorError as e:
                raise self._error(command, f"rank {rank} (a Ray actor) died: {e}") from None
            except ray.exceptions.RayTaskError as e:
                raise self._error(command, f"rank {rank} raised (remote traceback, from Ray):\n{e}") from None

    def failure(self, command: str, cause: Exception) -> TrainerRankError:
        for rank, ref in enumerate(self.pending, 1):
            try:
                ray.get(ref, timeout=5.0)
            except ray.exceptions.GetTimeoutError:
                return self._error(command, f"rank {rank} did not answer within trainer.fsdp.collective_timeout_s = "
                                            f"{self.timeout_s:g} s (rank 0's collective: {type(cause).__name__}: "
                                            f"{cause})")
            except ray.exceptions.RayActorError as e:
                return self._error(command, f"rank {rank} (a Ray actor) died: {e}")
            except ray.exceptions.RayTaskError as e:
                return self._error(command, f"rank {rank} raised (remote traceback, from Ray):\n{e}")
        return self._error(command, f"rank 0's collective failed: {type(cause).__name__}: {cause}")

    def _error(self, command: str, why: str) -> TrainerRankError:
        return stopped(self, command, why)

    def close(self) -> None:
        import torch.distributed as dist

        kill(self.actors)
        if self.group is not None:
            ray.util.remove_placement_group(self.group)
        self.actors, self.group, self.pending = [], None, []
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def start_actors(parts: RankParts, world: int, devices: list[torch.device], cfg) -> tuple[RayRanks, str]:
    """Ranks 1..world−1 as actors of one placement group (each declares the trainer's threads as CPUs and one GPU
    if the ranks are on GPUs); (their handle, the rendezvous address on the driver's node)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    started = connect(cfg)
    host = "127.0.0.1" if not cfg.address else ray.util.get_node_ip_address()
    address = free_address(host)
    gpus = 1 if devices[0].type == "cuda" else 0
    bundle = {"CPU": float(parts.threads), **({"GPU": float(gpus)} if gpus else {})}
    group = ray.util.placement_group([bundle] * (world - 1), strategy="STRICT_PACK")
    try:
        ray.get(group.ready(), timeout=parts.fsdp.collective_timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(group)
        raise TrainerRankError(f"Ray could not place {world - 1} trainer ranks of {bundle} together on one node within "
                               f"{parts.fsdp.collective_timeout_s:g} s (trainer.fsdp.collective_timeout_s)") from None
    actor_cls = ray.remote(_RankActor)
    actors = []
    for r in range(1, world):
        device = torch.device("cuda", 0) if gpus else devices[r]  # Ray shows each actor its own GPU as cuda:0
        args = RankArgs(r, world, address, device, parts, None, None, os.getpid())
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=r - 1)
        actors.append(actor_cls.options(num_cpus=bundle["CPU"], num_gpus=gpus, scheduling_strategy=strategy,
                                        max_restarts=0).remote(args))
    return RayRanks(actors, group, parts.fsdp.collective_timeout_s, started), address

