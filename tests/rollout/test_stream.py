"""A searcher under continuous batching (tba.rollout.stream): whole groups, the prompt cursor of what is in flight,
and weight updates that land mid-response (in_flight) or wait for the rows in flight (between_batches)."""

import copy
import dataclasses

import pytest
import torch

from tba.algorithm.store import BufferStore
from tba.algorithm.types import Group
from tba.config.schema import SearchConfig
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher

CFG = SearchConfig(temperature=1.0, generations_per_prompt=3, prompts_per_batch=2, max_new_tokens=12,
                   batching="continuous", slots=4)


def _searcher(model, tok, task, cfg=CFG):
    return Searcher(HFSampler(copy.deepcopy(model), tok), copy.deepcopy(model), tok, task, cfg, seed=0)


class Publisher:
    """A trainer that publishes a perturbed policy every `every` decode steps (a WeightSync)."""

    def __init__(self, searcher, model, every: int):
        self.searcher, self.model, self.every = searcher, model, every
        self.calls = self.loads = 0

    def _newest(self) -> int:
        return self.calls // self.every

    def pending(self) -> bool:
        self.calls += 1
        return self._newest() > self.searcher.version

    def load(self) -> None:
        self.calls += 1
        v = self._newest()
        if v > self.searcher.version:
            with torch.no_grad():
                weights = {k: t + 0.05 * v for k, t in self.model.state_dict().items()}
            self.searcher.load_weights(weights, v)
            self.loads += 1


def test_a_step_returns_whole_groups_and_the_cursor_is_the_oldest_prompt_in_flight(tiny_model, tiny_tokenizer,
                                                                                     arith_task):
    searcher = _searcher(tiny_model, tiny_tokenizer, arith_task)
    torch.manual_seed(0)
    groups = searcher.step()
    assert len(groups) >= CFG.prompts_per_batch
    for g in groups:
        assert len(g.samples) == CFG.generations_per_prompt
        assert g.prompt_tokens == tiny_tokenizer(arith_task.train[g.prompt_id].text)["input_ids"]
        for s in g.samples:
            assert 1 <= len(s.response) <= CFG.max_new_tokens and s.version == 0 and s.versions == []
    walk = [searcher.prompts[i].id for i in searcher._order]
    in_flight = {o.prompt.id for o in searcher.stream.open.values()}
    assert in_flight and walk[searcher.state_dict()["cursor"]] in in_flight
    assert searcher.state_dict()["cursor"] < searcher._cursor


def test_in_flight_updates_land_mid_response_and_each_token_records_its_version(tiny_model, tiny_tokenizer,
                                                                                  arith_task):
    cfg = dataclasses.replace(CFG, weight_update="in_flight")
    searcher = _searcher(tiny_model, tiny_tokenizer, arith_task, cfg)
    sync = Publisher(searcher, tiny_model, every=3)
    torch.manual_seed(1)
    samples = [s for _ in range(3) for g in searcher.step(sync) for s in g.samples]
    mixed = [s for s in samples if s.versions]
    assert sync.loads > 3 and mixed
    for s in mixed:
        assert len(s.versions) == len(s.response) and s.versions == sorted(s.versions)
        assert s.version == s.versions[0] < s.last_version
    # π_ref's log-probs are of the reference, whatever sampled: unchanged by the mixing
    g = next(g for g in searcher.step(sync) for s in g.samples if s.versions)
    assert all(len(s.ref_logprobs) == len(s.response) for s in g.samples)


def test_between_batches_lets_the_rows_in_flight_end_before_loading(tiny_model, tiny_tokenizer, arith_task):
    searcher = _searcher(tiny_model, tiny_tokenizer, arith_task)
    sync = Publisher(searcher, tiny_model, every=5)
    torch.manual_seed(2)
    samples = [s for _ in range(4) for g in searcher.step(sync) for s in g.samples]
    assert sync.loads >= 2
    assert all(s.versions == [] for s in samples)
    assert len({s.version for s in samples}) > 1


def test_mixed_version_samples_survive_the_store_exactly(tiny_model, tiny_tokenizer, arith_task, tmp_path):
    cfg = dataclasses.replace(CFG, weight_update="in_flight")
    searcher = _searcher(tiny_model, tiny_tokenizer, arith_task, cfg)
    sync = Publisher(searcher, tiny_model, every=2)
    torch.manual_seed(3)
    groups: list[Group] = [g for _ in range(3) for g in searcher.step(sync)]
    assert any(s.versions for g in groups for s in g.samples)
    store = BufferStore(tmp_path)
    store.append(groups, step=0)
    back = [g for _, _, g in store.iter_groups()]
    assert [[s.versions for s in g.samples] for g in back] == [[s.versions for s in g.samples] for g in groups]
    assert [[s.version for s in g.samples] for g in back] == [[s.version for s in g.samples] for g in groups]
    loaded = store.load_samples([(1, i) for i in range(len(groups[0].samples))])
    assert [loaded[1, i].versions for i in range(len(groups[0].samples))] == [s.versions for s in groups[0].samples]
    store.close()


@pytest.mark.parametrize("scheme", ["int8", "int8_weight"])
def test_a_quantized_searcher_streams_from_the_quantized_copy_of_each_loaded_version(tiny_model, tiny_tokenizer,
                                                                                      arith_task, scheme):
    """search.quantize re-quantizes every loaded version (in place, or into a new model object for some schemes):
    the stream samples from the quantized model of the version in force."""
    cfg = dataclasses.replace(CFG, weight_update="in_flight")
    sampler = HFSampler(copy.deepcopy(tiny_model), tiny_tokenizer, quantize=scheme)
    searcher = Searcher(sampler, copy.deepcopy(tiny_model), tiny_tokenizer, arith_task, cfg, seed=0)
    assert searcher.stream.engine.model is sampler.sampling
    sync = Publisher(searcher, tiny_model, every=4)
    torch.manual_seed(4)
    groups = [g for _ in range(2) for g in searcher.step(sync)]
    assert sync.loads >= 1 and groups
    assert searcher.stream.engine.model is sampler.sampling
