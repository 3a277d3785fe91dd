"""Several behaviour policies feeding one buffer (search.groups): each searcher's spec, every sample's source
through the store, a checkpoint and a resume, and a fixed group that never loads the trainer's weights."""

import json

import pytest
from paths import TINY as TINY_RECIPE

from tba.algorithm.store import BufferStore
from tba.config import load_config
from tba.models import save_checkpoint
from tba.run.build import build_models, build_task
from tba.run.searchers import searcher_specs
from tba.run.train import train
from tba.runtime.searcher_spec import ModelSources

TINY = TINY_RECIPE
GROUPS = "search.groups=[{name: policy}, {name: hot, temperature: 1.5, sync: false}, {name: other, policy: OTHER}]"


@pytest.fixture(scope="module")
def other_policy(tmp_path_factory):
    """Another model with the run's tokenizer: the builtin model of another seed (no SFT)."""
    cfg = load_config(TINY, ["sft.enabled=false", "seed=77"])
    tokenizer, policy, _, _ = build_models(cfg, build_task(cfg))
    path = tmp_path_factory.mktemp("other") / "model"
    save_checkpoint(policy, tokenizer, path)
    return str(path)


def test_each_group_becomes_specs_with_its_own_settings_and_shards(other_policy):
    cfg = load_config(TINY, ["sft.enabled=false", "search.temperature=0.7", "search.device=cpu",
                             "search.groups=[{name: policy, num_searchers: 2}, {name: hot, temperature: 1.5, "
                             f"sync: false, quantize: int8}}, {{name: other, policy: {other_policy}}}]"])
    sources = ModelSources("start", "ref", "tok")
    specs = searcher_specs(cfg, sources, limit=100)
    assert [(s.rank, s.source, s.shard, s.num_shards) for s in specs] == [
        (0, "policy", 0, 2), (1, "policy", 1, 2), (2, "hot", 0, 1), (3, "other", 0, 1)]
    assert [s.synced for s in specs] == [True, True, False, False]
    assert [s.trained_policy for s in specs] == [True, True, True, False]
    assert [s.search.temperature for s in specs] == [0.7, 0.7, 1.5, 0.7]
    assert all(s.scoring_temperature == 0.7 for s in specs)  # π_ref's log-probs stay at the trainer's T
    assert [s.sampler.quantize for s in specs] == ["none", "none", "int8", "none"]
    assert specs[3].sources.policy == other_policy and specs[3].sources.reference == "ref"
    assert len({s.seed for s in specs}) == 4


def test_a_mixed_source_run_records_every_sample_source_through_a_checkpoint_and_a_resume(tmp_path, other_policy):
    out = tmp_path / "run"
    base = [f"output_dir={out}", "sft.enabled=false", "runtime=inline", "mode=sync", "trainer.sync_every_steps=1",
            "checkpoint.every_steps=3", "eval.every_steps=100", GROUPS.replace("OTHER", other_policy)]
    train(load_config(TINY, [*base, "trainer.steps=3"]), overwrite=True)
    summary = train(load_config(out / "config.yaml", ["trainer.steps=6"]), resume=True)
    store = BufferStore(out, readonly=True)
    by_source = {}
    for _, _, g in store.iter_groups():
        assert {s.source for s in g.samples} == {g.source}
        by_source[g.source] = by_source.get(g.source, 0) + len(g.samples)
    assert set(by_source) == {"policy", "hot", "other"}
    assert set(store.stats()["sources"]) == {"policy", "hot", "other"}
    assert summary["resumed_at_steps"] == [3] and set(summary["sources"]) == {"policy", "hot", "other"}
    assert sum(t["samples_drawn"] for t in summary["sources"].values()) == 6 * 2 * 4  # steps × B × K
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    shares = [sum(m[f"source/{s}/draw_share"] for s in ("policy", "hot", "other")) for m in metrics]
    assert shares == pytest.approx([1.0] * 6)
    # versions: the synced policy's samples follow the trainer, the fixed groups' stay at their start
    versions = {g.source: max(s.version for s in g.samples) for _, _, g in store.iter_groups()}
    assert versions["policy"] >= 4 and versions["hot"] == 0 and versions["other"] == 0


def test_a_fixed_group_never_loads_the_trainers_weights(tmp_path, other_policy):
    from tba.algorithm.state import RunState
    from tba.run.build import build_run

    cfg = load_config(TINY, [f"output_dir={tmp_path}", "sft.enabled=false", "runtime=inline", "mode=sync",
                             GROUPS.replace("OTHER", other_policy)])
    run = build_run(cfg, tmp_path, None, {}, RunState())
    policy, hot, other = run.runtime.all
    run.runtime.publish(run.trainer.weights(), 1)
    assert (policy.version, policy.stats.loads) == (1, 1) and (hot.version, hot.stats.loads) == (0, 0)
    assert other.stats.loads == 0
    run.runtime.stop()
    run.buffer.close()
