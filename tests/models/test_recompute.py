"""Activation checkpointing: the same module tree and state dict, the same gradients, fewer tensors kept for backward,
and nothing changed without gradients."""

import copy

import pytest
import torch
from families import family

from tba.models.logprobs import response_logprobs
from tba.models.recompute import decoder_layers, recompute_layers


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while fn() runs (outside checkpointed regions)."""
    total = 0

    def pack(x):
        nonlocal total
        total += x.numel() * x.element_size()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fn()
    return total, out


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "gpt-neox", "lora"])
def test_recomputed_layers_give_the_same_gradients_and_keep_less(tiny_tokenizer, name):
    model = family(name, tiny_tokenizer)
    recomputed = copy.deepcopy(model)
    recompute_layers(recomputed)
    recompute_layers(recomputed)  # a second call wraps nothing twice
    assert recomputed.state_dict().keys() == model.state_dict().keys()
    assert len(decoder_layers(model)) == 2
    prompts, responses = [[5, 6, 7, 8]] * 3, [[9, 10, 11], [12, 13], [14]]

    def grads(m):
        kept, logp = _saved_bytes(lambda: response_logprobs(m, prompts, responses, 0.7, tiny_tokenizer.pad_token_id)[0])
        m.zero_grad()
        logp.sum().backward()
        return kept, logp.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    (kept, logp, g), (kept0, logp0, g0) = grads(recomputed), grads(model)
    torch.testing.assert_close(logp, logp0, atol=1e-6, rtol=0)
    assert g.keys() == g0.keys() and g0
    for k in g0:
        torch.testing.assert_close(g[k], g0[k], atol=1e-6, rtol=1e-5, msg=k)
    assert kept < kept0 / 2  # the layers' activations are recomputed, not kept


def test_without_gradients_a_recomputed_layer_runs_as_it_is(tiny_tokenizer):
    model = family("llama-gqa", tiny_tokenizer)
    recompute_layers(model)
    with torch.no_grad():
        logp = response_logprobs(model, [[5, 6, 7]], [[8, 9]], 1.0, tiny_tokenizer.pad_token_id)[0]
    assert logp.grad_fn is None and logp.shape == (1, 2)
