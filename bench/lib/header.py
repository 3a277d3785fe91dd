"""The header a results file opens with: the date, the machine, the code's commit, the package versions and the
command line as it was typed. A number in README.md is only as good as the record of how it was measured;
written once here, every results file carries the same record in the same place.

`module` is the script's `__spec__.name` (e.g. `bench.claims.fixed_point`): the same whether the script runs under
`python -m` or is imported by a test.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import sys
from pathlib import Path


def today() -> str:
    return datetime.date.today().isoformat()


def command(module: str, argv: list[str] | None = None) -> str:
    """`python -m MODULE ARGS…` with the arguments as given (default: this process's own), quoted for a POSIX shell
    so that the line runs as written (an argument with a space, e.g. `--conditions "TB, fp"`, stays one argument)."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def code_span(text: str) -> str:
    """`text` as a markdown code span, fenced by one backtick more than its longest run of backticks."""
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    pad = " " if fence != "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def recorded_command(text: str) -> str | None:
    """The command a results file's header records: the first code span on its first `- command:` line (the line
    `header` writes). None when the file has no such line."""
    line = next((x for x in text.splitlines() if x.startswith("- command: ")), None)
    found = line and re.search(r"(`+)(.+?)(?<!`)\1(?!`)", line)
    return found.group(2).strip() if found else None


def code_version() -> str:
    """The commit the benchmark started on (short hash), `+changes in src/` when src/ differed from it. Read once,
    when the script starts (a long benchmark writes its header at the end, after the tree may have moved on)."""
    return _CODE


def _code_version() -> str:
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{head}{' +changes in src/' if dirty else ''}" if head else "unknown (no git)"


_CODE = _code_version()


def machine() -> str:
    """Architecture, CPU model, cores and GPU: `x86_64 (AMD EPYC), 2 cores, no GPU`. The CPU model because this
    project's machine is not always the same one: the same 2-core kind has been seen on Intel CPUs with AMX and on
    AMD EPYC, and a ratio measured on one need not hold on the other."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}{f' ({cpu_model()})' if cpu_model() else ''}, {os.cpu_count()} cores, {gpu}"


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, with its family and widest vector unit: `AMD EPYC, family
    26, AVX-512`. The name alone does not tell this kind's CPUs apart (an AVX2-only EPYC and an AVX-512 one are both
    "AMD EPYC"), and the matmul kernels, so the timings, differ by vector unit. '' where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n")[0]  # the first processor's block
    except OSError:
        return platform.processor()
    fields = {k.strip(): v.strip() for k, _, v in (x.partition(":") for x in first.splitlines()) if v}
    flags = set(fields.get("flags", "").split())
    unit = next((name for flag, name in (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
                 if flag in flags), "")
    family = f"family {fields['cpu family']}" if "cpu family" in fields else ""
    return ", ".join(x for x in (fields.get("model name", ""), family, unit) if x)


def versions(*packages: str) -> str:
    """`torch 2.13.0+cpu, transformers 5.19.0`: the installed versions of `packages`; absent ones are left out."""
    found = []
    for name in packages:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def header(module: str, *notes: str, title: str | None = None, argv: list[str] | None = None,
           packages: tuple[str, ...] = ("torch", "transformers")) -> str:
    """The markdown header: a title (default: the script's path), then date, machine, versions (none if `packages`
    is empty), command and any `notes` (what the table's cells mean, where the plot is) as a bullet list."""
    lines = [f"# {title or module.replace('.', '/') + '.py'}", "", f"- date: {today()}", f"- machine: {machine()}",
             f"- code: {code_version()}",
             *([f"- versions: {versions(*packages)}"] if packages else []),
             f"- command: {code_span(command(module, argv))}",
             *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n\n"


def raw_rows(path: Path) -> list[dict]:
    """The per-run rows a results file carries in its ```json block (what every table is computed from)."""
    text = path.read_text()
    if "```json\n" not in text:
        raise SystemExit(f"{path}: no ```json block of raw rows (not a results file written by a bench script?)")
    return json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])
