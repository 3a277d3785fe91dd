"""The layout is the design: each folder of src/tba imports only the folders below it, so the algorithm reads (and
runs) the same on a laptop and a cluster, the config is validated without the code it configures, and a newcomer can
trust `ls` as the map. Checked statically over every import statement, including the ones inside functions and
`importlib.import_module` calls with a literal name (a lazy import is still a dependency of the design).

    errors, plugins                      the base: a user's error, the lazy loader
    config                               the schema and its loader (and, by name only, the registries)
    models                               loading, the builtin model, decoding and log-probs
    algorithm        tasks               the paper's loop, trainer, buffer, objectives · data plus a verifier
    rollout                              making samples: searchers, samplers, episodes, evaluation
    serve                                an inference endpoint in front of a sampler (HTTP: tokens, chat)
    runtime                              where searchers run and how groups and weights travel
    ranks                                a trainer of N FSDP2 ranks and the controller's handle on them
    run                                  one run: built from the config, checkpointed, reported
    api, cli, __main__                   the front doors
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

SRC = REPO / "src" / "tba"
BASE = {"errors", "plugins"}
BELOW = {
    "errors": set(), "plugins": {"errors"},
    "config": BASE,
    "models": BASE | {"config"},
    "algorithm": BASE | {"config", "models"},
    "tasks": BASE | {"config", "models"},
    "rollout": BASE | {"config", "models", "algorithm", "tasks"},
    "serve": BASE | {"config", "models", "algorithm", "tasks", "rollout"},
    "runtime": BASE | {"config", "models", "algorithm", "tasks", "rollout", "serve"},
    "ranks": BASE | {"config", "models", "algorithm", "tasks", "rollout", "serve", "runtime"},
    "run": BASE | {"config", "models", "algorithm", "tasks", "rollout", "serve", "runtime", "ranks"},
    "api": BASE | {"config", "run", "models"},
    "cli": BASE | {"config", "models", "algorithm", "tasks", "rollout", "serve", "runtime", "ranks", "run", "api"},
    "__main__": {"cli"},
}
"""Folder → the folders its modules may import (besides its own)."""
REGISTRIES = {"tba.tasks", "tba.algorithm.objectives", "tba.runtime", "tba.rollout.samplers"}
"""Name → plugin-target tables that config validation reads (light: they import no tba module but the base), so the
config may name what exists without importing it."""
FORBIDDEN_IN_ALGORITHM = ("ray", "multiprocessing", "torch.multiprocessing", "torch.distributed", "vllm")


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


def folder(module: str) -> str:
    return module.split(".")[1] if module != "tba" else "tba"


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


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != "tba"))
def test_each_module_imports_only_the_folders_below_its_own(name):
    mine = folder(name)
    allowed = BELOW[mine] | {mine}
    bad = sorted(n for n in tba_graph()[name] if folder(n) not in allowed and not (mine == "config" and n in REGISTRIES)
                 and n != "tba")
    assert not bad, f"{name} ({mine}/) imports {bad}; {mine}/ may import {sorted(BELOW[mine])}"


def test_the_registries_import_nothing_but_the_base():
    for registry in REGISTRIES:
        tba = {n for n in imported_modules(MODULES[registry]) if n in MODULES}
        assert tba <= {"tba.plugins", "tba.errors"}, f"{registry} imports {sorted(tba)}"


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IN_ALGORITHM)


def test_the_algorithm_reaches_no_process_or_cluster_library():
    """Not directly, nor through another tba module: the loop, trainer, buffer and objectives are the same code on
    one process, local processes and Ray."""
    graph = tba_graph()
    for name in (m for m in MODULES if folder(m) == "algorithm"):
        reached = [name, *paths_from(graph, name)]
        bad = [(m, sorted(n for n in imported_modules(MODULES[m]) if _forbidden(n))) for m in reached]
        assert not [b for b in bad if b[1]], f"{name} reaches {[b for b in bad if b[1]]}"


def test_no_import_circles():
    graph = tba_graph()
    circles = [" → ".join(paths_from(graph, m)[m]) for m in graph if m in paths_from(graph, m)]
    assert not circles, f"import circles: {circles[:5]}"


def test_the_graph_sees_a_circle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert paths_from(graph, "a")["a"] == ["a", "b", "c", "a"] and "d" not in paths_from(graph, "d")


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import importlib\ndef f():\n    from tba.runtime.local import LocalRuntime\n    import ray\n"
                 "    return importlib.import_module('tba.tasks.redteam')\n")
    assert {"tba.runtime.local", "ray", "tba.tasks.redteam"} <= imported_modules(f)


def test_every_folder_is_in_the_map():
    folders = {folder(m) for m in MODULES if m != "tba"}
    assert folders == set(BELOW), f"add {folders - set(BELOW)} to BELOW, or drop {set(BELOW) - folders}"


def test_config_validation_imports_no_torch():
    """`tba train` validates the config before anything heavy is imported: the registries must stay light."""
    code = ("import sys, tba.config, tba.algorithm.objectives, tba.tasks, tba.runtime, tba.rollout.samplers;"
            " print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_only_build_and_the_front_ends_read_the_run_config():
    """Every other component takes its own config section(s): a RunConfig is read in one place, run/build.py (with
    run/searchers.py and run/placement.py, its searchers' half; run/sharded.py, its sharded trainer's; run/train.py,
    which hands its sections over; run/evaluation.py, the run's evaluation, which `tba eval` builds too;
    run/serve.py, which builds the policy `tba serve` serves as a searcher would; and the run/plan/ package, which
    plans the memory of the whole run from it before anything is built), and given by the two front ends (the API,
    and the CLI: its buffer command reads a finished run's config for the tokenizer)."""
    readers = sorted({"tba.run.plan" if m.startswith("tba.run.plan.") else m for m, p in MODULES.items()
                      if folder(m) != "config"
                      and any(n == "tba.config" or n.endswith(".RunConfig") for n in imported_modules(p))})
    assert readers == ["tba.api", "tba.cli.buffer", "tba.cli.train", "tba.run.build", "tba.run.evaluation",
                       "tba.run.placement", "tba.run.plan", "tba.run.searchers", "tba.run.serve", "tba.run.sharded",
                       "tba.run.train"]
