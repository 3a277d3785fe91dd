"""Weight transports on CPU: the layout, `shared` (shared memory) and `broadcast` (gloo) across spawned
processes — exact tensors, versions, latest wins, publish never waits for a busy searcher, a killed member
is replaced — and whole local runs with the broadcast transport (also after kill -9 of a searcher)."""

import os
import pickle
import signal
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp

from tba.runtime.transport import WeightLayout, choose_transport, in_host_memory, make_sender
from tba.runtime.transport.broadcast import BroadcastSender
from tba.runtime.worker import SearcherError


def weights_v(version: int, device="cpu") -> dict[str, torch.Tensor]:
    """Mixed dtypes (fp32 and bf16, a scalar among them), distinct values per version."""
    g = torch.Generator().manual_seed(version)
    w = {"embed.weight": torch.randn(7, 5, generator=g), "norm.weight": torch.randn(5, generator=g).bfloat16(),
         "scale": torch.randn((), generator=g), "proj.weight": torch.randn(3, 5, generator=g).bfloat16()}
    return {k: v.to(device) for k, v in w.items()}


def assert_exact(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
        assert torch.equal(got[k].cpu(), want[k].cpu()), k


class FakeSearcher:
    """What a receiver needs of a searcher: `version` and `load_weights`; records every load."""

    def __init__(self):
        self.version, self.loads = -1, []

    def load_weights(self, weights, version):
        self.loads.append((version, {k: v.detach().cpu().clone() for k, v in weights.items()}))
        self.version = version


def _receiver_main(spec, index, device, commands, results):
    """A searcher stand-in: load the initial weights, then obey commands (busy = not polling, like a searcher
    mid-generation; poll = batch boundaries until `target` is loaded)."""
    searcher, receiver = FakeSearcher(), spec.open(index, torch.device(device), "127.0.0.1")
    try:
        receiver.load_initial(searcher)
        buffers = getattr(spec, "buffers", [])
        results.put((index, "initial", searcher.loads[-1], [str(b.device) for b in buffers]))
        while True:
            cmd, arg = commands.get(timeout=120)
            if cmd == "stop":
                return
            if cmd == "busy":
                time.sleep(arg)
                results.put((index, "idle", time.time(), None))
            if cmd == "poll":
                first, deadline = len(searcher.loads), time.monotonic() + 60
                while searcher.version < arg and time.monotonic() < deadline:
                    receiver.poll(searcher)
                    time.sleep(0.01)
                results.put((index, "loaded", searcher.loads[-1], [v for v, _ in searcher.loads[first:]]))
    finally:
        receiver.close()


def _spawn(ctx, spec, index, device="cpu"):
    commands, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_receiver_main, args=(spec, index, device, commands, results), daemon=True)
    p.start()
    return p, commands, results


def _get(results, timeout=90):
    return results.get(timeout=timeout)


def _stop(procs):
    for p, commands, _ in procs:
        if p.is_alive():
            commands.put(("stop", None))
    for p, _, _ in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()


def test_layout_round_trips_mixed_dtypes_without_upcasting():
    w = weights_v(0)
    layout = pickle.loads(pickle.dumps(WeightLayout.of(w)))
    assert layout.dtypes == (torch.float32, torch.bfloat16) and layout.sizes == (7 * 5 + 1, 5 + 3 * 5)
    assert layout.nbytes == 36 * 4 + 20 * 2
    buffers = layout.allocate("cpu")
    layout.pack(w, buffers)
    assert_exact(layout.views(buffers), w)
    tied = {**w, "lm_head.weight": w["embed.weight"]}  # one tensor under two names: placed once
    tied_layout = WeightLayout.of(tied)
    assert tied_layout.sizes == layout.sizes
    tied_layout.pack(tied, buffers)
    assert_exact(tied_layout.views(buffers), tied)
    with pytest.raises(ValueError, match="missing"):
        layout.pack({k: v for k, v in w.items() if k != "scale"}, buffers)
    with pytest.raises(ValueError, match="layout has"):
        layout.pack({**w, "scale": w["scale"].double()}, buffers)


def test_auto_transport_choice():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert choose_transport("auto", "local", cpu) == choose_transport("auto", "local", gpu) == "shared"
    assert choose_transport("auto", "local", gpu, vllm_engines=True) == "vllm"  # engines on GPUs of their own
    assert choose_transport("auto", "local", cpu, vllm_engines=True) == "shared"
    assert choose_transport("auto", "ray", cpu) == "object_store"
    assert choose_transport("auto", "ray", gpu) == "broadcast"
    assert choose_transport("broadcast", "local", cpu) == "broadcast"


