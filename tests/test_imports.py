"""The import boundary: the algorithm's files import no runtime, Ray, multiprocessing or torch.distributed —
so the loop, the objectives, the buffer and the trainer read (and run) the same on a laptop and a cluster.
Checked statically over every import statement, including the ones inside functions."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "tba"
ALGORITHM = ["loop.py", "trainer.py", "buffer.py", "searcher.py", "state.py", "metrics.py", "seeding.py",
             "generation.py", "evaluate.py", *(f"objectives/{p.name}" for p in sorted(SRC.glob("objectives/*.py")))]
FORBIDDEN = ("tba.runtime", "ray", "multiprocessing", "torch.multiprocessing", "torch.distributed", "vllm")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("name", ALGORITHM)
def test_algorithm_files_import_no_runtime(name):
    bad = {m for m in imported_modules(SRC / name) for f in FORBIDDEN if m == f or m.startswith(f + ".")}
    assert not bad, f"{name} imports {sorted(bad)}"


def test_config_validation_imports_no_torch():
    """`tba train` validates the config before anything heavy is imported: the registries must stay light."""
    import subprocess
    import sys

    code = "import sys, tba.config, tba.objectives, tba.tasks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from tba.runtime.local import LocalRuntime\n    import ray\n")
    assert {"tba.runtime.local", "ray"} <= imported_modules(f)
