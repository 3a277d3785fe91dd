"""The `object_store` weight transport (Ray runtime): each version is `ray.put` once, as CPU tensors, and its
reference rides with the next call the driver makes to each actor; Ray resolves it on the actor's node, so
a node fetches a version once however many actors it hosts. No group, no listener, no extra thread: the
default on CPU, where the weights would be copied to the host anyway.

Like every transport it is a sender on the trainer's side and a receiver in the searcher (tba.runtime.
transport's protocols); what is particular is only that the receiver is handed the weights with the call
(`offer`) instead of fetching them, which is why the sender has `attach`: the arguments of the next call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def _cpu(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The object store pickles tensors: GPU ones must come to the host first (`ray.put` then copies them)."""
    return {k: v.detach().cpu() for k, v in weights.items()}


class ObjectStoreSender:
    kind = "object_store"

    def __init__(self, num_searchers: int):
        self.latest: tuple[int, object] | None = None  # (version, ObjectRef)
        self.sent = [0] * num_searchers  # the newest version each searcher holds: 0, the model sources', at start

    def spec(self) -> ObjectStoreSpec:
        return ObjectStoreSpec()

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        if all(held >= version for held in self.sent):
            return  # every searcher holds it already (the start's weights, version 0): nothing to put
        import ray

        self.latest = (version, ray.put(_cpu(weights)))  # the copy is made here: the trainer may step on

    def attach(self, rank: int) -> tuple:
        """(version, ObjectRef) for the next call to searcher `rank` if it has not been handed that version."""
        if self.latest is None or self.latest[0] <= self.sent[rank]:
            return ()
        self.sent[rank] = self.latest[0]
        return self.latest

    def rejoin(self, rank: int) -> None:
        self.sent[rank] = 0  # its replacement starts from the model sources and gets the newest with its first call

    def check(self) -> None:
        pass

    def close(self) -> None:
        self.latest = None


@dataclass
class ObjectStoreSpec:
    def open(self, searcher: int, device: torch.device, host: str | None = None) -> ObjectStoreReceiver:
        return ObjectStoreReceiver(torch.device(device))


class ObjectStoreReceiver:
    """Holds the weights the last call carried until the searcher loads them (on its own device)."""

    def __init__(self, device: torch.device):
        self.device, self.waiting = device, None

    def offer(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        self.waiting = (version, weights)

    def load_initial(self, searcher) -> None:
        self.poll(searcher)  # nothing before the first call: the searcher starts from its model sources

    def pending(self, searcher) -> bool:
        return self.waiting is not None and self.waiting[0] > searcher.version

    def poll(self, searcher) -> float:
        if self.waiting is None or self.waiting[0] <= searcher.version:
            return 0.0
        t0 = time.perf_counter()
        version, weights = self.waiting
        searcher.load_weights({k: v.to(self.device) for k, v in weights.items()}, version)
        self.waiting = None
        return time.perf_counter() - t0

    def close(self) -> None:
        self.waiting = None
