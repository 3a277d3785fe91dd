"""The searcher: group shapes, annotations, versions after a weight load, and prompt sharding."""

import copy

import pytest
import torch

from tba.config.schema import SearchConfig
from tba.models.logprobs import shared_prompt_logprobs
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher
from tba.tasks.arith import ArithTask

CFG = SearchConfig(temperature=0.7, generations_per_prompt=4, prompts_per_batch=3, max_new_tokens=8)


def _searcher(model, tok, task, cfg=CFG, **kw):
    kw.setdefault("seed", 0)
    return Searcher(HFSampler(copy.deepcopy(model), tok), copy.deepcopy(model), tok, task, cfg, **kw)


def test_step_returns_one_group_of_s_annotated_samples_per_prompt(tiny_model, tiny_tokenizer, arith_task):
    searcher = _searcher(tiny_model, tiny_tokenizer, arith_task)
    torch.manual_seed(0)
    groups = searcher.step()
    assert len(groups) == CFG.prompts_per_batch
    assert len({g.prompt_id for g in groups}) == len(groups)
    for g in groups:
        prompt = arith_task.train[g.prompt_id]
        assert g.prompt_tokens == tiny_tokenizer(prompt.text)["input_ids"]
        assert len(g.samples) == CFG.generations_per_prompt
        for s in g.samples:
            assert 1 <= len(s.response) <= CFG.max_new_tokens
            assert len(s.ref_logprobs) == len(s.behaviour_logprobs) == len(s.response)
            assert s.version == searcher.version == 0
            assert s.reward in (0.0, 1.0)
            text = tiny_tokenizer.decode(s.response, skip_special_tokens=True)
            assert s.reward == arith_task.reward(prompt, text)
            # policy == reference here, so the reference log-probs are the behaviour log-probs
            torch.testing.assert_close(torch.tensor(s.ref_logprobs), torch.tensor(s.behaviour_logprobs),
                                       atol=1e-4, rtol=0)
    assert searcher.stats.samples_generated == CFG.prompts_per_batch * CFG.generations_per_prompt
    assert searcher.stats.tokens_generated == sum(len(s.response) for g in groups for s in g.samples)


def test_load_weights_sets_the_policy_and_the_version_of_new_samples(tiny_model, tiny_tokenizer, arith_task):
    searcher = _searcher(tiny_model, tiny_tokenizer, arith_task)
    newer = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in newer.parameters():
            p.add_(0.01)
    state = {k: v.clone() for k, v in newer.state_dict().items()}
    searcher.load_weights(state, version=3)
    assert searcher.version == 3
    for name, value in searcher.sampler.model.state_dict().items():
        assert torch.equal(value, state[name]), name
    for name, value in searcher.reference.state_dict().items():  # the reference is untouched
        assert torch.equal(value, tiny_model.state_dict()[name]), name
    groups = searcher.step()
    assert {s.version for g in groups for s in g.samples} == {3}


@pytest.fixture(scope="module")
def small_task():
    return ArithTask(digits=2, train_size=20, test_size=5)


def _visited(searcher, steps):
    return [g.prompt_id for _ in range(steps) for g in searcher.step()]


def test_a_shard_only_uses_its_round_robin_prompts_and_cycles_through_them(tiny_tokenizer, tiny_model, small_task):
    cfg = SearchConfig(generations_per_prompt=2, prompts_per_batch=3, max_new_tokens=2)
    odd = {p.id for p in small_task.train if p.id % 2 == 1}
    n = len(odd)
    searcher = _searcher(tiny_model, tiny_tokenizer, small_task, cfg, shard=1, num_shards=2)
    visited = _visited(searcher, steps=-(-2 * n // cfg.prompts_per_batch))  # at least two passes
    assert set(visited) == odd
    assert sorted(visited[:n]) == sorted(odd)  # one pass visits every shard prompt exactly once
    assert visited[n:2 * n] == visited[:n]  # and the next pass repeats the same permutation


def test_shards_partition_the_train_prompts(tiny_tokenizer, tiny_model, small_task):
    cfg = SearchConfig(generations_per_prompt=1, prompts_per_batch=len(small_task.train), max_new_tokens=1)
    seen = []
    for shard in range(3):
        searcher = _searcher(tiny_model, tiny_tokenizer, small_task, cfg, shard=shard, num_shards=3)
        ids = _visited(searcher, steps=1)  # prompts_per_batch ≥ shard size: the whole shard, once
        assert all(i % 3 == shard for i in ids) and len(ids) == len(set(ids))
        seen += ids
    assert sorted(seen) == [p.id for p in small_task.train]


def test_prompt_order_is_a_seeded_permutation(tiny_tokenizer, tiny_model, small_task):
    def order(seed):
        return _searcher(tiny_model, tiny_tokenizer, small_task, seed=seed)._order

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0) != sorted(order(0))  # not dataset order (§7.10)


def test_an_empty_shard_is_an_error(tiny_tokenizer, tiny_model, small_task):
    with pytest.raises(ValueError, match="owns no train prompts"):
        _searcher(tiny_model, tiny_tokenizer, small_task, shard=len(small_task.train),
                  num_shards=len(small_task.train) + 1)


def test_autocast_samples_and_scores_in_bfloat16(tiny_model, tiny_tokenizer, arith_task):
    """model.autocast: sampling and π_ref scoring run in bfloat16 — the reference log-probs of the same responses
    differ from float32's by its rounding only — and the searcher's models keep their float32 weights."""
    mixed = _searcher(tiny_model, tiny_tokenizer, arith_task, autocast="bfloat16")
    torch.manual_seed(0)
    groups = mixed.step()
    samples = [s for g in groups for s in g.samples]
    with torch.no_grad():
        exact = shared_prompt_logprobs(mixed.reference, [g.prompt_tokens for g in groups],
                                       [s.response for s in samples], CFG.generations_per_prompt, CFG.temperature,
                                       tiny_tokenizer.pad_token_id)
    got = torch.tensor([lp for s in samples for lp in s.ref_logprobs])
    want = torch.cat([exact[i, :len(s.response)] for i, s in enumerate(samples)])
    assert not torch.equal(got, want)
    torch.testing.assert_close(got, want, atol=0.1, rtol=0)
    assert all(p.dtype == torch.float32 for p in mixed.reference.parameters())
    assert all(p.dtype == torch.float32 for p in mixed.sampler.model.parameters())
