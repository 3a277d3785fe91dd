"""Quantized searchers (search.quantize): the sampler generates with a quantized copy and reports that
distribution's log-probs; the trainer and the reference stay in full precision; each load is re-quantized, its
cost counted."""

import copy
import importlib.util

import pytest
import torch

from tba.config.schema import LoraConfig
from tba.errors import ConfigError
from tba.models import apply_lora, load_synced, synced_tensors
from tba.models.logprobs import response_logprobs
from tba.rollout.quantize import QuantizedModel, check, quantized_copy
from tba.rollout.samplers.hf import HFSampler

T = 0.7


def prompts(tokenizer, n=4):
    return [tokenizer(f"{10 + i}+{20 + 3 * i}=")["input_ids"] for i in range(n)]


def perturbed(model, scale=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in synced_tensors(model).items()}


def sample_and_score(model, tokenizer, scheme):
    """(behaviour log-probs the sampler reported, the same tokens rescored by its quantized model, by the
    full-precision model), flattened over every response token."""
    sampler = HFSampler(model, tokenizer, scheme)
    torch.manual_seed(0)
    out = sampler.generate(prompts(tokenizer), num_samples=3, temperature=T, top_p=1.0, max_new_tokens=6)
    flat = [p for p in prompts(tokenizer) for _ in range(3)]
    responses = [r for r, _ in out]
    quantized, _ = response_logprobs(sampler.sampling, flat, responses, T, tokenizer.pad_token_id)  # [N, R]
    full, _ = response_logprobs(model, flat, responses, T, tokenizer.pad_token_id)
    behaviour = torch.tensor([lp for _, lps in out for lp in lps])
    return (behaviour, torch.cat([quantized[i, :len(r)] for i, r in enumerate(responses)]),
            torch.cat([full[i, :len(r)] for i, r in enumerate(responses)]).detach())


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_the_quantized_sampler_reports_the_logprobs_of_the_distribution_it_sampled(tiny_model, tiny_tokenizer):
    """Weight-only int8: the quantized model's log-probs are those of a fixed model, so rescoring its samples
    gives them back exactly; they are not the full-precision model's."""
    model = copy.deepcopy(tiny_model)
    behaviour, quantized, full = sample_and_score(model, tiny_tokenizer, "int8_weight")
    assert torch.allclose(behaviour, quantized, atol=1e-4)
    assert (behaviour - full).abs().max() > 1e-3
    assert all(p.dtype == torch.float32 for p in model.parameters())  # what the trainer trains: untouched


def test_dynamic_int8_samples_differ_from_full_precision_while_the_policy_stays_full_precision(tiny_model,
                                                                                              tiny_tokenizer):
    """Dynamic int8 quantizes activations with scales of the tensors at hand, so the log-probs reported while
    decoding can only be approximated by rescoring; they differ from the full-precision model's as much."""
    model = copy.deepcopy(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    behaviour, quantized, full = sample_and_score(model, tiny_tokenizer, "int8")
    assert 1e-4 < (behaviour - full).abs().mean() < 0.5 and (behaviour - quantized).abs().mean() < 0.05
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_load_is_quantized_again_in_place_and_equals_a_fresh_quantization(tiny_model, tiny_tokenizer):
    model = copy.deepcopy(tiny_model)
    sampler = HFSampler(model, tiny_tokenizer, "int8")
    before, spent = sampler.sampling, sampler.quantize_s
    sampler.load_weights(perturbed(model), version=1)
    assert sampler.sampling is before and sampler.quantize_s > spent  # refreshed in place; the time counted
    x = torch.tensor([prompts(tiny_tokenizer)[0]])
    assert torch.equal(sampler.sampling(x).logits, quantized_copy(model, "int8")(x).logits)


def test_cpu_int8_keeps_the_mlp_down_projections_in_full_precision(tiny_model):
    """Their inputs hold the MLP's outlier activations, which one int8 scale per tensor cannot carry
    (tba.rollout.quantize):
    every other linear layer, the head included, is int8 with one scale per output channel."""
    q = quantized_copy(tiny_model, "int8")
    dynamic = torch.ao.nn.quantized.dynamic.Linear
    kinds = {n: type(m) for n, m in q.named_modules() if isinstance(m, torch.nn.Linear | dynamic)}
    assert kinds and all((k is torch.nn.Linear) == n.endswith("down_proj") for n, k in kinds.items())
    assert kinds["lm_head"] is dynamic
    assert q.lm_head.weight().qscheme() == torch.per_channel_affine


def test_a_lora_policy_is_merged_into_the_quantized_copy(tiny_model, tiny_tokenizer):
    policy = apply_lora(copy.deepcopy(tiny_model), LoraConfig(enabled=True, r=4, alpha=8))
    adapters = {k: v + 0.1 if "lora_B" in k else v for k, v in synced_tensors(policy).items()}
    load_synced(policy, adapters)  # B ≠ 0: the adapters change the model
    q = QuantizedModel(policy, "int8")
    x = torch.tensor([prompts(tiny_tokenizer)[0]])
    with torch.no_grad():
        merged = policy(x).logits
        base = tiny_model(x).logits
    got = q.quantized(x).logits
    assert (got - merged).abs().mean() < (got - base).abs().mean()  # the adapters' effect is in the copy
    q.refresh()  # no in-place path for LoRA: a fresh copy, still merged
    assert torch.allclose(q.quantized(x).logits, got, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_int8_weight_only_through_torchao(tiny_model, tiny_tokenizer):
    sampler = HFSampler(copy.deepcopy(tiny_model), tiny_tokenizer, "int8_weight")
    out = sampler.generate(prompts(tiny_tokenizer, 2), num_samples=2, temperature=T, top_p=1.0, max_new_tokens=4)
    assert len(out) == 4 and all(len(lps) == len(r) for r, lps in out)
    sampler.load_weights(perturbed(tiny_model), version=1)  # a fresh torchao copy per load


def test_what_cannot_run_here_is_refused_before_a_model_is_copied():
    with pytest.raises(ConfigError, match="fp8 needs a CUDA GPU of compute capability ≥ 8.9"):
        check("fp8", torch.device("cpu"))
    with pytest.raises(ConfigError, match="must be one of int8, int8_weight, fp8"):
        check("int4", torch.device("cpu"))
