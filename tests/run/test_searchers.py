"""The searchers' specs (tba.run.searchers): a vLLM engine on a GPU whose search.vllm.gpu_memory_utilization is null
starts with the share of its GPU the plan leaves it (the same number `tba plan` prints), searcher by searcher; a set
share, and a CPU engine, are left as they are."""

import pytest

import tba.run.plan.machine
import tba.run.searchers
from tba.config import load_config
from tba.run.plan import make_plan
from tba.run.searchers import sampler_spec, searcher_specs
from tba.runtime.searcher_spec import ModelSources

VLLM = ["model.tiny.hidden_size=16", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=32", "model.tiny.vocab_size=20", "task.max_prompt_tokens=8",
        "search.max_new_tokens=4", "runtime=local", "model.device=cuda:0", "search.backend=vllm",
        "search.num_searchers=2", "search.device=cuda:1,cuda:2"]


@pytest.fixture
def gpus(monkeypatch):
    """Three GPUs of 8 GB as this machine's (the run reads its own devices)."""
    monkeypatch.setattr(tba.run.plan.machine, "machine_capacity",
                        lambda device: 8 * 10**9 if device.startswith("cuda") else 64 * 2**30)


def config(utilization, *more):
    cfg = load_config(None, [*VLLM, *more], check_installed=False)
    cfg.search.vllm.gpu_memory_utilization = utilization  # null: the default once search.vllm's schema has it
    return cfg


def test_a_null_share_is_set_from_the_plan_for_each_searcher(gpus):
    cfg = config(None, "search.device=cuda:1,cuda:0")  # searcher 1 shares the trainer's GPU: a smaller share
    shares = make_plan(cfg).vllm_shares
    assert shares[1] < shares[0]
    assert [sampler_spec(cfg, rank=r).vllm.gpu_memory_utilization for r in (0, 1)] == [shares[0], shares[1]]
    specs = searcher_specs(cfg, ModelSources("builtin", "builtin", "builtin"), limit=10)
    assert [s.sampler.vllm.gpu_memory_utilization for s in specs] == [shares[0], shares[1]]
    assert sampler_spec(cfg, rank=1, shares={1: 0.42}).vllm.gpu_memory_utilization == 0.42


def test_a_set_share_and_a_cpu_engine_are_left_alone(gpus, monkeypatch):
    def no_plan(*args, **kwargs):
        raise AssertionError("a plan was made")

    with monkeypatch.context() as m:
        m.setattr(tba.run.searchers, "vllm_shares", no_plan)
        assert sampler_spec(config(0.3), rank=0).vllm.gpu_memory_utilization == 0.3
    cpu = config(None, "model.device=cpu", "search.device=cpu")
    assert sampler_spec(cpu, rank=0).vllm.gpu_memory_utilization is None  # a CPU engine sizes its KV cache itself
