"""A sharded trainer's ranks as Ray actors (runtime=ray): one placement group with a bundle per rank — rank 0
included, so no GPU is handed out twice (the controller, Ray's driver, holds none) — placed by
`ray.trainer_placement` (PACK by default: one node when the ranks fit there, several when they do not).

The rendezvous is rank 0's: its actor picks a free port on its own node's address and every rank joins there, so
ranks on several nodes find each other (NCCL then chooses its interfaces itself: NCCL_SOCKET_IFNAME). Ranks on
another node than the controller write their part of every checkpoint into the run directory, so each rank first
checks that it sees the controller's marker file there: a run directory that is not on a shared filesystem stops the
start with one error naming the rank, its node and the directory.

Commands are actor calls; a streaming one (a publication) is a Ray generator on every rank, rank 0's yielding the
buckets. A call that raises comes back with its traceback, an actor that dies as RayActorError, one that hangs as a
timeout: each a TrainerRankError naming the rank, after every rank is ended. Ray ends the actors with the driver's
job; `close` ends them, the placement group, and Ray itself if the trainer started it.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import torch

from tba.errors import UserError
from tba.ranks import fsdp
from tba.ranks.controller import TrainerRankError
from tba.ranks.local import free_address
from tba.ranks.rank import STREAMS, RankParts, build
from tba.runtime.ray import connect, kill, ray

MARKER = ".tba-controller"


class _RankActor:
    def __init__(self, rank: int, world: int, parts: RankParts):
        torch.set_num_threads(parts.threads)
        self.rank, self.world, self.parts, self.trainer = rank, world, parts, None

    def where(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname(), "ip": ray.util.get_node_ip_address()}

    def address(self) -> str:
        """rank 0: a rendezvous address on this actor's node."""
        return free_address(ray.util.get_node_ip_address())

    def check_run_dir(self, run_dir: str, nonce: str) -> None:
        marker = Path(run_dir) / MARKER
        try:
            seen = marker.read_text().strip()
        except OSError:
            seen = None
        if seen != nonce:
            raise UserError(f"trainer rank {self.rank} on node {socket.gethostname()} "
                            f"({ray.util.get_node_ip_address()}) does not see the run directory {run_dir} the "
                            "controller writes (its marker file is missing or another run's): every rank writes its "
                            "part of each checkpoint there, so output_dir must be on a filesystem every node shares "
                            "(NFS, a cluster filesystem)")

    def start(self, address: str, device: str) -> None:
        device = torch.device(device)
        fsdp.bounded_heap()
        fsdp.join(self.rank, self.world, address, self.parts.fsdp.collective_timeout_s, device)
        self.trainer = build(self.parts, self.rank, self.world, device)

    def run(self, command: str, payload):
        return self.trainer.run(command, payload)

    def stream(self, command: str, payload) -> Iterator:
        yield from self.trainer.items(command, payload)
        fsdp.release_freed()


IN_FLIGHT = 2
"""Buckets of a stream rank 0's generator may yield ahead of the controller (Ray's generator backpressure): a yield
does not wait, so unbounded, rank 0 would gather every bucket ahead of the controller and hold the whole model."""


