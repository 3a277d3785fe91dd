"""A shrunken default recipe end to end through the real CLI entry point (in-process: one import cost)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tba.cli import main

SUMMARY_KEYS = {"score_start", "score_end", "wall_clock_s", "trainer_steps",
                "samples_received", "objective", "seed"}
METRIC_KEYS = {"step", "wall_clock_s", "trainer/loss", "searcher/reward_mean", "trainer/beta", "trainer/lr",
               "buffer/size", "trainer/tokens_per_s", "staleness/mean", "staleness/max"}


@pytest.mark.slow
def test_tiny_run_fills_buffer_changes_weights_and_writes_run_dir(tmp_path):
    out = tmp_path / "run"
    args = ["train", f"output_dir={out}", f"sft.cache_dir={tmp_path / 'cache'}", "sft.steps=60",
            "sft.log_every_steps=60", "task.options.digits=1", "task.train_size=300", "task.test_size=16",
            "trainer.steps=4",
            "trainer.sync_every_steps=2", "trainer.lr=1e-3", "buffer.prefill_samples=20", "eval.every_steps=2",
            "search.prompts_per_batch=4", "search.generations_per_prompt=6", "trainer.prompts_per_step=4",
            "trainer.samples_per_prompt=4", "trainer.micro_batch_prompts=2", "logging.progress=false",
            "threads=1", "runtime=inline", "mode=sync"]
    assert main(args) == 0

    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["trainer_steps"] == 4 and summary["samples_received"] > 20
    # start-up (models, searchers, evaluation excluded) + training ≤ the whole run
    assert 0 < summary["startup_s"] and summary["startup_s"] + summary["train_wall_clock_s"] <= summary["wall_clock_s"]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert all(METRIC_KEYS <= m.keys() for m in lines)
    assert all(m["buffer/size"] >= 20 for m in lines)
    assert all(torch.isfinite(torch.tensor(m["trainer/loss"])) for m in lines)
    assert max(m["staleness/max"] for m in lines) >= 1  # k = 2: the second step of a window is stale
    assert list((out / "tensorboard").iterdir())
    assert (out / "config.yaml").is_file()

    # the final checkpoint is a real transformers checkpoint and differs from the SFT start
    sft_dir = next((tmp_path / "cache").iterdir())
    start = AutoModelForCausalLM.from_pretrained(sft_dir)
    end = AutoModelForCausalLM.from_pretrained(out / "checkpoint")
    assert (out / "checkpoint" / "model.safetensors").is_file()
    pairs = zip(start.state_dict().values(), end.state_dict().values(), strict=True)
    changed = [not torch.equal(a, b) for a, b in pairs]
    assert any(changed)

    # a second run reuses the cached warm start
    assert main(args[:1] + [f"output_dir={tmp_path / 'run2'}"] + args[2:]) == 0
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_config_error_exits_before_building_anything(tmp_path, capsys):
    assert main(["train", f"output_dir={tmp_path / 'x'}", "trainer.stepz=1"]) == 2
    assert "unknown config key 'trainer.stepz'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
