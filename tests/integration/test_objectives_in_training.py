"""Every objective trains through the same searcher, buffer and trainer (inline runtime, tiny model): the loss
is finite and not identically zero, and the weights move."""

import json
import math

import pytest
from paths import TINY as TINY_RECIPE
from safetensors.torch import load_file

from tba.algorithm.objectives import OBJECTIVES
from tba.cli import main

TINY = TINY_RECIPE


@pytest.fixture(scope="module")
def sft_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sft-cache")


@pytest.mark.slow
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_objective_trains_end_to_end(tmp_path, sft_cache, objective):
    out = tmp_path / "run"  # one-digit sums: the 20-step warm start gets some right, so groups carry signal
    code = main(["train", TINY, f"output_dir={out}", f"sft.cache_dir={sft_cache}", f"objective={objective}",
                 "runtime=inline", "mode=sync", "trainer.steps=4", "trainer.lr=1e-3", "eval.every_steps=4",
                 "task.options.digits=1", "search.max_new_tokens=16", "baselines.reference_reset_steps=2"])
    assert code == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["trainer/loss"] for m in lines]
    assert len(lines) == 4 and all(x is not None and math.isfinite(x) for x in losses), losses
    assert any(x != 0.0 for x in losses), losses
    assert all(m["trainer/skipped"] == 0 for m in lines)
    start = load_file(str(next(p for p in sft_cache.iterdir() if p.is_dir()) / "model.safetensors"))
    end = load_file(str(out / "checkpoint" / "model.safetensors"))
    moved = max((end[k] - start[k]).abs().max().item() for k in start)
    assert moved > 0, f"{objective}: the policy's weights did not change in 4 updates"
    assert json.loads((out / "summary.json").read_text())["objective"] == objective
