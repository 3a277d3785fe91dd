"""The object_store transport as a sender/receiver pair (no Ray needed for its logic; the Ray runtime tests in
test_runtimes.py and test_restarts.py run it for real): each searcher is handed a version once, a replacement
gets the newest again, and a receiver loads only what is newer than its searcher's weights."""

import torch

from tba.runtime.transport import make_sender
from tba.runtime.transport.object_store import ObjectStoreReceiver, ObjectStoreSender


class _Searcher:
    def __init__(self, version):
        self.version, self.loaded = version, []

    def load_weights(self, weights, version):
        self.loaded.append((version, {k: v.clone() for k, v in weights.items()}))
        self.version = version


def test_make_sender_builds_it_like_the_other_transports():
    sender = make_sender("object_store", {"w": torch.zeros(2)}, num_searchers=2, timeout_s=1)
    assert isinstance(sender, ObjectStoreSender) and sender.kind == "object_store"
    assert isinstance(sender.spec().open(0, torch.device("cpu")), ObjectStoreReceiver)


def test_each_searcher_is_handed_each_version_once_and_a_replacement_the_newest():
    sender = ObjectStoreSender(num_searchers=2)
    assert sender.attach(0) == ()  # nothing published yet
    sender.latest = (3, "ref-3")  # what publish stores: (version, ObjectRef)
    assert sender.attach(0) == (3, "ref-3") and sender.attach(0) == ()
    assert sender.attach(1) == (3, "ref-3")
    sender.rejoin(0)
    assert sender.attach(0) == (3, "ref-3") and sender.attach(1) == ()


def test_the_receiver_loads_only_newer_weights_on_its_device():
    receiver, searcher = ObjectStoreReceiver(torch.device("cpu")), _Searcher(version=1)
    receiver.load_initial(searcher)
    assert searcher.loaded == []  # nothing carried yet: the searcher keeps its start
    receiver.offer(2, {"w": torch.ones(3)})
    assert receiver.poll(searcher) > 0 and searcher.version == 2
    assert torch.equal(searcher.loaded[0][1]["w"], torch.ones(3))
    assert receiver.poll(searcher) == 0.0  # consumed
    receiver.offer(2, {"w": torch.zeros(3)})  # the start weights re-sent at the same version: not reloaded
    assert receiver.poll(searcher) == 0.0 and len(searcher.loaded) == 1


def test_a_version_every_searcher_already_holds_is_not_put(monkeypatch):
    """Searchers start from the model sources (version 0): a fresh run's start weights are never copied into
    the object store, and a resume's are (its searchers still hold version 0)."""
    import sys
    from types import SimpleNamespace

    put = []
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(put=lambda w: put.append(w) or "ref"))
    sender = ObjectStoreSender(num_searchers=2)
    sender.publish({"w": torch.zeros(2)}, 0)
    assert put == [] and sender.attach(0) == ()
    sender.publish({"w": torch.ones(2)}, 5)
    assert len(put) == 1 and sender.attach(0) == (5, "ref") and sender.attach(1) == (5, "ref")
