"""Which GPUs each searcher process sees under runtime=local (tba.runtime.visibility) and what the local runtime makes
of a placement: each child's CUDA_VISIBLE_DEVICES and its device inside, the transport and where `shared` keeps its
buffers, the placement rules of NCCL's transports. CUDA is mocked where a CPU cannot have it — the trainer's tensors
are stand-ins that only say their device, and the child processes are stand-ins that record what a spawned child
would start with (its environment at `start`, its arguments); nothing here touches a GPU."""

import os
from types import SimpleNamespace

import pytest
import torch
from paths import TINY

from tba.config import load_config
from tba.run.searchers import searcher_placements, searcher_specs
from tba.runtime.local import LocalRuntime
from tba.runtime.searcher_spec import ModelSources
from tba.runtime.visibility import check_distinct_gpus, child_devices, searcher_gpus
from tba.runtime.worker import RuntimeParts, SearcherError

CUDA0 = torch.device("cuda", 0)


def test_a_gpu_searcher_sees_only_its_gpus_named_through_the_trainers_own_visibility():
    assert child_devices("cpu", None) == ({}, "cpu")
    assert child_devices("cuda:3", None) == ({"CUDA_VISIBLE_DEVICES": "3"}, "cuda:0")
    assert child_devices("cuda:3", "4,5,6,7") == ({"CUDA_VISIBLE_DEVICES": "7"}, "cuda:0")  # the trainer's cuda:3
    assert child_devices("cuda:2+cuda:3", "GPU-a,GPU-b,GPU-c,GPU-d") == (
        {"CUDA_VISIBLE_DEVICES": "GPU-c,GPU-d"}, "cuda:0")  # a tensor-parallel engine: its cuda:0 and cuda:1
    with pytest.raises(SearcherError, match="sees 2 GPU"):
        child_devices("cuda:4", "0,1")


def test_a_bare_cuda_is_the_trainers_current_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert searcher_gpus("cuda") == searcher_gpus("auto") == [2] and searcher_gpus("cpu") == []


def test_nccl_transports_need_the_trainer_and_every_member_on_gpus_of_their_own():
    check_distinct_gpus([[1], [2, 3]], CUDA0)
    check_distinct_gpus([[1], [0]], CUDA0, members=[1, 0])  # searcher 1 does not join: it may share cuda:0
    for gpus, why in (([[0]], "which the trainer uses"), ([[1], [1]], "which searcher 0 uses"),
                      ([[1, 2], [2]], "cuda:2, which searcher 0"), ([[]], "on the CPU")):
        with pytest.raises(SearcherError, match=why):
            check_distinct_gpus(gpus, CUDA0)


def test_a_tensor_parallel_searcher_takes_consecutive_devices():
    cfg = load_config(TINY, ["sft.enabled=false", "runtime=local", "search.backend=vllm", "search.num_searchers=2",
                             "search.vllm.tensor_parallel_size=2", "search.device=cuda:1,cuda:2,cuda:3,cuda:4"])
    assert [p.device for p in searcher_placements(cfg)] == ["cuda:1+cuda:2", "cuda:3+cuda:4"]
    cfg.search.backend = "hf"  # tensor parallelism is vLLM's: an hf searcher takes one item, as before
    assert [p.device for p in searcher_placements(cfg)] == ["cuda:1", "cuda:2"]


class FakeProcess:
    """Records what a spawned child would start with: this process's environment at `start`, and its arguments."""

    started: list = []

    def __init__(self, target, name, daemon, args):
        self.args, self.pid = args, os.getpid()

    def start(self):
        FakeProcess.started.append((os.environ.get("CUDA_VISIBLE_DEVICES"), self.args[0]))


def _runtime(*overrides, trainer="cuda:0"):
    cfg = load_config(TINY, ["sft.enabled=false", "runtime=local", *overrides])
    specs = searcher_specs(cfg, ModelSources("start", "ref", "tok"), limit=100)
    weights = {"w": SimpleNamespace(device=torch.device(trainer))}  # all the runtime's choices look at
    return LocalRuntime(RuntimeParts(specs, weights, 0, None, False, cfg.search.weight_transport, cfg.supervision,
                                     cfg.ray))


