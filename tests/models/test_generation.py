"""Sampling and scoring: EOS cuts, result order, and the searcher/trainer log-prob consistency; the decode loop
against transformers on every model family the recipes use.

The randomly initialised tiny model is nearly uniform over ~20 tokens, so at T = 1 about half of 16-token
samples hit EOS: both the EOS-terminated and the truncated cases occur under a fixed seed.
"""

import pytest
import torch

from tba.models.generation import generate, response_logprobs

TEXTS = ["1+2=", "57+68=", "99+1=", "40+33="]  # different lengths: left padding is exercised


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer(t)["input_ids"] for t in TEXTS]


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


def test_response_logprobs_match_a_direct_log_softmax(tiny_model, prompts):
    prompt, response = prompts[1], [5, 9, 2]
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp, mask = response_logprobs(tiny_model, [prompt], [response], 0.7, pad_id=0)
        full = torch.log_softmax(tiny_model(ids).logits[0] / 0.7, -1)  # [L, V]
    expected = torch.stack([full[len(prompt) - 1 + t, tok] for t, tok in enumerate(response)])
    torch.testing.assert_close(logp[0], expected, atol=1e-5, rtol=0)
    assert mask.tolist() == [[1.0, 1.0, 1.0]]


def test_response_logprobs_do_not_depend_on_batch_composition(tiny_model, tiny_tokenizer, prompts):
    pad = tiny_tokenizer.pad_token_id
    short_prompt, short_response = prompts[0], [7, 3]
    with torch.no_grad():
        alone, _ = response_logprobs(tiny_model, [short_prompt], [short_response], 0.7, pad)
        batched, mask = response_logprobs(
            tiny_model, [prompts[3], short_prompt, prompts[1]],
            [[4, 4, 5, 6, 7, 8, 9], short_response, [3, 2]], 0.7, pad)
    assert batched.shape == (3, 7)
    torch.testing.assert_close(batched[1, :2], alone[0], atol=1e-5, rtol=0)
    assert mask[1].tolist() == [1, 1, 0, 0, 0, 0, 0] and mask[2].tolist() == [1, 1, 0, 0, 0, 0, 0]
    assert torch.all(batched[mask == 0] == 0)  # padded positions hold exactly 0


def test_logits_are_computed_only_from_the_earliest_response_on_and_still_match(tiny_model, prompts):
    """response_logits asks the model for the last L − (shortest prompt − 1) positions only; rows whose prompts
    are longer must still read the right positions."""
    batch = [(list(range(3, 6)), [7, 8]), (list(range(3, 12)), [9, 4, 5]), (list(range(3, 8)), [6])]
    assert len({len(p) for p, _ in batch}) == 3
    with torch.no_grad():
        together, _ = response_logprobs(tiny_model, [p for p, _ in batch], [r for _, r in batch], 1.0, pad_id=0)
        for i, (p, r) in enumerate(batch):
            full = torch.log_softmax(tiny_model(torch.tensor([p + r])).logits[0], -1)
            expected = torch.stack([full[len(p) - 1 + t, tok] for t, tok in enumerate(r)])
            torch.testing.assert_close(together[i, :len(r)], expected, atol=1e-5, rtol=0)


# ---- the decode loop across model families --------------------------------------------------------------------
# The loop drives the model's forward itself (prefill once, slot KV cache, GQA decode attention, dropped finished
# rows), so each family the recipes use is checked against transformers: Llama (also grouped-query, as SmolLM2),
# GPT-2 (red-teaming), GPT-NeoX (TL;DR / Pythia) and a PEFT LoRA wrapper with non-zero adapters.

def _family(name: str, tok):
    from transformers import AutoModelForCausalLM, GPT2Config, GPTNeoXConfig, LlamaConfig

    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    small = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=128,
                 initializer_range=0.3)  # sharp enough that greedy never meets a near-tie
    config = {
        "llama-gqa": lambda: LlamaConfig(**ids, **small, num_attention_heads=4, num_key_value_heads=2),
        "gpt2": lambda: GPT2Config(**ids, n_embd=32, n_layer=2, n_head=2, n_positions=128, initializer_range=0.3),
        "gpt-neox": lambda: GPTNeoXConfig(**ids, **small, num_attention_heads=2),
    }
    torch.manual_seed(0)
    if name == "lora":
        from peft import LoraConfig, get_peft_model

        base = AutoModelForCausalLM.from_config(config["llama-gqa"]())
        lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
        return get_peft_model(base, lora).eval()
    return AutoModelForCausalLM.from_config(config[name]()).eval()


