"""The import boundary: the algorithm's files import no runtime, Ray, multiprocessing or torch.distributed —
so the loop, the objectives, the buffer and the trainer read (and run) the same on a laptop and a cluster —
neither directly nor through another tba module; and no tba module imports itself round a circle. Checked
statically over every import statement, including the ones inside functions and `importlib.import_module`
calls with a literal name (a lazy import that breaks a circle at run time is still a circle in the design)."""

import ast
from pathlib import Path

import pytest
from paths import REPO

SRC = REPO / "src" / "tba"
ALGORITHM = [str(p.relative_to(SRC)) for p in sorted(SRC.glob("algorithm/**/*.py"))] + [
    "rollout/searcher.py", "models/generation.py", "rollout/evaluate.py"]
FORBIDDEN = ("tba.runtime", "ray", "multiprocessing", "torch.multiprocessing", "torch.distributed", "vllm")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def tba_graph() -> dict[str, set[str]]:
    """tba module → the tba modules it imports (anywhere in the file)."""
    return {m: {n for n in imported_modules(p) if n in MODULES and n != m} for m, p in MODULES.items()}


def paths_from(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module `start` reaches by imports, direct or not (itself only round a circle) → one such path."""
    paths, todo = {}, [[start]]
    while todo:
        path = todo.pop()
        for n in sorted(graph[path[-1]]):
            if n not in paths:
                paths[n] = [*path, n]
                if n != start:
                    todo.append(paths[n])
    return paths


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


@pytest.mark.parametrize("name", ALGORITHM)
def test_algorithm_files_import_no_runtime(name):
    bad = {m for m in imported_modules(SRC / name) if _forbidden(m)}
    assert not bad, f"{name} imports {sorted(bad)}"


REGISTRY = "tba.runtime"
"""The runtime registry (names and `module:function` strings): config validation reads it, so every module
reaches it through tba.config; it may be reached because it imports nothing (checked below)."""


def _runtime_imports(module: str) -> list[str]:
    """What `module` imports of the runtime, the registry and the names it defines excepted."""
    return sorted(n for n in imported_modules(MODULES[module]) if _forbidden(n) and n != REGISTRY
                  and not (n.startswith(REGISTRY + ".") and n not in MODULES))


@pytest.mark.parametrize("name", ALGORITHM)
def test_algorithm_files_reach_no_runtime_through_other_modules(name):
    bad = [" → ".join([*path, _runtime_imports(path[-1])[0]])
           for path in paths_from(tba_graph(), module_name(SRC / name)).values() if _runtime_imports(path[-1])]
    assert not bad, f"{name} reaches the runtime: {sorted(bad)[:5]}"


def test_the_runtime_registry_imports_no_tba_module():
    assert not {n for n in imported_modules(MODULES[REGISTRY]) if n.startswith("tba")}


def test_no_import_circles():
    graph = tba_graph()
    circles = [" → ".join(paths_from(graph, m)[m]) for m in graph if m in paths_from(graph, m)]
    assert not circles, f"import circles: {circles[:5]}"


def test_the_graph_sees_a_circle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert paths_from(graph, "a")["a"] == ["a", "b", "c", "a"] and "d" not in paths_from(graph, "d")


def test_config_validation_imports_no_torch():
    """`tba train` validates the config before anything heavy is imported: the registries must stay light."""
    import subprocess
    import sys

    code = "import sys, tba.config, tba.algorithm.objectives, tba.tasks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import importlib\ndef f():\n    from tba.runtime.local import LocalRuntime\n    import ray\n"
                 "    return importlib.import_module('tba.tasks.redteam')\n")
    assert {"tba.runtime.local", "ray", "tba.tasks.redteam"} <= imported_modules(f)


def test_only_build_and_the_front_ends_read_the_run_config():
    """Every other component takes its own config section(s): a RunConfig is read in one place, build.py, and
    handed over by the two front ends (the Python API, and the CLI that goes through it)."""
    readers = sorted(m for m, p in MODULES.items() if not m.startswith("tba.config")
                     and any(n == "tba.config" or n.endswith(".RunConfig") for n in imported_modules(p)))
    assert readers == ["tba.api", "tba.cli.train", "tba.run.build", "tba.run.train"]
