"""Sampling and scoring: EOS cuts, result order, and the searcher/trainer log-prob consistency; the decode loop
against transformers on every model family the recipes use.

The randomly initialised tiny model is nearly uniform over ~20 tokens, so at T = 1 about half of 16-token
samples hit EOS: both the EOS-terminated and the truncated cases occur under a fixed seed.
"""

import pytest
import torch

from tba.models.generation import generate
from tba.models.logprobs import response_logprobs


def _sample(model, tok, prompts, *, num_samples, temperature=1.0, max_new_tokens=16, seed=0):
    torch.manual_seed(seed)
    return generate(model, prompts, num_samples=num_samples, temperature=temperature,
                    max_new_tokens=max_new_tokens, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)


def test_responses_are_cut_after_the_first_eos_and_bounded(tiny_model, tiny_tokenizer, prompts):
    eos = tiny_tokenizer.eos_token_id
    out = _sample(tiny_model, tiny_tokenizer, prompts, num_samples=6, max_new_tokens=16)
    ended = [r for r, _ in out if r[-1] == eos]
    truncated = [r for r, _ in out if r[-1] != eos]
    assert ended and truncated  # both cases are exercised
    for response, behaviour in out:
        assert 1 <= len(response) <= 16
        assert eos not in response[:-1]  # EOS, if any, is the last token (and it is kept)
        assert len(behaviour) == len(response)
    assert all(len(r) == 16 for r in truncated)  # no EOS: generation ran to max_new_tokens


def test_num_samples_returns_prompt_major_results(tiny_model, tiny_tokenizer, prompts):
    s = 3
    out = _sample(tiny_model, tiny_tokenizer, prompts, num_samples=s)
    assert len(out) == len(prompts) * s
    responses = [r for r, _ in out]
    behaviour = [b for _, b in out]

    def max_gap(flat_prompts):
        logp, _ = response_logprobs(tiny_model, flat_prompts, responses, 1.0, tiny_tokenizer.pad_token_id)
        return max((logp[i, : len(r)] - torch.tensor(b)).abs().max().item()
                   for i, (r, b) in enumerate(zip(responses, behaviour, strict=True)))

    prompt_major = [p for p in prompts for _ in range(s)]
    interleaved = [prompts[i % len(prompts)] for i in range(len(out))]
    assert max_gap(prompt_major) < 1e-4
    assert max_gap(interleaved) > 1e-2  # the check above would notice another order


def test_greedy_is_deterministic_and_returns_no_logprobs(tiny_model, tiny_tokenizer, prompts):
    kw = dict(greedy=True, max_new_tokens=8, eos_id=tiny_tokenizer.eos_token_id, pad_id=tiny_tokenizer.pad_token_id)
    torch.manual_seed(0)
    first = generate(tiny_model, prompts, **kw)
    torch.manual_seed(1)
    second = generate(tiny_model, prompts, **kw)
    assert first == second
    assert len(first) == len(prompts) and all(lp == [] for _, lp in first)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_behaviour_logprobs_equal_trainer_logprobs_of_the_same_responses(
        tiny_model, tiny_tokenizer, prompts, temperature):
    # The searcher's temperature-scaled log-probs (from generate's scores, left-padded, KV cache) must be the
    # trainer's log π (a fresh right-padded forward, logits ÷ T) on the same sequences.
    s = 4
    out = _sample(tiny_model, tiny_tokenizer, prompts, num_samples=s, temperature=temperature)
    responses = [r for r, _ in out]
    flat = [p for p in prompts for _ in range(s)]
    logp, mask = response_logprobs(tiny_model, flat, responses, temperature, tiny_tokenizer.pad_token_id)
    for i, (response, behaviour) in enumerate(out):
        torch.testing.assert_close(logp[i, : len(response)], torch.tensor(behaviour), atol=1e-4, rtol=0)
    assert torch.equal(mask.sum(-1), torch.tensor([float(len(r)) for r in responses]))


# ---- the decode loop across model families --------------------------------------------------------------------
# The loop drives the model's forward itself (prefill once, slot KV cache, GQA decode attention, dropped finished
# rows), so each family the recipes use is checked against transformers: Llama (also grouped-query, as SmolLM2),
# GPT-2 (red-teaming), GPT-NeoX (TL;DR / Pythia) and a PEFT LoRA wrapper with non-zero adapters.

