"""Weight transports on a CUDA device (marker `gpu`, skipped without one): the `shared` transport over CUDA
IPC between two processes on one GPU — the child opens the handles by the GPU's UUID, receives CUDA tensors (no host
copy) and loads exact bf16 / fp32 values with their versions —, the same transport through host shared memory from
GPU weights (what searchers on other GPUs get), and the broadcast receiver's CUDA path (staging on the GPU, side
stream), driven over gloo since NCCL cannot put two ranks on one GPU. Imports neither Ray nor vLLM; seconds each."""

import time

import pytest
import torch
import torch.multiprocessing as mp

from tba.runtime.transport import WeightLayout, make_sender
from tba.runtime.transport.broadcast import BroadcastSender

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def weights_v(version: int, device="cuda") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    w = {"embed.weight": torch.randn(64, 32, generator=g).bfloat16(), "norm.weight": torch.randn(32, generator=g),
         "proj.weight": torch.randn(16, 32, generator=g).bfloat16(), "scale": torch.randn((), generator=g)}
    return {k: v.to(device) for k, v in w.items()}


class _Searcher:
    def __init__(self):
        self.version, self.loads = -1, []

    def load_weights(self, weights, version):
        self.loads.append((version, {k: (v.device.type, v.cpu().clone()) for k, v in weights.items()}))
        self.version = version


def _child(spec, results, commands):
    """Report where the shared buffers arrived (CUDA, not host) and what got loaded, initial then newest."""
    searcher, receiver = _Searcher(), spec.open(0, torch.device("cuda", 0), "127.0.0.1")
    try:
        buffers = [(b.device.type, b.dtype) for b in getattr(receiver, "buffers", [])]
        receiver.load_initial(searcher)
        results.put((buffers, searcher.loads[-1]))
        target, deadline = commands.get(timeout=60), time.monotonic() + 60
        while searcher.version < target and time.monotonic() < deadline:
            receiver.poll(searcher)
            time.sleep(0.01)
        results.put((buffers, searcher.loads[-1]))
        commands.get(timeout=60)  # alive until the parent has unpickled the results (shared-memory tensors)
    finally:
        receiver.close()


def _check(loaded, want):
    version, tensors = loaded
    assert version == want
    expected = weights_v(want, "cpu")
    assert list(tensors) == list(expected)
    for k, (device_type, t) in tensors.items():
        assert device_type == "cuda"  # the searcher's staging, on its GPU
        assert t.dtype == expected[k].dtype and torch.equal(t, expected[k]), k


def _run(sender):
    ctx = mp.get_context("spawn")
    results, commands = ctx.Queue(), ctx.Queue()
    sender.publish(weights_v(0), 0)
    p = ctx.Process(target=_child, args=(sender.spec(), results, commands), daemon=True)
    p.start()
    try:
        buffers, loaded = results.get(timeout=120)
        _check(loaded, 0)
        for v in (1, 2):
            sender.publish(weights_v(v), v)
        commands.put(2)
        _, loaded = results.get(timeout=60)
        _check(loaded, 2)
        return buffers
    finally:
        commands.put("stop")
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
        sender.close()


def test_layout_keeps_bf16_on_the_gpu():
    w = weights_v(3)
    layout = WeightLayout.of(w)
    buffers = layout.allocate("cuda")
    layout.pack(w, buffers)
    assert [b.dtype for b in buffers] == [torch.bfloat16, torch.float32] and all(b.is_cuda for b in buffers)
    for k, v in layout.views(buffers).items():
        assert v.is_cuda and v.dtype == w[k].dtype and torch.equal(v, w[k])


def test_shared_transport_over_cuda_ipc():
    sender = make_sender("shared", weights_v(0), num_searchers=1, timeout_s=60, ctx=mp.get_context("spawn"),
                         in_host=False)
    assert all(b.is_cuda for b in sender.buffers)
    buffers = _run(sender)
    assert buffers == [("cuda", torch.bfloat16), ("cuda", torch.float32)]  # CUDA IPC handles, no host copy


def test_shared_transport_through_host_memory_from_gpu_weights():
    sender = make_sender("shared", weights_v(0), num_searchers=1, timeout_s=60, ctx=mp.get_context("spawn"))
    assert not any(b.is_cuda for b in sender.buffers)
    buffers = _run(sender)
    assert buffers == [("cpu", torch.bfloat16), ("cpu", torch.float32)]  # host shared memory, staged onto the GPU


def test_broadcast_receiver_on_cuda_over_gloo():
    sender = BroadcastSender(WeightLayout.of(weights_v(0)), torch.device("cuda", 0), num_searchers=1,
                             host="127.0.0.1", timeout_s=60, backend="gloo")
    _run(sender)
