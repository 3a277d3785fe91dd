"""trainer/mfu's denominator: a GPU's peak from the table by the name torch reports, a CPU's measured and cached as
the best measured."""

import json

import pytest
import torch

import tba.run.peak as peak
from tba.run.peak import T, cpu_peak, device_peak, gpu_peak


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989), ("NVIDIA H100 80GB HBM3", "float32", 67),
    ("NVIDIA H100 PCIe", "bfloat16", 756), ("NVIDIA H100 NVL", "bfloat16", 835), ("NVIDIA H200", "bfloat16", 989),
    ("NVIDIA A100-SXM4-80GB", "bfloat16", 312), ("NVIDIA A100 80GB PCIe", "float32", 19.5),
    ("NVIDIA L40S", "bfloat16", 362), ("NVIDIA L40", "bfloat16", 181), ("NVIDIA L4", "float16", 121),
    ("Tesla T4", "float16", 65), ("NVIDIA GeForce RTX 4090", "bfloat16", 165.2)])
def test_the_table_by_the_name_torch_reports(name, dtype, tflops):
    assert gpu_peak(name, dtype).flops == pytest.approx(tflops * T)


@pytest.mark.parametrize("name, dtype", [("NVIDIA A10G", "bfloat16"), ("NVIDIA B200", "bfloat16"),
                                         ("Tesla T4", "bfloat16")])
def test_a_gpu_or_dtype_not_in_the_table_has_no_peak(name, dtype):
    assert gpu_peak(name, dtype) is None


def test_a_cuda_device_is_looked_up_by_its_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert device_peak(torch.device("cuda", 0), "bfloat16").flops == 989 * T
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10G")
    assert device_peak(torch.device("cuda", 0), "bfloat16") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")  # TF32 allowed: no float32 peak
    assert device_peak(torch.device("cuda", 0), "float32") is None


def test_the_cpu_rate_is_cached_as_the_best_measured(tmp_path, monkeypatch):
    cache = tmp_path / "gemm_peak.json"
    first = cpu_peak("float32", cache=cache)
    assert first.flops > 1e8  # any CPU this runs on does 0.1 GFLOP/s
    (key,) = json.loads(cache.read_text())
    assert "float32" in key and f"{torch.get_num_threads()} threads" in key
    monkeypatch.setattr(peak, "measure_gemm", lambda dtype: first.flops / 2)  # a busy machine measures low
    assert cpu_peak("float32", cache=cache).flops == first.flops
    assert json.loads(cache.read_text())[key] == first.flops
    monkeypatch.setattr(peak, "measure_gemm", lambda dtype: first.flops * 2)  # a quiet one: the peak rises
    assert cpu_peak("float32", cache=cache).flops == first.flops * 2 == json.loads(cache.read_text())[key]
    assert len(json.loads(cache.read_text())) == 1
    cpu_peak("bfloat16", cache=cache)  # each dtype its own
    assert len(json.loads(cache.read_text())) == 2


def test_the_measurement_takes_under_a_second():
    import time

    t0 = time.perf_counter()
    assert peak.measure_gemm(torch.float32) > 0
    assert time.perf_counter() - t0 < 1.0
