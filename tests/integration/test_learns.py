"""It learns: a slice of the embedded default recipe must gain at least a recorded margin — the last rung of the test
ladder (a number that can fail, not a smoke run).

The slice: the default recipe (3-digit sums, the builtin model) with a 600-step SFT warm start and 20 TB updates,
one process (runtime=inline, mode=sync: deterministic for a seed on one machine, run in a fresh interpreter),
evaluated on 200 held-out problems. Its committed result, bench/results/learning/ci_slice.md (`python -m
bench.claims.learning … --seeds 0 1 2 3 4`, the command in its header), holds every seed's before/after; this test
runs seed 0 and asks for MARGIN points, well under what seed 0 gained there, so that machine and library noise pass
and a training step that stops learning does not.
"""

import json

import pytest
from paths import REPO
from runs import train_in_a_fresh_process

SLICE = ["sft.steps=600", "trainer.steps=20", "eval.every_steps=20", "task.test_size=200", "task.train_size=2000",
         "runtime=inline", "mode=sync", "logging.progress=false", "logging.tensorboard=false"]
"""The slice, as bench/results/learning/ci_slice.md's header records it (seed 0)."""
MARGIN = 0.15
"""Greedy pass@1 gained, at least: seed 0 gained 0.49 in the committed result (from 44 %) and
0.29 in a CI run on another CPU kind (from 49.5 %: the warm start differs by machine), so half
the smaller; a step that stops learning gains about nothing."""


def committed_rows() -> list[dict]:
    text = (REPO / "bench" / "results" / "learning" / "ci_slice.md").read_text()
    return json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])


def test_the_margin_is_below_what_the_committed_result_gained_on_seed_0():
    seed0 = next(r for r in committed_rows() if r["seed"] == 0)
    assert seed0["rl"] - seed0["sft"] >= MARGIN + 0.1  # the recorded result leaves room for noise


@pytest.mark.slow
def test_a_slice_of_the_default_recipe_gains_the_recorded_margin(tmp_path):
    summary = train_in_a_fresh_process(["seed=0", f"output_dir={tmp_path / 'run'}",
                                        f"sft.cache_dir={tmp_path / 'sft-cache'}", *SLICE])
    gain = summary["score_end"] - summary["score_start"]
    assert summary["trainer_steps"] == 20 and summary["test_problems"] == 200
    assert gain >= MARGIN, f"greedy pass@1 {summary['score_start']:.3f} → {summary['score_end']:.3f}"
