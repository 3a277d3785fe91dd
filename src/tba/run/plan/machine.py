"""The machine a plan is for: this one (its RAM and the GPUs torch sees), or a target named on the command line
(`tba plan --gpus 8xH100`), so that a laptop can plan a cluster node without a GPU.

`--gpus` takes `[N x]NAME` (a GPU of the table below: 8xH100, 4xA100-80GB, H200) or `[N x]SIZE` (2x24GB, 80GiB;
GB is 10^9 bytes, GiB 2^30). With N, the layout may use cuda:0 … cuda:N−1; without it, every cuda:k it names. The
CPU of a target is checked only when its RAM is given (`--cpu-memory 1TB`): this machine's RAM says nothing of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tba.errors import UserError

MIB = 1024**2
_DQ = "deviceQuery's total global memory (what torch.cuda.get_device_properties reports), thamada/nvidia-smi"
_SMI = "nvidia-smi memory.total"
GPUS: dict[str, tuple[int, str]] = {
    "H100": (85045477376, f"H100 80GB HBM3 (SXM): {_DQ} gls/H100SXMx8_deviceQuery.py"),
    "H100-NVL": (99861594112, f"H100 NVL: {_DQ} gls/H100NVLx2_deviceQuery.py"),
    "H200": (141 * 10**9, "H200: NVIDIA's datasheet, 141 GB (decimal); the device reports a little more"),
    "A100-80GB": (85100068864, f"A100-SXM4-80GB: {_DQ} gls/A100SXMx4_deviceQuery.py"),
    "A100-40GB": (40960 * MIB, f"A100 40GB: {_SMI} 40960 MiB (modal-labs/modal-client PR 2797)"),
    "L40S": (47803596800, f"L40S: {_DQ} gls/L40S_deviceQuery.py"),
    "A40": (47608692736, f"A40: {_DQ} gls/A40x10_deviceQuery.py"),
    "L4": (23570219008, f"L4: {_DQ} gls/L4_deviceQuery.py"),
    "A10G": (23028 * MIB, f"A10G: {_SMI} 23028 MiB (github.com/NVIDIA/DCGM/issues/232)"),
    "A10": (23028 * MIB, f"A10: {_SMI} 23028 MiB (modal-labs/modal-client PR 2797)"),
    "T4": (15360 * MIB, f"T4: {_SMI} 15360 MiB (modal-labs/modal-client PR 2797)"),
    "RTX4090": (25386352640, f"GeForce RTX 4090: {_DQ} gls/RTX4090_deviceQuery.py"),
    "RTX3090": (25327697920, f"GeForce RTX 3090: {_DQ} gls/RTX3090_deviceQuery.py"),
    "RTX6000-ADA": (51002867712, f"RTX 6000 Ada: {_DQ} gls/RTX6000Ada_x8_deviceQuery.py"),
}
"""GPU name → (total bytes, where the number comes from). Where a deviceQuery output is public, its total (the
bytes CUDA hands out, as `tba train` reads on the node); else nvidia-smi's total, which runs about 0.5 % above it
(H100: 81559 MiB against 81106); the 10 % headroom covers either."""
ALIASES = {"H100SXM": "H100", "H100SXM5": "H100", "H10080GB": "H100", "H200SXM": "H200",
           "A100SXM80GB": "A100-80GB", "A100SXM480GB": "A100-80GB", "4090": "RTX4090", "3090": "RTX3090",
           "RTX6000ADA": "RTX6000-ADA"}
"""Other spellings (compared without case, spaces or dashes). A bare A100 is refused: it comes in 40 and 80 GB."""

Capacity = Callable[[str], "int | None"]


class TargetError(UserError):
    """A `--gpus` or `--cpu-memory` that names no machine: the plan cannot start."""

    label = "plan"
    exit_code = 2


def _key(name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", name.upper().removeprefix("NVIDIA"))


_TABLE = {_key(n): n for n in GPUS} | {a: n for a, n in ALIASES.items()}


def parse_size(text: str) -> int:
    """`80GB` (10^9 bytes), `80GiB` (2^30), `512MB`, `1TB`, … → bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT])(I?)B\s*", text.upper())
    if m is None:
        raise TargetError(f"{text!r} is not a size: write it as 80GB (10^9 bytes) or 80GiB (2^30 bytes)")
    power = "KMGT".index(m.group(2)) + 1
    return int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)


