"""bench/perf/gpu_smoke.py end to end: the real loop, local runtime, trainer + one searcher on one device.

On CPU (CI) with a tiny model, for each sampler backend that imports; on a CUDA machine (marker `gpu`) the
same code path on the GPU, where the weights travel over CUDA IPC. Nothing here asserts a speed."""

import importlib.util
import json

import pytest
import torch


def _rows(results):
    return json.loads(results.read_text().split("```json\n", 1)[1].split("\n```", 1)[0])


def _smoke(tmp_path, run_bench, device, backends):
    results = tmp_path / "gpu_smoke.md"
    run_bench("bench.perf.gpu_smoke", ["--smoke", "--device", device, "--backends", *backends,
                                       "--out", str(tmp_path / "out"), "--results", str(results)])
    rows = _rows(results)
    assert [r["backend"] for r in rows] == backends
    for r in rows:
        assert r["steps"] == 3 and r["samples_received"] > 0
        assert r["publish_s_median"] >= 0 and r["searcher_tokens"] > 0
    return rows


@pytest.mark.slow
def test_gpu_smoke_code_path_on_cpu(tmp_path, run_bench):
    backends = ["hf"] + (["vllm"] if importlib.util.find_spec("vllm") else [])
    _smoke(tmp_path, run_bench, "cpu", backends)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_smoke_on_one_gpu(tmp_path, run_bench):
    backends = ["hf"] + (["vllm"] if importlib.util.find_spec("vllm") else [])
    (row, *_) = _smoke(tmp_path, run_bench, "cuda", backends)
    assert row["max_memory_gb"] > 0
