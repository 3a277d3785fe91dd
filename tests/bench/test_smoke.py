"""Every benchmark script, shrunk to seconds by its --smoke: it runs end to end and writes its result file, and that
file's header records a command that reads back as exactly the arguments it ran with — the property bench/README.md's
table relies on to show each result's command. No timing or accuracy is asserted: smoke numbers mean nothing."""

import importlib.util
import shlex
from pathlib import Path

import pytest
import torch

from bench.lib.header import recorded_command

slow, gpu = pytest.mark.slow, pytest.mark.gpu
no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
no_venv = pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / ".venv").is_dir(),
                             reason="first_run clones the repository and runs its .venv's tba (scripts/setup.sh)")
no_profanity = pytest.mark.skipif(importlib.util.find_spec("profanity_check") is None,
                                  reason="pip install alt-profanity-check")

# (module, arguments after --smoke with {tmp} for the test's folder, the result file it writes under {tmp})
STD = "--out {tmp}/out --results {tmp}/result.md"
GRID = f"--workers 1 {STD}"  # the grid scripts' process pool, one worker
SCRIPTS = [
    pytest.param("bench.claims.learning", f"--seeds 0 {STD}", "result.md", marks=slow),
    pytest.param("bench.claims.offpolicy", f"--seeds 0 --ks 1 2 --ms 0.5 --objectives tb dr_grpo {GRID}",
                 "result.md", marks=slow),
    pytest.param("bench.claims.buffer_knobs", f"--seeds 0 --ms 0.5 --iotas 10 --scale 2 --scale-cells 0.5,0 {GRID}",
                 "result.md", marks=slow),
    pytest.param("bench.claims.fixed_point", f"--seeds 0 --conditions k=1 'never, T_b=1.5' --objectives tb {GRID}",
                 "result.md", marks=slow),
    pytest.param("bench.perf.continuous", "--results {tmp}/result.md", "result.md", marks=slow),
    pytest.param("bench.perf.trainer_idle", STD, "result.md", marks=slow),
    pytest.param("bench.claims.in_flight", f"--seeds 0 --tasks enumerable enumerable_turns --objectives tb "
                 f"--conditions 'in flight' 'in flight, mid-turn' {STD}", "result.md", marks=slow),
    pytest.param("bench.claims.offpolicy_sources", f"enumerable --seeds 0 --objectives tb dr_grpo {GRID}",
                 "result.md", id="bench.claims.offpolicy_sources-enumerable"),
    pytest.param("bench.claims.offpolicy_sources",
                 f"hard --seeds 0 --target 0.0 --conditions 'TB, fp' 'TB, int8' {STD}", "result.md",
                 marks=slow, id="bench.claims.offpolicy_sources-hard"),
    pytest.param("bench.claims.smollm2_seeds", f"--seeds 0 {STD}", "result.md", marks=slow),
    pytest.param("bench.claims.multiturn", f"--seeds 0 --conditions 'stochastic, never' 'deterministic, never' {GRID}",
                 "result.md", marks=slow),
    pytest.param("bench.claims.per_turn", f"--seeds 0 1 {GRID}", "result.md"),
    pytest.param("bench.claims.redteam", "--out {tmp}/run/run --results {tmp}", "redteam.md",
                 marks=[slow, no_profanity]),
    pytest.param("bench.claims.resume", "--results {tmp}/result.md", "result.md", marks=slow),
    pytest.param("bench.perf.async_speedup", f"--seeds 0 --eval-every 3 --target 0.0 --variants async-local "
                 f"sync-inline async-bounded {STD}", "result.md", marks=slow),
    pytest.param("bench.perf.vs_trl", f"--seeds 0 --startup {STD}", "result.md", marks=slow),
    pytest.param("bench.perf.startup", STD, "result.md", marks=slow),
    pytest.param("bench.perf.quantized_sampler", "--repeats 1 --results {tmp}/result.md", "result.md"),
    pytest.param("bench.perf.scoring", "--results {tmp}/result.md", "result.md"),
    pytest.param("bench.perf.update_cost", "--repeats 1 --results {tmp}/result.md", "result.md", marks=slow),
    pytest.param("bench.perf.autocast_drift", "--results {tmp}/result.md", "result.md", marks=slow),
    pytest.param("bench.perf.serve", "--results {tmp}/result.md", "result.md", marks=slow),
    pytest.param("bench.perf.plan_memory", "--results {tmp}/result.md", "result.md"),
    pytest.param("bench.perf.sharded", "--results {tmp}/result.md", "result.md"),
    pytest.param("bench.perf.update_memory", "--results {tmp}/result.md", "result.md"),
    pytest.param("bench.perf.sampler", "--backends raw before hf --results {tmp}/result.md", "result.md", marks=slow),
    pytest.param("bench.perf.soak", "--out {tmp}/result", "result.md", marks=slow),
    pytest.param("bench.perf.first_run", "--results {tmp}/result.md", "result.md", marks=[slow, no_venv]),
    pytest.param("bench.perf.gpu_smoke", f"--device cpu --backends hf {STD}", "result.md", marks=slow),
    pytest.param("bench.perf.gpu_smoke", f"--device cuda --backends hf {STD}", "result.md", marks=[gpu, no_cuda],
                 id="bench.perf.gpu_smoke-cuda"),
]


@pytest.mark.parametrize("module, args, result", SCRIPTS)
def test_smoke_writes_a_result_that_records_its_own_command(module, args, result, tmp_path, run_bench):
    argv = ["--smoke", *shlex.split(args.format(tmp=tmp_path))]
    run_bench(module, argv)
    text = (tmp_path / result).read_text()
    assert text.startswith("# ") and "\n- date: " in text and "\n- code: " in text
    assert shlex.split(recorded_command(text)) == ["python", "-m", module, *argv]