def parse_gpus(text: str) -> tuple[int | None, int, str]:
    """`--gpus` → (count or None, bytes per GPU, what they are)."""
    m = re.fullmatch(r"\s*(?:(\d+)\s*[xX×]\s*)?(.+?)\s*", text)
    count, body = (int(m.group(1)) if m.group(1) else None), m.group(2)
    if re.fullmatch(r"\d+(?:\.\d+)?\s*[KMGTkmgt][iI]?[bB]", body):
        return count, parse_size(body), body
    name = _TABLE.get(_key(body))
    if name is None:
        hint = " (A100-40GB or A100-80GB?)" if _key(body) == "A100" else ""
        raise TargetError(f"--gpus {text}: unknown GPU {body!r}{hint}; known: {', '.join(GPUS)}, or a size per GPU "
                        "(8x80GB, 2x24GiB)")
    return count, GPUS[name][0], name


def machine_capacity(device: str) -> int | None:
    """This machine: a CPU's RAM (MemTotal, shared by everything on `cpu`), a GPU's total memory; None when it
    cannot be read."""
    if device == "cpu":
        try:
            with open("/proc/meminfo") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
        except (OSError, StopIteration):
            return None
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        index = int(device.split(":")[1]) if ":" in device else 0
        if index < torch.cuda.device_count():
            return torch.cuda.get_device_properties(index).total_memory
    return None


@dataclass(frozen=True)
class Machine:
    """What the plan checks against: each device's capacity, and whether `auto` means a GPU."""

    capacity: Capacity
    has_gpu: bool | None = None
    """None: ask torch on this machine."""
    label: str = "this machine"
    gpus: int | None = None
    """How many GPUs a target has (None: as many as the layout names)."""

    def gpu_count(self) -> int | None:
        """GPUs on the machine: a target's count, or those torch sees here; None when not known."""
        if self.has_gpu is None:
            import torch

            return torch.cuda.device_count() if torch.cuda.is_available() else None
        return self.gpus

    def auto(self) -> str:
        if self.has_gpu is None:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        return "cuda" if self.has_gpu else "cpu"


def local_machine() -> Machine:
    return Machine(lambda device: machine_capacity(device))


def target_machine(gpus: str | None, cpu_memory: str | None = None) -> Machine:
    """The machine `tba plan --gpus … [--cpu-memory …]` describes (its CPU unknown unless given)."""
    try:
        cpu = parse_size(cpu_memory) if cpu_memory else None
    except TargetError as e:
        raise TargetError(f"--cpu-memory {cpu_memory}: {e}") from None
    if gpus is None:
        return Machine(lambda d: cpu if cpu is not None and d == "cpu" else machine_capacity(d))
    count, each, what = parse_gpus(gpus)

    def capacity(device: str) -> int | None:
        if device == "cpu":
            return cpu
        if not device.startswith("cuda"):
            return None
        index = int(device.split(":")[1]) if ":" in device else 0
        return each if count is None or index < count else None

    return Machine(capacity, has_gpu=True, label=f"{'' if count is None else f'{count} × '}{what}", gpus=count)


def device_key(device: str, machine: Machine) -> str:
    """One name per physical device: `cuda` is cuda:0 (tba.models.resolve_device takes the current device, 0 unless
    set), `auto` the first GPU when the machine has one."""
    device = device.strip()
    if device == "auto":
        device = machine.auto()
    return "cuda:0" if device == "cuda" else device
