"""Every objective trains through the same searcher, buffer and trainer (inline runtime, tiny model)."""

import json

import pytest

from tba.cli import main
from tba.objectives import OBJECTIVES


@pytest.fixture(scope="module")
def sft_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sft-cache")


@pytest.mark.slow
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_objective_runs_end_to_end(tmp_path, sft_cache, objective):
    out = tmp_path / "run"
    code = main(["train", f"output_dir={out}", f"sft.cache_dir={sft_cache}", f"objective={objective}",
                 "runtime=inline", "mode=sync", "sft.steps=20", "sft.log_every_steps=20", "task.train_size=200",
                 "task.test_size=8", "trainer.steps=4", "trainer.sync_every_steps=2", "trainer.lr=1e-3",
                 "buffer.prefill_samples=12", "eval.every_steps=4", "search.prompts_per_batch=2",
                 "search.samples_per_prompt=6", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4",
                 "baselines.reference_reset_steps=2", "logging.progress=false", "logging.tensorboard=false",
                 "eval.max_new_tokens=8", "search.max_new_tokens=16"])
    assert code == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(m["loss"] is not None for m in lines)
    assert json.loads((out / "summary.json").read_text())["objective"] == objective
