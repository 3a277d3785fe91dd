"""Every example in examples/ runs as its own script (a few updates each, on the offline SmolLM2), as a user runs
it: `python examples/NAME.py key=value ...`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO, needs_smollm2

ROOT = REPO
SHORT = ["trainer.steps=2", "trainer.lr_schedule=constant", "trainer.warmup_steps=0", "eval.every_steps=2",
         "task.test_size=2", "search.prompts_per_batch=2", "search.generations_per_prompt=2",
         "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "trainer.micro_batch_prompts=2",
         "buffer.prefill_samples=4",
         "search.max_new_tokens=6", "eval.max_new_tokens=6", "logging.progress=false", "logging.tensorboard=false"]


def run(name: str, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / name
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), f"output_dir={out}", *SHORT, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@needs_smollm2
def test_the_quickstart_trains_with_trl_style_rewards(tmp_path):
    summary = run("quickstart", tmp_path)
    assert summary["trainer_steps"] == 2
    assert {"reward/accuracy", "reward/one_line", "reward/short"} <= summary["eval_end"].keys()


@pytest.mark.slow
@needs_smollm2
def test_the_lora_notebook_trains_adapters_in_one_process_and_exports(tmp_path):
    summary = run("lora_notebook", tmp_path)
    assert summary["trainer_steps"] == 2 and summary["runtime"] == "inline"
    assert (tmp_path / "lora_notebook-export" / "model.safetensors").is_file()  # merged: no adapter files


@pytest.mark.slow
@needs_smollm2
def test_a_reward_that_calls_a_model(tmp_path):
    """The score is the judge's: its one reward function's mean (P(Yes) − P(No), strictly inside (−1, 1) for real
    replies), not a constant or a missing value."""
    summary = run("model_reward", tmp_path)
    assert summary["trainer_steps"] == 2
    assert summary["eval_end"]["reward/friendliness"] == pytest.approx(summary["score_end"])
    assert 0.0 < abs(summary["score_end"]) < 1.0 and summary["train_reward_start"] != summary["score_end"]


def test_the_quickstart_is_at_most_twenty_lines_of_code():
    code = [line for line in (ROOT / "examples" / "quickstart.py").read_text().split('"""', 2)[2].splitlines()
            if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 20, len(code)


@pytest.mark.slow
@needs_smollm2
def test_an_agent_on_the_openai_client_trains(tmp_path):
    summary = run("openai_agent", tmp_path, "search.max_new_tokens=48", "eval.max_new_tokens=48")  # the agent's
    # max_tokens: the endpoint refuses more than search.max_new_tokens (400), which would fail every episode
    assert summary["trainer_steps"] == 2 and summary["episodes_ended"]["done"] > 0
    assert summary["eval_end"]["agent/calls_mean"] >= 1.0


@pytest.mark.slow
@needs_smollm2
def test_the_environment_in_tbas_protocol_trains(tmp_path):
    summary = run("sums_environment", tmp_path, "search.max_turns=2")
    assert summary["trainer_steps"] == 2 and "solved_by_second_try" in summary["eval_end"]


@pytest.mark.slow
@needs_smollm2
def test_the_openenv_environment_trains(tmp_path):
    pytest.importorskip("openenv", reason="openenv-core not installed (tba[openenv])")
    summary = run("openenv_sums", tmp_path, "task.options.episodes=4", "task.options.test_episodes=2")
    assert summary["trainer_steps"] == 2 and summary["eval_end"]["openenv/steps_mean"] >= 1


@pytest.mark.slow
@needs_smollm2
def test_trls_environment_factory_trains(tmp_path):
    summary = run("trl_factory_sums", tmp_path)
    assert summary["trainer_steps"] == 2 and "reward/used_the_tool" in summary["eval_end"]


@pytest.mark.slow
@needs_smollm2
def test_the_verifiers_taskset_trains(tmp_path):
    pytest.importorskip("verifiers", reason="verifiers not installed (tba[verifiers])")
    summary = run("verifiers_sums", tmp_path, "task.options.env={taskset: {num_tasks: 8}}")
    assert summary["trainer_steps"] == 2 and summary["episodes_ended"]["done"] > 0
