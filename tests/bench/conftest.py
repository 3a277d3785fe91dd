"""Loading a benchmark script as `python bench/NAME.py` would see it, undone after each test."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_script(monkeypatch):
    """`bench_script("vs_trl")` executes bench/vs_trl.py afresh as module `vs_trl`. bench/ goes on sys.path
    (the scripts import their helpers by plain name, and spawned pool workers import the script itself that
    way) and the module into sys.modules under its plain name (so that pickled functions resolve to it);
    both are undone when the test ends."""
    monkeypatch.syspath_prepend(str(BENCH))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def run_bench(bench_script, monkeypatch):
    """`run_bench("resume", ["--smoke"])` runs the script's main() with that command line."""

    def run(name: str, argv: list[str]) -> None:
        module = bench_script(name)
        monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
        module.main()

    return run
