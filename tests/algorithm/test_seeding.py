"""One seeding rule for every runtime: a searcher process seeds its RNGs, and the inline searcher walks the
same prompts in the same order as a process searcher of the same rank."""

import copy

import pytest
import torch
from paths import TINY

from tba.config import load_config
from tba.models import save_checkpoint
from tba.run.searchers import build_runtime, searcher_specs
from tba.runtime.searcher_spec import ModelSources
from tba.runtime.worker import InlineParts, build_searcher

OVERRIDES = ["task.options.digits=2", "task.train_size=200", "task.test_size=20", "search.prompts_per_batch=3",
             "search.generations_per_prompt=4", "search.max_new_tokens=6", "seed=7"]


def _sources(tmp_path, model, tokenizer) -> ModelSources:
    save_checkpoint(model, tokenizer, tmp_path / "start")
    return ModelSources(policy=str(tmp_path / "start"), reference=str(tmp_path / "start"),
                        tokenizer=str(tmp_path / "start"))


def test_a_searcher_process_samples_the_same_whatever_the_global_rng_was(tmp_path, tiny_model, tiny_tokenizer):
    """Workers never seeded torch: the HF sampler drew from whatever state the process happened to have."""
    cfg = load_config(None, [*OVERRIDES, "search.threads=1"])
    spec = searcher_specs(cfg, _sources(tmp_path, tiny_model, tiny_tokenizer), limit=200)[0]
    runs = []
    for noise in (1, 2):
        torch.manual_seed(noise)  # what the process did before: spawn, imports, model loading...
        searcher = build_searcher(spec)
        runs.append([(g.prompt_id, [s.response for s in g.samples]) for g in searcher.step()])
    assert runs[0] == runs[1]


def test_inline_and_process_searchers_walk_the_same_prompts(tmp_path, tiny_model, tiny_tokenizer, arith_task):
    cfg = load_config(None, [*OVERRIDES, "runtime=inline", "mode=sync", "search.threads=1"])
    sources = _sources(tmp_path, tiny_model, tiny_tokenizer)
    process = build_searcher(searcher_specs(cfg, sources, limit=200)[0])
    parts = InlineParts(copy.deepcopy(process.task), tiny_tokenizer, tiny_model, copy.deepcopy(tiny_model))
    inline = build_runtime(cfg, weights=dict(tiny_model.state_dict()), version=0, inline=parts, sources=sources,
                           limit=200).searcher
    assert [p.id for p in inline.prompts] == [p.id for p in process.prompts]
    assert inline._order == process._order


def test_rng_isolated_leaves_every_generator_where_it_was():
    import random

    import numpy as np

    from tba.algorithm.seeding import rng_isolated, seed_everything

    seed_everything(5)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(5)
    with rng_isolated():
        random.random(), np.random.rand(3), torch.rand(7)  # what an SFT warm start consumes
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


@pytest.mark.slow
def test_a_warm_start_trained_now_or_read_from_the_cache_gives_the_same_run(tmp_path):
    """Training the SFT warm start in-process used to consume the global RNG the inline searcher samples
    from: the same seed gave another run depending on whether the cache existed."""
    import json

    from tba.cli import main

    tiny = [TINY, "task.options.digits=1", "eval.every_steps=1000",
            "trainer.lr=1e-3", "search.max_new_tokens=16", "runtime=inline", "mode=sync", "threads=1",
            "trainer.steps=5",
            f"sft.cache_dir={tmp_path / 'cache'}"]
    for name in ("fresh", "cached"):
        assert main(["train", *tiny, f"output_dir={tmp_path / name}"]) == 0
    rows = {name: [(m["trainer/grad_norm"], m["searcher/tokens"]) for m in
                   map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines())]
            for name in ("fresh", "cached")}
    assert rows["fresh"] == rows["cached"] and len(rows["fresh"]) == 5
