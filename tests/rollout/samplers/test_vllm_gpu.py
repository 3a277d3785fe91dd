"""The vLLM sampler on a GPU (marker `gpu`; skipped without a GPU and vLLM's CUDA build): the engine with its GPU
defaults — CUDA graphs (search.vllm.enforce_eager null) and 0.9 × the free memory (gpu_memory_utilization null) —
samples with the HF recomputation's log-probs, reloads published weights in place (the graphs then replay the new
weights) and takes a reload between two decode steps of a continuous batch. Written for a lent GPU; not run here."""

import copy
import importlib.util

import pytest
import torch
from test_vllm import T, _cfg, _gap, _prompts, tiny_dir  # noqa: F401 (tiny_dir: a fixture)

from tba.models import load_model
from tba.run.searchers import sampler_spec
from tba.runtime.worker import build_sampler


def _vllm_on_cuda() -> bool:
    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        return False
    from vllm.platforms import current_platform

    return current_platform.device_type == "cuda"


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _vllm_on_cuda(), reason="needs a GPU and vLLM's CUDA build")]


def test_a_cuda_graph_engine_samples_reloads_and_reloads_in_flight(tiny_dir, tiny_tokenizer):  # noqa: F811
    cfg = _cfg("float32")
    spec = sampler_spec(cfg)
    assert spec.vllm.enforce_eager is None and spec.vllm.gpu_memory_utilization is None  # the GPU defaults
    sampler = build_sampler(spec, source=str(tiny_dir), tokenizer=tiny_tokenizer, device=torch.device("cuda", 0),
                            seed=0)
    try:
        model = load_model(str(tiny_dir), "float32").eval()
        before = _gap(sampler, model, _prompts(4, 6), label="cuda fp32")
        newer = copy.deepcopy(model)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in newer.parameters():
                p.add_(torch.randn_like(p) * p.std())
        sampler.load_weights({k: v.cuda() for k, v in newer.state_dict().items()}, 1)
        after = _gap(sampler, newer, _prompts(4, 6), label="cuda fp32 after reload")
        assert before["mean"] < 1e-3 and after["mean"] < 1e-3 and after["outside"] < 0.01
        stream = sampler.stream(4, temperature=T, top_p=1.0)
        for i in range(3):
            stream.submit(i, [1, 5 + i, 7, 9], 2, 24)
        done = stream.step(1) + stream.step(1)
        sampler.load_weights({k: v.cuda() for k, v in model.state_dict().items()}, 2)
        while not stream.idle:
            done += stream.step(2)
        assert len(done) == 6 and any(f.versions[0] == 1 and f.versions[-1] == 2 for f in done)
    finally:
        sampler.close()
