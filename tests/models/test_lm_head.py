"""The chunked LM head: its log-probs and gradients against a direct log-softmax, for the linear head's own backward
and for checkpointed chunks; how many [chunk, V] tensors each keeps alive at once (what `tba plan` models); the
in-place logsumexp against torch's."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tba.models.lm_head import _logsumexp_, token_logprobs

V, H = 997, 16


def test_the_in_place_logsumexp_is_torchs_to_the_bit():
    x = torch.randn(7, V) * 5
    x[3] = -torch.inf  # a row of −∞: torch gives −∞, so must we
    x[4, :10] = torch.inf
    assert torch.equal(_logsumexp_(x.clone()), torch.logsumexp(x, -1))


def _head(bias: bool):
    torch.manual_seed(0)
    return torch.nn.Linear(H, V, bias=bias)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("checkpointed", [False, True], ids=["own_backward", "checkpointed"])
def test_chunked_log_probs_and_gradients_equal_a_direct_log_softmax(temperature, bias, checkpointed):
    head = _head(bias)
    hidden = torch.randn(50, H, requires_grad=True)
    targets = torch.randint(0, V, (50,))
    g = torch.randn(50)

    def grads(logp):
        head.zero_grad()
        hidden.grad = None
        (logp * g).sum().backward()
        return logp.detach(), [t.grad.clone() for t in (hidden, *head.parameters())]

    direct = torch.log_softmax(head(hidden) / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    forward = (lambda h: head(h)) if checkpointed else head.forward  # a lambda is not the Linear's own forward
    ours = token_logprobs(forward, hidden, targets, temperature, 7)  # 8 chunks, the last of 1 row
    (a, ga), (b, gb) = grads(ours), grads(direct)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def _most_alive(fn, rows: int) -> int:
    """The most tensors of `rows` × V float32 (separate storages) alive at once while fn() runs."""
    alive: set[int] = set()
    most = 0

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal most
            out = func(*args, **(kwargs or {}))
            for x in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(x, torch.Tensor) and x.dtype == torch.float32 and tuple(x.shape) == (rows, V):
                    ptr = x.untyped_storage().data_ptr()
                    if ptr not in alive:
                        alive.add(ptr)
                        weakref.finalize(x.untyped_storage(), alive.discard, ptr)
                    most = max(most, len(alive))
            return out

    with Watch():
        fn()
    return most


def test_the_linear_heads_own_backward_keeps_one_chunk_of_logits_alive_and_checkpointing_four():
    head, rows = _head(False), 8
    hidden = torch.randn(5 * rows, H, requires_grad=True)
    targets = torch.randint(0, V, (5 * rows,))

    def run(forward):
        return lambda: token_logprobs(forward, hidden, targets, 0.7, rows).sum().backward()

    assert _most_alive(run(head.forward), rows) == 1
    assert _most_alive(run(lambda h: head(h)), rows) <= 4