def _children(runtime, monkeypatch) -> list:
    """Each searcher's start, as `launch` would do it (spawn), without a process."""
    monkeypatch.setattr(FakeProcess, "started", [])
    monkeypatch.setattr(os, "environ", {**os.environ, "CUDA_VISIBLE_DEVICES": "4,5,6,7,8"})
    runtime.start_method, runtime._ctx = "spawn", SimpleNamespace(Process=FakeProcess)
    runtime.transport = SimpleNamespace(spec=lambda: "weights")
    runtime.queue = runtime.stop_event = runtime.go = None
    runtime.requests = [None] * runtime.n
    for rank in range(runtime.n):
        runtime._spawn(rank)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7,8"  # put back after each start
    return FakeProcess.started


def test_each_searcher_process_sees_only_its_gpus_and_calls_them_cuda_0(monkeypatch):
    """vLLM engines (one of two GPUs each) on GPUs of their own beside the trainer's: every child sees its own GPUs
    (named through the trainer's CUDA_VISIBLE_DEVICES) as cuda:0.., and the weights go by vLLM's NCCL transfer."""
    runtime = _runtime("search.backend=vllm", "search.vllm.tensor_parallel_size=2", "search.num_searchers=2",
                       "search.device=cuda:1,cuda:2,cuda:3,cuda:4")
    assert runtime.transport_kind == "vllm" and runtime.members == [2, 2]
    assert [s.sampler.weight_transfer for s in runtime.specs] == ["nccl", "nccl"]
    started = _children(runtime, monkeypatch)
    assert [(visible, args.spec.device, args.env["CUDA_VISIBLE_DEVICES"]) for visible, args in started] == [
        ("5,6", "cuda:0", "5,6"), ("7,8", "cuda:0", "7,8")]  # args.env: what a forked child takes instead
    assert [s.device for s in runtime.specs] == ["cuda:1+cuda:2", "cuda:3+cuda:4"]  # the trainer's numbering


def test_hf_searchers_on_other_gpus_get_host_memory_and_on_the_trainers_gpu_cuda_ipc(monkeypatch):
    apart = _runtime("search.num_searchers=2", "search.device=cuda:1,cuda:2")
    assert (apart.transport_kind, apart.in_host) == ("shared", True)
    assert [(visible, args.spec.device) for visible, args in _children(apart, monkeypatch)] == [
        ("5", "cuda:0"), ("6", "cuda:0")]
    beside = _runtime("search.num_searchers=2", "search.device=cuda:0")
    assert (beside.transport_kind, beside.in_host) == ("shared", False)
    on_cpu = _runtime("search.device=cpu")
    assert on_cpu.in_host and _children(on_cpu, monkeypatch)[0][0] == "4,5,6,7,8"  # a CPU searcher: unchanged


def test_a_vllm_engine_on_the_trainers_gpu_is_fed_by_cuda_ipc_and_tensor_parallelism_needs_vllms_transfer():
    beside = _runtime("search.backend=vllm", "search.device=cuda:0")
    assert (beside.transport_kind, beside.in_host) == ("shared", False)
    with pytest.raises(SearcherError, match="weight_transport=vllm"):
        _runtime("search.backend=vllm", "search.vllm.tensor_parallel_size=2", "search.device=cuda:0,cuda:1")
    with pytest.raises(SearcherError, match="not vLLM engines"):
        _runtime("search.weight_transport=vllm", "search.num_searchers=2", "search.device=cuda:1,cuda:2",
                 "search.groups=[{name: policy, backend: vllm}, {name: other, backend: hf}]")
    with pytest.raises(SearcherError, match="GPUs of its own"):
        _runtime("search.weight_transport=broadcast", "search.num_searchers=2", "search.device=cuda:1")
