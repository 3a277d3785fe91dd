"""Ray runtime: searchers as Ray actors, for users who outgrow one machine.

Topology (built in `start`):

    driver (trainer) ──ray.put once per version──▶ object store ──▶ SearcherActor 0..N-1 (any node)
          ▲                                                             │
          └──────────── step() results (groups + stats) ◀───────────────┘

Each actor keeps `pipeline_depth` step() calls queued, so it generates back to back while the trainer
trains (async) — no barrier: the newest weights ride along with the next call submitted after a
publish, and Ray fetches them once per node. In sync mode the loop submits one call per actor and waits.

`ray.address` joins an existing cluster (`ray start --head` …); otherwise a private Ray starts on
127.0.0.1 with the dashboard off and is shut down at the end. Every worker node must have `tba` installed
(same version) and see the model sources (hub names, or paths on a shared filesystem). Ray clusters have
no authentication: keep them on a private network.
"""

from __future__ import annotations

import time

import torch

from tba.config import RunConfig, to_dict
from tba.runtime.base import ModelSources, SearcherError, aggregate_stats, build_searcher
from tba.types import Group

try:
    import ray
except ImportError:  # the optional extra is missing
    ray = None


class _SearcherActor:
    def __init__(self, rank: int, cfg_dict: dict, sources: ModelSources, threads: int):
        self.searcher = build_searcher(rank, cfg_dict, sources, threads)
        self.rank, self.t_start, self.busy, self.sync_s = rank, time.perf_counter(), 0.0, 0.0

    def ready(self) -> dict:
        import socket

        return {"rank": self.rank, "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}

    def step(self, version: int | None = None, weights: dict | None = None):
        if weights is not None and version > self.searcher.version:
            t0 = time.perf_counter()
            self.searcher.load_weights(weights, version)
            self.sync_s += time.perf_counter() - t0
        groups = self.searcher.step()
        self.busy += self.searcher.last_step_s
        return groups, {"rank": self.rank, "version": self.searcher.version,
                        "samples": self.searcher.samples_generated, "busy": self.busy,
                        "alive_s": time.perf_counter() - self.t_start, "sync_s": self.sync_s}


class RayRuntime:
    pipeline_depth = 2

    def __init__(self, cfg: RunConfig, sources: ModelSources, initial_weights: dict[str, torch.Tensor],
                 threads_per_searcher: int):
        if ray is None:
            raise RuntimeError("runtime=ray needs Ray: pip install 'tba[ray]' (or pip install 'ray[default]')")
        self.cfg, self.sources, self.threads = cfg, sources, threads_per_searcher
        self.sync = cfg.mode == "sync"
        self.actors: list = []
        self._in_flight: dict = {}  # ObjectRef → actor index
        self._sent_version: list[int] = []
        self._latest: tuple[int, object] | None = None
        self._stats: dict[int, dict] = {}
        self._started_ray = False
        self._placement: list[dict] = []

    def start(self) -> None:
        if not ray.is_initialized():
            if self.cfg.ray.address:
                ray.init(address=self.cfg.ray.address, log_to_driver=True)
            else:
                ray.init(num_cpus=self.cfg.ray.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                         log_to_driver=True)
                self._started_ray = True
        s = self.cfg.search
        actor_cls = ray.remote(_SearcherActor).options(
            num_cpus=s.num_cpus, num_gpus=s.num_gpus, resources=s.resources or {}, max_restarts=0)
        cfg_dict = to_dict(self.cfg)
        self.actors = [actor_cls.remote(rank, cfg_dict, self.sources, self.threads) for rank in range(s.num_searchers)]
        self._sent_version = [0] * len(self.actors)
        self._placement = self._get([a.ready.remote() for a in self.actors], s.ready_timeout_s, "to start")
        if not self.sync:
            for i in range(len(self.actors)):
                for _ in range(self.pipeline_depth):
                    self._submit(i)

    def _get(self, refs, timeout: float, what: str, rank: int | None = None):
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise SearcherError(f"timed out after {timeout:.0f}s waiting for searchers {what}") from None
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
            who = "a searcher" if rank is None else f"searcher {rank}"
            raise SearcherError(f"{who} failed. Traceback (remote, from Ray):\n{e}") from None

    def _submit(self, i: int) -> None:
        args = ()
        if self._latest is not None and self._latest[0] > self._sent_version[i]:
            args = self._latest  # (version, ObjectRef): resolved by Ray on the actor's node, fetched once per node
            self._sent_version[i] = self._latest[0]
        self._in_flight[self.actors[i].step.remote(*args)] = i

    def _receive(self, ref) -> list[Group]:
        i = self._in_flight.pop(ref)
        groups, stats = self._get(ref, 60, "to return a finished batch", rank=i)
        self._stats[i] = stats
        return groups

    def collect(self, block: bool) -> list[Group]:
        groups: list[Group] = []
        if block and self.sync:
            for i in range(len(self.actors)):
                self._submit(i)
        pending = list(self._in_flight)
        if block:
            need = len(self.actors) if self.sync else 1
            ready, _ = ray.wait(pending, num_returns=need, timeout=self.cfg.search.collect_timeout_s)
            if len(ready) < need:
                raise SearcherError("timed out waiting for searchers to deliver samples")
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        for ref in ready:
            i = self._in_flight[ref]
            groups.extend(self._receive(ref))
            if not self.sync:
                self._submit(i)
        return groups

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        self._latest = (version, ray.put(weights))

    def stats(self) -> dict[str, float]:
        return aggregate_stats(list(self._stats.values()))

    def placement(self) -> list[dict]:
        return self._placement

    def stop(self) -> None:
        if ray is None or not ray.is_initialized():
            return
        for a in self.actors:
            ray.kill(a)
        self.actors, self._in_flight = [], {}
        if self._started_ray:
            ray.shutdown()
