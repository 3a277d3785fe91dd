"""A device's peak FLOP/s, the denominator of `trainer/mfu`: a GPU's from NVIDIA's datasheets (the table below), a
CPU's measured — the best of a few torch.matmul calls at startup (about 0.3 s), in the trainer's dtype and thread count,
kept per machine in $TBA_CACHE/gemm_peak.json (~/.cache/tba) as the best ever measured there, so that a measurement
taken while other work loaded the machine does not stand (it would inflate the mfu of every later run).

GPU rates are dense (no structured sparsity: the datasheets' "with sparsity" halved); float32 is the non-tensor-core
rate that torch uses by default (its float32 matmul precision "highest"; a run that allows TF32 gets no mfu).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tba.models.sources import cache_dir

logger = logging.getLogger(__name__)

T = 1e12
_DS = "NVIDIA's datasheet"
GPU_PEAKS: list[tuple[str, str, dict[str, float], str]] = [
    # name, pattern of torch.cuda.get_device_name, dense FLOP/s per dtype, source
    ("H100 NVL", r"H100.*NVL", {"bfloat16": 835 * T, "float16": 835 * T, "float32": 60 * T}, _DS),
    ("H100 PCIe", r"H100.*PCIE", {"bfloat16": 756 * T, "float16": 756 * T, "float32": 51 * T}, _DS),
    ("H100 SXM", r"\bH100\b", {"bfloat16": 989 * T, "float16": 989 * T, "float32": 67 * T}, _DS),
    ("H200 NVL", r"\bH200\b.*NVL", {"bfloat16": 835 * T, "float16": 835 * T, "float32": 60 * T}, _DS),
    ("H200 SXM", r"\bH200\b", {"bfloat16": 989 * T, "float16": 989 * T, "float32": 67 * T}, _DS),
    ("GH200", r"\bGH200\b", {"bfloat16": 989 * T, "float16": 989 * T, "float32": 67 * T}, _DS),
    ("A100", r"\bA100\b", {"bfloat16": 312 * T, "float16": 312 * T, "float32": 19.5 * T}, _DS),
    ("L40S", r"\bL40S\b", {"bfloat16": 362 * T, "float16": 362 * T, "float32": 91.6 * T}, _DS),
    ("L40", r"\bL40\b", {"bfloat16": 181 * T, "float16": 181 * T, "float32": 90.5 * T}, _DS),
    ("A40", r"\bA40\b", {"bfloat16": 149.7 * T, "float16": 149.7 * T, "float32": 37.4 * T}, _DS),
    ("L4", r"\bL4\b", {"bfloat16": 121 * T, "float16": 121 * T, "float32": 30.3 * T}, _DS),
    ("A10", r"\bA10\b", {"bfloat16": 125 * T, "float16": 125 * T, "float32": 31.2 * T}, _DS),
    ("T4", r"\bT4\b", {"float16": 65 * T, "float32": 8.1 * T}, f"{_DS} (no bfloat16 tensor cores)"),
    ("RTX 4090", r"RTX 4090", {"bfloat16": 165.2 * T, "float16": 165.2 * T, "float32": 82.6 * T},
     "NVIDIA's Ada whitepaper (tensor FLOPs with float32 accumulate)"),
    ("RTX 3090", r"RTX 3090", {"bfloat16": 71 * T, "float16": 71 * T, "float32": 35.6 * T},
     "NVIDIA's Ampere GA102 whitepaper (tensor FLOPs with float32 accumulate)"),
    ("RTX 6000 Ada", r"RTX 6000 Ada", {"bfloat16": 364.2 * T, "float16": 364.2 * T, "float32": 91.1 * T}, _DS),
]
"""The first pattern that matches the device's name (case aside) wins: more specific names first (H100 NVL before
H100). An A10G, a B200 or any GPU not here has no peak: no mfu, said once."""


@dataclass(frozen=True)
class Peak:
    flops: float
    """FLOP/s of one device in the dtype asked."""
    what: str
    """Where the number comes from, for the log."""


def gpu_peak(name: str, dtype: str) -> Peak | None:
    """The table's peak for a GPU named `name` (as torch.cuda.get_device_name gives it) in `dtype`; None if unknown."""
    for label, pattern, rates, source in GPU_PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            rate = rates.get(dtype)
            return Peak(rate, f"{label} {dtype} {rate / T:g} TFLOP/s ({source})") if rate else None
    return None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), for the cache key."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_gemm(dtype: torch.dtype, n: int = 1024, budget_s: float = 0.3) -> float:
    """The best FLOP/s of square matmuls in `dtype` on this CPU at torch's current thread count, over about
    `budget_s` seconds (at least 3 calls). The size grows from 256 to `n` while a call takes under 10 ms: a slow
    dtype (float16 without native support runs at a few GFLOP/s) is measured small and stays well under a second.
    The operands come from a private generator: a run measures this at every start, and drawing from the global RNG
    would make a resumed run's updates differ from a straight run's."""
    size, gen = 256, torch.Generator().manual_seed(0)
    while True:
        a, b = (torch.randn(size, size, generator=gen).to(dtype) for _ in range(2))
        t = time.perf_counter()
        torch.matmul(a, b)  # also the warm-up of this size
        if size >= n or time.perf_counter() - t > 0.01:
            break
        size *= 2
    n = size
    best, start, calls = float("inf"), time.perf_counter(), 0
    while calls < 3 or (time.perf_counter() - start < budget_s and calls < 100):
        t = time.perf_counter()
        torch.matmul(a, b)
        best, calls = min(best, time.perf_counter() - t), calls + 1
    return 2 * n**3 / best


def cpu_peak(dtype: str, *, cache: Path | None = None) -> Peak:
    """This CPU's matmul peak in `dtype` at torch's current thread count: the best rate ever measured here for this
    CPU, torch version, dtype and thread count (the cache), after one more short measurement — a machine busy with
    other work measures low, so a peak only rises, towards what the CPU does when it is quiet."""
    from tba.models import DTYPES

    path = cache or cache_dir() / "gemm_peak.json"
    threads = torch.get_num_threads()
    key = f"{cpu_name()} | torch {torch.__version__} | {dtype} | {threads} threads"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    before = known.get(key) if isinstance(known.get(key), int | float) else 0.0
    t0 = time.perf_counter()
    measured = measure_gemm(DTYPES[dtype])
    logger.debug(f"CPU matmul rate {measured / 1e9:.1f} GFLOP/s in {time.perf_counter() - t0:.2f} s ({key}); best "
                 f"before {before / 1e9:.1f}")
    if measured > before:
        known[key] = measured
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1))
            tmp.replace(path)
        except OSError as e:  # a read-only cache: this run's measurement only
            logger.debug(f"could not cache the CPU peak in {path}: {e}")
    best = max(measured, before)
    return Peak(best, f"measured matmul peak {best / 1e9:.1f} GFLOP/s ({key}; the best in {path})")


def device_peak(device: torch.device, dtype: str) -> Peak | None:
    """The peak of the trainer's `device` computing in `dtype`: a CPU's measured, a GPU's from the table; None when
    unknown (an unlisted GPU, TF32 allowed, another device type)."""
    if device.type == "cpu":
        return cpu_peak(dtype)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if dtype == "float32" and torch.get_float32_matmul_precision() != "highest":
        return None
    return gpu_peak(torch.cuda.get_device_name(device), dtype)