@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_every_family_samples_with_the_trainers_logprobs(family_model, tiny_tokenizer, prompts, top_p):
    s, t, pad = 5, 0.7, tiny_tokenizer.pad_token_id
    torch.manual_seed(0)
    out = generate(family_model, prompts, num_samples=s, temperature=t, top_p=top_p, max_new_tokens=12,
                   eos_id=tiny_tokenizer.eos_token_id, pad_id=pad)
    flat = [p for p in prompts for _ in range(s)]
    logp, _ = response_logprobs(family_model, flat, [r for r, _ in out], t, pad)
    for i, (response, behaviour) in enumerate(out):
        assert 1 <= len(response) <= 12 and len(behaviour) == len(response)
        if top_p == 1.0:  # top-p renormalises, so only the unfiltered case equals the trainer's log π
            torch.testing.assert_close(torch.tensor(behaviour), logp[i, : len(response)], atol=1e-4, rtol=0)
        else:  # ≥ the unfiltered log-prob: the same p divided by a kept mass ≤ 1
            assert (torch.tensor(behaviour) >= logp[i, : len(response)] - 1e-4).all()
    assert family_model.config._attn_implementation == "sdpa"  # the decode-time switch was undone


def test_every_family_decodes_greedy_as_transformers_generate(family_model, tiny_tokenizer, prompts):
    from tba.models.generation import _pad

    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    ours = generate(family_model, prompts, greedy=True, max_new_tokens=10, eos_id=eos, pad_id=pad)
    ids, mask = _pad(prompts, pad, left=True)
    with torch.no_grad():
        theirs = family_model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10,
                                       eos_token_id=eos, pad_token_id=pad)[:, ids.shape[1]:].tolist()
    for (response, logp), row in zip(ours, theirs, strict=True):
        n = row.index(eos) + 1 if eos in row else len(row)
        assert response == row[:n] and logp == []


def test_top_p_keeps_transformers_nucleus_and_renormalises(tiny_model, tiny_tokenizer, prompts):
    """Each behaviour log-prob equals log_softmax of HF's TopPLogitsWarper output (logits ÷ T, then top-p) at
    that position, so the sampled token was inside the nucleus and p was renormalised over it."""
    from transformers.generation.logits_process import TopPLogitsWarper

    t, top_p, pad = 0.7, 0.6, tiny_tokenizer.pad_token_id
    torch.manual_seed(0)
    out = generate(tiny_model, prompts, num_samples=4, temperature=t, top_p=top_p, max_new_tokens=8,
                   eos_id=tiny_tokenizer.eos_token_id, pad_id=pad)
    warper = TopPLogitsWarper(top_p)
    with torch.no_grad():
        for i, (response, behaviour) in enumerate(out):
            prompt = prompts[i // 4]
            logits = tiny_model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1] / t  # [R, V]
            expected = torch.log_softmax(warper(None, logits), -1).gather(-1, torch.tensor(response)[:, None])
            torch.testing.assert_close(torch.tensor(behaviour), expected.squeeze(-1), atol=1e-4, rtol=0)


def test_sampling_draws_from_softmax_of_logits_over_t_with_and_without_top_p():
    from tba.models.generation import _sample as draw

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0]).repeat(40_000, 1)  # 40k independent draws
    p = torch.softmax(logits[0] / 0.7, -1)
    torch.manual_seed(0)
    token, logp = draw(logits, 0.7, 1.0, greedy=False)
    torch.testing.assert_close(torch.bincount(token, minlength=5) / len(token), p, atol=0.01, rtol=0)
    torch.testing.assert_close(logp, p.log()[token])
    # top-p 0.8 keeps the smallest prefix (in descending p) whose mass reaches 0.8, here tokens 0 and 1
    assert p[0] < 0.8 <= p[:2].sum()
    token, logp = draw(logits, 0.7, 0.8, greedy=False)
    kept = torch.cat([p[:2] / p[:2].sum(), torch.zeros(3)])
    torch.testing.assert_close(torch.bincount(token, minlength=5) / len(token), kept, atol=0.01, rtol=0)
    torch.testing.assert_close(logp, kept.log()[token])


def test_sampling_is_reproducible_under_a_fixed_seed(tiny_model, tiny_tokenizer, prompts):
    first = _sample(tiny_model, tiny_tokenizer, prompts, num_samples=3, seed=7)
    assert _sample(tiny_model, tiny_tokenizer, prompts, num_samples=3, seed=7) == first
    assert _sample(tiny_model, tiny_tokenizer, prompts, num_samples=3, seed=8) != first


def test_the_decode_loop_passes_the_cache_under_the_name_transformers_expects(tiny_model, tiny_tokenizer, prompts,
                                                                            capfd):
    """transformers 5.2x renamed `past_key_values` to `cache`; the old name printed a FutureWarning and a
    logger line on every decode step of a fresh clone's first run (5.17-5.19 know only the old name)."""
    import inspect
    import warnings

    from tba.models.generation import CACHE

    assert CACHE in inspect.signature(type(tiny_model).forward).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _sample(tiny_model, tiny_tokenizer, prompts, num_samples=2, max_new_tokens=4)
    assert "deprecated" not in capfd.readouterr().err
