"""The repository root on sys.path, so that `bench` imports here and in the spawned pool workers of the grid scripts
(they inherit sys.path and import the script by its module name to unpickle its functions)."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture
def run_bench(monkeypatch):
    """`run_bench("bench.claims.resume", ["--smoke"])` executes the script afresh as that module (no state left over
    from another test) and runs its main() with that command line."""

    def run(name: str, argv: list[str]) -> None:
        spec = importlib.util.find_spec(name)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        monkeypatch.setattr(sys, "argv", [f"{name.replace('.', '/')}.py", *argv])
        module.main(argv)

    return run