def test_shared_buffers_are_in_host_memory_unless_every_searcher_is_on_the_trainers_gpu():
    gpu0 = torch.device("cuda", 0)
    assert not in_host_memory(gpu0, [[0], [0]])  # CUDA IPC: every searcher can see the trainer's GPU
    assert in_host_memory(gpu0, [[0], [1]]) and in_host_memory(gpu0, [[1, 2]]) and in_host_memory(gpu0, [[]])
    assert in_host_memory(torch.device("cpu"), [[0]])


def test_a_cuda_buffer_opens_on_this_processs_index_of_the_same_gpu(monkeypatch):
    """CUDA mocked: the trainer's buffer is on its cuda:3 (UUID GPU-d); a searcher started with CUDA_VISIBLE_DEVICES=3
    sees that GPU as its cuda:0, so the handle is rebuilt on index 0 — and one that cannot see it is told so."""
    import torch.multiprocessing.reductions as reductions

    from tba.runtime.transport import CudaBuffer

    class Props:
        def __init__(self, uuid):
            self.uuid = uuid

    rebuilt = []
    monkeypatch.setattr(reductions, "rebuild_cuda_tensor", lambda *args: rebuilt.append(args) or "tensor")
    handle = CudaBuffer("GPU-d", ("cls", (4,), (1,), 0, "storage", torch.float32, 3, b"handle"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props(["GPU-d"][i]))
    assert handle.open() == "tensor" and rebuilt[0][6] == 0 and rebuilt[0][7] == b"handle"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props(["GPU-b"][i]))
    with pytest.raises(SearcherError, match="cannot see"):
        handle.open()


def test_shared_transport_delivers_exact_tensors_and_the_latest_version():
    ctx = mp.get_context("spawn")
    sender = make_sender("shared", weights_v(0), num_searchers=1, timeout_s=60, ctx=ctx)
    sender.publish(weights_v(0), 0)
    proc = _spawn(ctx, sender.spec(), 0)
    try:
        _, _, (version, got), _ = _get(proc[2])
        assert version == 0
        assert_exact(got, weights_v(0))
        for v in (1, 2, 3):
            sender.publish(weights_v(v), v)
        proc[1].put(("poll", 3))
        _, _, (version, got), versions = _get(proc[2])
        assert version == 3 and versions == [3]  # the newest only: 1 and 2 were overwritten unseen
        assert_exact(got, weights_v(3))
    finally:
        _stop([proc])
        sender.close()


def test_broadcast_never_waits_for_a_busy_searcher_latest_wins_and_survives_a_killed_member():
    ctx = mp.get_context("spawn")
    sender = BroadcastSender(WeightLayout.of(weights_v(0)), torch.device("cpu"), num_searchers=2, host="127.0.0.1",
                             timeout_s=120, op_s=10)
    sender.publish(weights_v(0), 0)
    procs = [_spawn(ctx, sender.spec(), i) for i in (0, 1)]
    try:
        for p in procs:
            _, _, (version, got), _ = _get(p[2])
            assert version == 0
            assert_exact(got, weights_v(0))
        # async: searcher 1 "generates" for 4 s (its loop does not poll); publishing goes on regardless
        procs[0][1].put(("busy", 4.0))
        time.sleep(0.5)
        t0 = time.time()
        for v in (1, 2, 3):
            sender.publish(weights_v(v), v)
        published = time.time()
        assert published - t0 < 3.0
        assert _get(procs[0][2])[2] > published  # all three publishes returned while it was busy
        time.sleep(0.5)
        for p in procs:
            p[1].put(("poll", 3))
            _, _, (version, got), versions = _get(p[2])
            assert version == 3 and versions[-1] == 3 and len(versions) < 3  # staging held the newest only
            assert_exact(got, weights_v(3))

        # kill -9 searcher 1: the next broadcast fails inside publish (no raise, no hang past op_s); the
        # runtime's restart calls rejoin(), the replacement and the survivor form a new group with the trainer
        os.kill(procs[0][0].pid, signal.SIGKILL)
        procs[0][0].join(timeout=10)
        sender.publish(weights_v(4), 4)
        sender.check()
        sender.rejoin()
        procs[0] = _spawn(ctx, sender.spec(), 0)
        _, _, (version, got), _ = _get(procs[0][2])  # the new group's catch-up: the newest weights
        assert version == 4
        assert_exact(got, weights_v(4))
        sender.publish(weights_v(5), 5)
        for p in procs:
            p[1].put(("poll", 5))
            _, _, (version, got), _ = _get(p[2])
            assert version == 5
            assert_exact(got, weights_v(5))
        sender.check()
    finally:
        _stop(procs)
        sender.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("tba-weights")]


def test_broadcast_group_that_cannot_form_raises_searcher_error():
    sender = make_sender("broadcast", weights_v(0), num_searchers=1, timeout_s=0.5)
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(SearcherError, match="0 of 1 searchers joined"):  # nobody ever joins
            while time.monotonic() < deadline:
                sender.check()
                time.sleep(0.1)
    finally:
        sender.close()
