"""Sampling and scoring: EOS cuts, result order, and the searcher/trainer log-prob consistency.

The randomly initialised tiny model is nearly uniform over ~20 tokens, so at T = 1 about half of 16-token
samples hit EOS: both the EOS-terminated and the truncated cases occur under a fixed seed.
"""

import pytest
import torch

from tba.generation import generate, response_logprobs

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
