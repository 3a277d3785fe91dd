"""Loading a benchmark script as `python -m bench.<group>.<script>` would see it, undone after each test."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_script(monkeypatch):
    """`bench_script("bench.perf.vs_trl")` executes bench/perf/vs_trl.py afresh as that module. The repository root
    goes on sys.path (so that `bench` imports, here and in spawned pool workers, which inherit sys.path and import
    the script by name to unpickle its functions) and the fresh module into sys.modules under its name; both are
    undone when the test ends."""
    monkeypatch.syspath_prepend(str(REPO))

    def load(name: str):
        spec = importlib.util.find_spec(name)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def run_bench(bench_script, monkeypatch):
    """`run_bench("bench.claims.resume", ["--smoke"])` runs the script's main() with that command line."""

    def run(name: str, argv: list[str]) -> None:
        module = bench_script(name)
        monkeypatch.setattr(sys, "argv", [f"{name.replace('.', '/')}.py", *argv])
        module.main()

    return run