FAMILIES = ["llama-gqa", "gpt2", "gpt-neox", "lora"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tiny_tokenizer):
    return _family(request.param, tiny_tokenizer)


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


@pytest.fixture(params=["one forward", "length buckets"])
def buckets(request, monkeypatch):
    """grouped_logprobs as it runs on these short responses (one forward), and split into length buckets as on
    long-tailed ones (no cost per forward, so every distinct length its own bucket)."""
    from tba.models import generation

    if request.param == "length buckets":
        real = generation.length_buckets

        def split(lengths, overhead):
            runs = real(lengths, 0)
            assert len(runs) > 1
            return runs
        monkeypatch.setattr(generation, "length_buckets", split)
    return request.param


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_scoring_equals_the_full_forward(family_model, tiny_tokenizer, prompts, temperature, buckets):
    """π_ref scores S samples per prompt with the prompt run once (its cache repeated): the same log-probs as
    scoring prompt + response per sample, on every family; responses of different lengths, one of a single token."""
    from tba.models.generation import shared_prompt_logprobs

    s, pad = 3, tiny_tokenizer.pad_token_id
    torch.manual_seed(0)
    out = generate(family_model, prompts, num_samples=s, temperature=1.0, max_new_tokens=10,
                   eos_id=tiny_tokenizer.eos_token_id, pad_id=pad)
    responses = [r for r, _ in out]
    responses[1] = responses[1][:1]
    flat = [p for p in prompts for _ in range(s)]
    with torch.no_grad():
        full, mask = response_logprobs(family_model, flat, responses, temperature, pad)
    shared = shared_prompt_logprobs(family_model, prompts, responses, s, temperature, pad)
    assert shared.shape == full.shape
    torch.testing.assert_close(shared * mask, full, atol=2e-5, rtol=0)


def test_grouped_logprobs_give_the_full_forwards_gradients(family_model, tiny_tokenizer, prompts, buckets):
    """The trainer's shared-prompt forward (trainer.shared_prompts): a different number of responses per prompt,
    the same log-probs and the same gradient of every weight as the forward over prompt + response per sample."""
    from tba.models.generation import grouped_logprobs

    pad, counts = tiny_tokenizer.pad_token_id, [3, 1, 2][:len(prompts)]
    torch.manual_seed(0)
    out = generate(family_model, prompts, num_samples=3, temperature=1.0, max_new_tokens=10,
                   eos_id=tiny_tokenizer.eos_token_id, pad_id=pad)
    picks = [i * 3 + j for i, c in enumerate(counts) for j in range(c)]
    responses = [out[k][0] for k in picks]
    responses[0] = responses[0][:1]
    flat = [p for p, c in zip(prompts, counts, strict=False) for _ in range(c)]
    weights = torch.linspace(-1, 1, len(responses))

    def grads(logp_fn):
        family_model.zero_grad()
        logp = logp_fn()
        (logp.sum(-1) * weights).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in family_model.named_parameters() if p.grad is not None}

    full, full_grads = grads(lambda: response_logprobs(family_model, flat, responses, 0.7, pad)[0])
    grouped, grouped_grads = grads(lambda: grouped_logprobs(family_model, prompts[:len(counts)], responses, counts,
                                                            0.7, pad)[0])
    family_model.zero_grad()
    torch.testing.assert_close(grouped, full, atol=2e-5, rtol=0)
    assert grouped_grads.keys() == full_grads.keys() and full_grads
    for name, g in full_grads.items():
        torch.testing.assert_close(grouped_grads[name], g, atol=1e-4, rtol=1e-3, msg=name)


def test_grouped_logprobs_refuse_counts_that_do_not_add_up(tiny_model, tiny_tokenizer):
    from tba.models.generation import grouped_logprobs

    with pytest.raises(ValueError, match="counts add up to 3, but there are 2 responses"):
        grouped_logprobs(tiny_model, [[5, 6]], [[7], [8]], [3], 1.0, tiny_tokenizer.pad_token_id)
