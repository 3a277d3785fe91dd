"""In-flight weight updates end to end (the real CLI, continuous batching): samples that span policy versions are
stored with their per-token versions, and a run that trains on them resumes from a checkpoint with the next
updates unchanged."""

import json
from pathlib import Path

import pytest
from paths import TINY as TINY_RECIPE

from tba.algorithm.store import BufferStore
from tba.cli import main

TINY = [TINY_RECIPE, "task.options.digits=1", "eval.every_steps=1000", "trainer.lr=1e-3", "trainer.sync_every_steps=1"]


def losses(out: Path) -> dict[int, float]:
    return {m["step"]: m["trainer/loss"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_mixed_version_samples_are_stored_and_a_resumed_run_replays_them_exactly(tmp_path):
    source, cache = tmp_path / "source", tmp_path / "cache"
    assert main(["train", *TINY, f"output_dir={source}", f"sft.cache_dir={cache}", "runtime=inline", "mode=sync",
                 "trainer.steps=6", "search.batching=continuous", "search.weight_update=in_flight"]) == 0
    store = BufferStore(source, readonly=True)
    samples = [s for _, _, g in store.iter_groups() for s in g.samples]
    store.close()
    mixed = [s for s in samples if s.versions]
    assert mixed, "no sample spans versions: updates did not land mid-response"
    assert all(len(s.versions) == len(s.response) and s.version == s.versions[0] for s in mixed)

    offline = ["train", *TINY, f"sft.cache_dir={cache}", "runtime=offline", f"buffer.source={source}"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main([*offline, f"output_dir={straight}", "trainer.steps=6"]) == 0
    assert main([*offline, f"output_dir={split}", "trainer.steps=4", "checkpoint.every_steps=2"]) == 0
    assert main(["train", "--resume", str(split), "trainer.steps=6"]) == 0
    for step in (5, 6):
        assert losses(split)[step] == pytest.approx(losses(straight)[step], rel=1e-6)
