"""Per-token log-probs of given responses: against a direct log-softmax, independent of the batch, the shared-prompt
forward against the full one; the chunked LM head against the plain [N, R, V] path on every family (log-probs and
gradients, fp32 and autocast, a head that is not a plain Linear, a model that transforms its logits after the head),
no tensor of V columns with more than a chunk of rows, and the full-vocabulary KL of evaluation."""

import copy

import pytest
import torch
from families import FAMILIES, family

from tba.models.generation import generate
from tba.models.logprobs import (
    CHUNK_TOKENS,
    grouped_logprobs,
    reference_kl,
    response_logits,
    response_logprobs,
    shared_prompt_logprobs,
)
from tba.models.recompute import recompute_layers


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


@pytest.fixture(params=["one forward", "length buckets"])
def buckets(request, monkeypatch):
    """grouped_logprobs as it runs on these short responses (one forward), and split into length buckets as on
    long-tailed ones (no cost per forward, so every distinct length its own bucket)."""
    from tba.models import logprobs

    if request.param == "length buckets":
        real = logprobs.length_buckets

        def split(lengths, overhead):
            runs = real(lengths, 0)
            assert len(runs) > 1
            return runs
        monkeypatch.setattr(logprobs, "length_buckets", split)
    return request.param


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_scoring_equals_the_full_forward(family_model, tiny_tokenizer, prompts, temperature, buckets):
    """π_ref scores S samples per prompt with the prompt run once (its cache repeated): the same log-probs as
    scoring prompt + response per sample, on every family; responses of different lengths, one of a single token."""
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
    with pytest.raises(ValueError, match="counts add up to 3, but there are 2 responses"):
        grouped_logprobs(tiny_model, [[5, 6]], [[7], [8]], [3], 1.0, tiny_tokenizer.pad_token_id)


# ---- the chunked LM head against the plain path ----------------------------------------------------------------
def _batch(model, tok, prompts, s=3, max_new_tokens=10):
    """S sampled responses per prompt of different lengths (one of a single token), prompt-major."""
    torch.manual_seed(0)
    out = generate(model, prompts, num_samples=s, temperature=1.0, max_new_tokens=max_new_tokens,
                   eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    responses = [r for r, _ in out]
    responses[1] = responses[1][:1]
    return [p for p in prompts for _ in range(s)], responses


def _with_grads(model, logp_fn):
    """(log-probs, every weight's gradient of a fixed weighting of their sums)."""
    model.zero_grad()
    logp = logp_fn()
    (logp.sum(-1) * torch.linspace(-1, 1, logp.shape[0])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return logp.detach(), grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def _assert_same(ours, plain, bound=1e-5):
    (logp, grads), (logp0, grads0) = ours, plain
    assert _relative(logp, logp0) <= bound
    assert grads.keys() == grads0.keys() and grads0
    worst = max(_relative(grads[k], g) for k, g in grads0.items())
    assert worst <= bound, worst


@pytest.fixture(scope="module", params=[*FAMILIES, "qwen2-tied"])
def any_family(request, tiny_tokenizer):
    return family(request.param, tiny_tokenizer)


@pytest.mark.parametrize("chunk", [3, CHUNK_TOKENS])
def test_chunked_logprobs_and_gradients_equal_the_plain_path(any_family, tiny_tokenizer, prompts, chunk):
    """Per sample and shared-prompt forwards, chunks of 3 positions (many chunks) and the default (one here):
    log-probs and every weight's gradient within 1e-5 (relative, float32) of the [N, R, V] path."""
    flat, responses = _batch(any_family, tiny_tokenizer, prompts)
    pad, t = tiny_tokenizer.pad_token_id, 0.7
    for fn in (lambda c: response_logprobs(any_family, flat, responses, t, pad, chunk_tokens=c)[0],
               lambda c: grouped_logprobs(any_family, prompts, responses, [3] * len(prompts), t, pad,
                                          chunk_tokens=c)[0]):
        _assert_same(_with_grads(any_family, lambda f=fn: f(chunk)), _with_grads(any_family, lambda f=fn: f(0)))


def test_chunked_logprobs_under_autocast_stay_close_to_the_plain_path(tiny_tokenizer, prompts):
    """model.autocast=bfloat16: the chunk's matmuls in bfloat16 in forward and in the recomputing backward."""
    model = family("llama-gqa", tiny_tokenizer)
    flat, responses = _batch(model, tiny_tokenizer, prompts)

    def run(chunk):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return response_logprobs(model, flat, responses, 0.7, tiny_tokenizer.pad_token_id, chunk_tokens=chunk)[0]

    _assert_same(_with_grads(model, lambda: run(4)), _with_grads(model, lambda: run(0)), bound=2e-2)


def test_a_head_that_is_not_a_plain_linear_is_chunked_under_checkpointing(tiny_tokenizer, prompts):
    """A LoRA'd LM head (peft's Linear, not nn.Linear): each chunk under torch.utils.checkpoint, the same numbers."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(family("llama-gqa", tiny_tokenizer),
                           LoraConfig(r=4, target_modules=["q_proj", "lm_head"], init_lora_weights=False)).eval()
    assert type(model.get_output_embeddings()) is not torch.nn.Linear
    flat, responses = _batch(model, tiny_tokenizer, prompts)

    def run(chunk):
        return response_logprobs(model, flat, responses, 0.7, tiny_tokenizer.pad_token_id, chunk_tokens=chunk)[0]

    _assert_same(_with_grads(model, lambda: run(3)), _with_grads(model, lambda: run(0)))


def test_a_model_that_transforms_its_logits_after_the_head_gets_the_plain_path(tiny_tokenizer, prompts, caplog):
    """Gemma-2 soft-caps its logits after the head (and has sliding-window layers: the shared-prompt forward keeps
    its own cache): the scorer's output would be soft-capped, so the log-probs come from full logits, with a word."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Gemma2Config(
        vocab_size=len(tiny_tokenizer), hidden_size=32, num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4, initializer_range=0.3,
        pad_token_id=tiny_tokenizer.pad_token_id, eos_token_id=tiny_tokenizer.eos_token_id)).eval()
    flat, responses = _batch(model, tiny_tokenizer, prompts)
    pad = tiny_tokenizer.pad_token_id
    with torch.no_grad():
        plain = response_logprobs(model, flat, responses, 0.7, pad, chunk_tokens=0)[0]
        chunked = response_logprobs(model, flat, responses, 0.7, pad)[0]
        shared = shared_prompt_logprobs(model, prompts, responses, 3, 0.7, pad)
    torch.testing.assert_close(chunked, plain, atol=1e-6, rtol=0)
    torch.testing.assert_close(shared, plain, atol=2e-5, rtol=0)
    assert "transforms its logits after the LM head" in caplog.text


