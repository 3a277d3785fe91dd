"""The CUDA-only choices a sharded trainer makes, run here with CUDA mocked where that is honest: which device each
rank takes and sets before its first collective, the `device_id` its process group is bound to, and that nothing
device-resident crosses the merge of an update's metrics (a CUDA tensor would be unpickled on its own GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tba.algorithm.trainer import _Tally
from tba.config import load_config
from tba.ranks import fsdp
from tba.ranks.rank import RankTrainer
from tba.run.sharded import rank_devices


@pytest.mark.parametrize(("devices", "expected"), [
    ("cuda:4,cuda:5", ["cuda:4", "cuda:5"]),
    ("cuda", ["cuda:0", "cuda:1"]),
    ("cuda,cuda", ["cuda:0", "cuda:1"]),
    ("cpu", ["cpu", "cpu"]),
])
def test_each_rank_has_one_explicit_device(devices, expected):
    cfg = load_config(None, ["trainer.world_size=2", "trainer.prompts_per_step=2", f"trainer.fsdp.devices={devices}"])
    assert [str(d) for d in rank_devices(cfg)] == expected


def test_a_cuda_rank_sets_its_device_then_binds_its_process_group_to_it(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", torch.device(d))))
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: calls.append(("store", a[0], a[1])) or "store")
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **k: calls.append(("init", backend, k["device_id"], k["rank"])))
    fsdp.join(1, 2, "tcp://10.0.0.7:29500", 60.0, torch.device("cuda", 5))
    assert calls == [("set_device", torch.device("cuda", 5)), ("store", "10.0.0.7", 29500),
                     ("init", "nccl", torch.device("cuda", 5), 1)]


def test_a_cpu_rank_joins_gloo_without_a_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append("set_device"))
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: "store")
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **k: calls.append((backend, k["device_id"])))
    fsdp.join(0, 2, "tcp://127.0.0.1:29500", 60.0, torch.device("cpu"))
    assert calls == [("gloo", None)]


def test_nothing_device_resident_crosses_the_merge_of_an_update(monkeypatch):
    """The tally's tensors stand for CUDA ones (meta tensors, whose `.cpu()` is mocked to give the host copy that
    .cpu() gives a CUDA tensor): the gathered object must hold host values only."""
    moved = []

    def to_host(t):
        moved.append(t.device.type)
        return torch.zeros(t.shape)

    monkeypatch.setattr(torch.Tensor, "cpu", to_host)
    seen = []

    def gather(out, obj):
        seen.append(obj)
        out[:] = [obj] * len(out)

    monkeypatch.setattr(dist, "all_gather_object", gather)
    tally = _Tally(samples=4, loss=1.0, tokens=8, log_zs=[torch.empty(2, device="meta")],
                   residuals=[torch.empty(4, device="meta")])
    rank = RankTrainer.__new__(RankTrainer)
    rank.world = 2
    merged = rank.merged(tally)

    def tensors(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, list | tuple):
            for y in x:
                yield from tensors(y)

    assert moved == ["meta", "meta"]
    assert all(t.device.type == "cpu" for t in tensors(seen[0]))
    assert merged.loss == 2.0 and merged.tokens == 16 and len(merged.residuals) == 2
