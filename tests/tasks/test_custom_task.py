"""The task extension point: a task in one file, named in the config, trained on end to end."""

import json

import pytest
from paths import REPO

from tba.cli import main
from tba.config import ConfigError, load_config
from tba.tasks.prepare import TaskSpec, build_task

EXAMPLE = str(REPO / "examples" / "reasoning_gym_task.py")
OPTIONS = "task.options={dataset: chain_sum, min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}"


def load_custom_task(target: str, options: dict, train_size: int = 30, test_size: int = 4):
    return build_task(TaskSpec(target, options, train_size, test_size))


def test_a_task_file_loads_with_its_options_and_its_reward_verifies():
    task = load_custom_task(f"{EXAMPLE}:make_task", {"max_digits": 1})
    assert task.name == "reasoning_gym/chain_sum" and len(task.test) == 4 and task.train
    p = task.train[0]
    assert task.reward(p, " " + p.answer) == 1.0 and task.reward(p, " nonsense") == 0.0


def test_bad_task_specs_name_the_key():
    with pytest.raises(ConfigError, match="task.name: cannot load .*FileNotFoundError"):
        load_custom_task("nowhere/task.py:make", {})
    with pytest.raises(ConfigError, match="task.name: cannot load .*make_nothing"):
        load_custom_task(f"{EXAMPLE}:make_nothing", {})
    with pytest.raises(ConfigError,
                       match="task.name: must be one of arith, reasoning_gym, enumerable, enumerable_turns, "
                             "guess_number, tool_arith, gsm8k, tldr, redteam, dataset, factory, openenv, agent or "
                             "module:factory"):
        load_config(None, ["task.name=countdown"])


@pytest.mark.slow
def test_training_on_a_custom_task_end_to_end(tmp_path):
    out = tmp_path / "run"
    assert main(["train", f"output_dir={out}", f"sft.cache_dir={tmp_path / 'cache'}", f"task.name={EXAMPLE}:make_task",
                 OPTIONS, "task.train_size=300", "task.test_size=8", "sft.steps=40", "sft.log_every_steps=40",
                 "trainer.steps=3", "buffer.prefill_samples=12",
                 "search.prompts_per_batch=4", "search.generations_per_prompt=4", "trainer.prompts_per_step=2",
                 "trainer.samples_per_prompt=4", "search.max_new_tokens=8", "eval.max_new_tokens=8",
                 "runtime=local", "logging.progress=false", "logging.tensorboard=false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 3 and summary["test_problems"] == 8 and summary["samples_received"] > 0