class RayRanks:
    """The controller's handle on the rank actors (a tba.ranks.controller.RankGroup)."""

    where = "Ray actors"

    def __init__(self, parts: RankParts, devices: list[torch.device], cfg, run_dir: Path):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world, self.timeout_s = len(devices), parts.fsdp.collective_timeout_s
        self.started_ray = connect(cfg)
        gpus = 1 if devices[0].type == "cuda" else 0
        bundle = {"CPU": float(parts.threads), **({"GPU": float(gpus)} if gpus else {}),
                  **{k: float(v) for k, v in (cfg.trainer_resources or {}).items()}}
        self.group, self.actors = None, []
        try:
            self.group = ray.util.placement_group([bundle] * self.world, strategy=cfg.trainer_placement)
            try:
                ray.get(self.group.ready(), timeout=fsdp.RENDEZVOUS_S)
            except ray.exceptions.GetTimeoutError:
                raise TrainerRankError(f"Ray could not place {self.world} trainer ranks of {bundle} each "
                                       f"({cfg.trainer_placement}) within {fsdp.RENDEZVOUS_S:g} s: the cluster lacks "
                                       "the resources (ray status shows them)") from None
            actor = ray.remote(_RankActor)
            for r in range(self.world):
                strategy = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=r)
                self.actors.append(actor.options(num_cpus=bundle["CPU"], num_gpus=gpus, max_restarts=0,
                                                 scheduling_strategy=strategy,
                                                 resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
                                                 ).remote(r, self.world, parts))
            self.placement = self._get([a.where.remote() for a in self.actors], "start", fsdp.RENDEZVOUS_S)
            nonce = secrets.token_hex(8)
            (Path(run_dir) / MARKER).write_text(nonce)
            self._get([a.check_run_dir.remote(str(run_dir), nonce) for a in self.actors], "start", 60.0)
            address = self._get([self.actors[0].address.remote()], "start", 60.0)[0]
            # Ray shows each actor its own GPU as cuda:0; on CPU every rank is on the cpu
            device = "cuda:0" if gpus else "cpu"
            self._get([a.start.remote(address, device) for a in self.actors], "start",
                      fsdp.RENDEZVOUS_S + self.timeout_s)
        except BaseException:
            self.close()
            raise

    def call(self, command: str, payloads: list, timeout_s: float) -> list:
        return self._get([a.run.remote(command, p) for a, p in zip(self.actors, payloads, strict=True)], command,
                         timeout_s)

    def stream(self, command: str, payloads: list, timeout_s: float) -> Iterator:
        if command not in STREAMS:
            raise ValueError(f"{command!r} is not a streaming command")
        streams = [a.stream.options(num_returns="streaming", _generator_backpressure_num_objects=IN_FLIGHT).remote(
                       command, p)
                   for a, p in zip(self.actors, payloads, strict=True)]
        main = streams[0]
        while True:
            ready, _ = ray.wait([main], timeout=timeout_s)
            if not ready:
                raise self._error(command, f"rank 0 sent nothing within {timeout_s:g} s "
                                           "(trainer.fsdp.collective_timeout_s)")
            try:
                ref = next(main)
            except StopIteration:
                break
            yield self._get([ref], command, timeout_s)[0]
        self._get([s.completed() for s in streams], command, timeout_s)

    def _get(self, refs: list, command: str, timeout_s: float) -> list:
        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise self._error(command, f"a rank did not answer within {timeout_s:g} s") from None
        except ray.exceptions.RayActorError as e:
            raise self._error(command, f"{self._which(refs, e)} (a Ray actor) died: {e}") from None
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(getattr(e, "cause", None), UserError) else None
            if cause is not None:  # a rank's own one-line error (e.g. the run directory is not shared)
                self.close()
                raise cause from None
            raise self._error(command, f"{self._which(refs, e)} raised (remote traceback, from Ray):\n{e}") from None

    def _which(self, refs: list, error: Exception) -> str:
        """The rank whose call failed: the first of `refs` that is done and raises."""
        for r, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.GetTimeoutError:
                continue
            except Exception:  # noqa: BLE001 — this is the failing one
                return f"rank {r}" if len(refs) == self.world else "a rank"
        return "a rank"

    def _error(self, command: str, why: str) -> TrainerRankError:
        self.close()
        return TrainerRankError(f"{why} (during {command!r}); every rank is stopped. `tba train --resume RUN_DIR` "
                                "continues from the last checkpoint")

    def close(self) -> None:
        if self.actors:
            kill(self.actors)
        if self.group is not None:
            ray.util.remove_placement_group(self.group)
        self.actors, self.group = [], None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False