def _widest_vocab_rows(fn, vocab: int) -> int:
    """The most rows of any tensor with `vocab` columns created while fn() runs (forward and backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Widest(TorchDispatchMode):
        rows = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for x in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[-1] == vocab:
                    Widest.rows = max(Widest.rows, x.numel() // vocab)
            return out

    with Widest():
        fn()
    return Widest.rows


@pytest.mark.parametrize("shared", [False, True], ids=["per_sample", "shared_prompt"])
def test_no_tensor_of_vocabulary_width_has_more_rows_than_a_chunk(tiny_tokenizer, prompts, shared):
    """Forward and backward: the plain path makes [N, R, V] tensors (N·R rows); the chunked one never more than a
    chunk's rows (the hidden size's, for the head weight's transposed view). V = 997 is no other dimension here."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    vocab, chunk, pad = 997, 8, tiny_tokenizer.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, eos_token_id=tiny_tokenizer.eos_token_id, pad_token_id=pad)).eval()
    flat, responses = _batch(model, tiny_tokenizer, prompts, s=4, max_new_tokens=16)
    positions = sum(len(r) for r in responses) - len(responses)  # the shared path's first tokens: [P, V] rows
    assert positions > 4 * 32  # well past a chunk and the hidden size (32)

    def run(c):
        if shared:
            logp = grouped_logprobs(model, prompts, responses, [4] * len(prompts), 0.7, pad, chunk_tokens=c)[0]
        else:
            logp = response_logprobs(model, flat, responses, 0.7, pad, chunk_tokens=c)[0]
        logp.sum().backward()

    assert _widest_vocab_rows(lambda: run(0), vocab) >= positions
    assert _widest_vocab_rows(lambda: run(chunk), vocab) <= 32


def test_reference_kl_chunked_equals_the_full_vocabulary_computation(family_model, tiny_tokenizer, prompts):
    """Evaluation's KL(π_ref ‖ π_θ) per token and log π_ref(y): chunked as the plain [N, R, V] computation."""
    reference = copy.deepcopy(family_model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    flat, responses = _batch(family_model, tiny_tokenizer, prompts)
    pad = tiny_tokenizer.pad_token_id
    kl, ref, mask = reference_kl(family_model, reference, flat, responses, pad, chunk_tokens=3)
    kl0, ref0, mask0 = reference_kl(family_model, reference, flat, responses, pad, chunk_tokens=0)
    assert torch.equal(mask, mask0) and kl0.sum() > 0
    torch.testing.assert_close(kl, kl0, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ref, ref0, atol=1e-6, rtol=1e-5)
    logits, targets, _ = response_logits(reference, flat, responses, pad)
    direct = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1) * mask
    torch.testing.assert_close(ref, direct, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "lora"])
def test_the_shared_prompt_forward_under_activation_checkpointing_gives_the_same_gradients(tiny_tokenizer, prompts,
                                                                                           name):
    """trainer.shared_prompts with trainer.activation_checkpointing: a recomputed layer sees the prompt's cache as
    the first forward did (the prompt alone, then prompt ⧺ responses, never extended), so the log-probs and every
    gradient equal the per-sample forward's without recomputation."""
    model = family(name, tiny_tokenizer)
    flat, responses = _batch(model, tiny_tokenizer, prompts)
    pad = tiny_tokenizer.pad_token_id
    plain = _with_grads(model, lambda: response_logprobs(model, flat, responses, 0.7, pad)[0])
    recomputed = copy.deepcopy(model)
    recompute_layers(recomputed)
    _assert_same(_with_grads(recomputed, lambda: grouped_logprobs(recomputed, prompts, responses, [3] * len(prompts),
                                                                   0.7, pad)[0]), plain, bound=1e-4)
