import math

import pytest
import torch
from toys import token_logp, token_toy

from tba.algorithm.objectives.dr_grpo import dr_grpo_loss
from tba.algorithm.objectives.groups import group_mean

NAN, INF = float("nan"), float("inf")


def _hand_example():
    # One group (id 4), rewards (1, 0) → r̄ = 0.5, A = (+0.5, −0.5). ε = 0.2, T_max = 4, N = 2.
    # seq 0, ρ = (1.5, 1.0, 0.5), A = +0.5:
    #   t0: min(0.75, 1.2·0.5 = 0.6)  = 0.6  (clipped → no grad)
    #   t1: min(0.5, 0.5)             = 0.5  (ρ = 1 inside the band → grad ρA = 0.5)
    #   t2: min(0.25, 0.8·0.5 = 0.4)  = 0.25 (unclipped → grad ρA = 0.25)           Σ = 1.35
    # seq 1, ρ = (0.5, 1.3, pad), A = −0.5:
    #   t0: min(−0.25, 0.8·−0.5 = −0.4) = −0.4  (clipped → no grad)
    #   t1: min(−0.65, 1.2·−0.5 = −0.6) = −0.65 (unclipped, pessimistic side → grad ρA = −0.65)   Σ = −1.05
    # L = −(1/2)·(1.35 − 1.05)/4 = −0.0375 ; ∂L/∂logp = −(1/8)·(grad of s)
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-1.5, -0.7, 0.0]], requires_grad=True)
    ratio = torch.tensor([[1.5, 1.0, 0.5], [0.5, 1.3, 1.0]])
    behaviour = logp.detach() - ratio.log()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logp, behaviour, mask, torch.tensor([1.0, 0.0]), torch.tensor([4, 4])


def test_hand_computed_clipped_surrogate():
    logp, behaviour, mask, reward, group = _hand_example()
    ref = logp.detach().clone()
    ref[1, 2] = 123.0  # garbage on padding
    loss = dr_grpo_loss(logp, behaviour, ref, mask, reward, group, max_tokens=4)
    assert loss.item() == pytest.approx(-0.0375)
    loss.backward()
    expected = [[0.0, -0.5 / 8, -0.25 / 8], [0.0, 0.65 / 8, 0.0]]  # [[0, −0.0625, −0.03125], [0, 0.08125, 0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected))


def test_hand_computed_k3_kl_term():
    # d = ref − logp: ln2 at (0,0) → k3 = 2 − ln2 − 1 = 1 − ln2 ; −ln2 at (1,1) → k3 = 0.5 + ln2 − 1 = ln2 − 0.5
    # KL term = 0.1 · (1/2)·((1 − ln2) + (ln2 − 0.5))/4 = 0.1 · 0.5/8 = 0.00625 → L = −0.0375 + 0.00625 = −0.03125
    # ∂k3/∂logp = 1 − e^d: −1 at (0,0), +0.5 at (1,1); times 0.1/(2·4) = 0.0125 → −0.0125, +0.00625
    logp, behaviour, mask, reward, group = _hand_example()
    ref = logp.detach().clone()
    ref[0, 0] += math.log(2.0)
    ref[1, 1] -= math.log(2.0)
    ref[1, 2] = -INF  # garbage on padding
    loss = dr_grpo_loss(logp, behaviour, ref, mask, reward, group, kl_coef=0.1, max_tokens=4)
    assert loss.item() == pytest.approx(-0.03125)
    loss.backward()
    expected = [[-0.0125, -0.0625, -0.03125], [0.0, 0.08125 + 0.00625, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected))


def test_divides_by_max_tokens_not_length():
    # on-policy (ρ = 1): L = −(1/N) Σ_i A_i·len_i / T_max. Lengths 1 and 3, A = (+0.5, −0.5), T_max = 10:
    # L = −(1/2)·(0.5·1 − 0.5·3)/10 = 0.05   (a per-length mean would give 0)
    logp = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss = dr_grpo_loss(logp, logp, logp, mask, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), max_tokens=10)
    assert loss.item() == pytest.approx(0.05)




def test_invariant_to_sequence_order_and_group_labels():
    feats, theta, behaviour, ref, mask, reward, group = token_toy(seed=1)
    perm = torch.randperm(len(group), generator=torch.Generator().manual_seed(3))
    relabel = torch.tensor([10, 4, 99])[group]  # arbitrary, non-contiguous ids
    kw = dict(kl_coef=0.05, max_tokens=8)
    loss_a = dr_grpo_loss(token_logp(feats, theta), behaviour, ref, mask, reward, group, **kw)
    loss_b = dr_grpo_loss(token_logp(feats[perm], theta), behaviour[perm], ref[perm], mask[perm], reward[perm],
                          relabel[perm], **kw)
    (ga,) = torch.autograd.grad(loss_a, theta)
    (gb,) = torch.autograd.grad(loss_b, theta)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(ga, gb)


def test_invariant_to_extra_padding_with_garbage():
    feats, theta, behaviour, ref, mask, reward, group = token_toy(seed=2)
    n = len(group)
    garbage = torch.tensor([NAN, INF, -INF, 1e4]).expand(n, 4)
    kw = dict(kl_coef=0.05, max_tokens=8)
    loss_a = dr_grpo_loss(token_logp(feats, theta), behaviour, ref, mask, reward, group, **kw)
    loss_b = dr_grpo_loss(torch.cat([token_logp(feats, theta), garbage], 1), torch.cat([behaviour, -garbage], 1),
                          torch.cat([ref, garbage.flip(1)], 1), torch.cat([mask, torch.zeros(n, 4)], 1),
                          reward, group, **kw)
    (ga,) = torch.autograd.grad(loss_a, theta)
    (gb,) = torch.autograd.grad(loss_b, theta)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(ga, gb)


def test_on_policy_gradient_is_mean_baseline_reinforce():
    # ρ = 1 → clip inactive → ∇L = −(1/(N·T_max)) Σ_i A_i Σ_t m ∇log π_θ(y_it), A_i = r_i − r̄_g (no std)
    feats, theta, _, ref, mask, reward, group = token_toy(seed=4)
    logp = token_logp(feats, theta)
    (grad,) = torch.autograd.grad(dr_grpo_loss(logp, logp.detach(), ref, mask, reward, group, max_tokens=8), theta,
                                  retain_graph=True)
    adv = reward - group_mean(reward, group)
    (expected,) = torch.autograd.grad(-(adv * (logp * mask).sum(1)).mean() / 8, theta)
    torch.testing.assert_close(grad, expected)


def test_rejects_bad_shapes():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        dr_grpo_loss(x, x, x, x[:, :2], torch.zeros(2), torch.zeros(2, dtype=torch.long), max_tokens=4)
    with pytest.raises(ValueError):
        dr_grpo_loss(x, x, x, x, torch.zeros(3), torch.zeros(2, dtype=torch.long), max_tokens=4)
