import pytest
import torch
from toys import token_logp, token_toy

from tba.algorithm.objectives.dr_grpo import dr_grpo_loss
from tba.algorithm.objectives.groups import group_mean
from tba.algorithm.objectives.tb import vargrad_tb_loss
from tba.algorithm.objectives.tba_prime import tba_prime_loss

NAN, INF = float("nan"), float("inf")


def test_hand_computed_example():
    # β = 0.5, T_max = 4, clip_ratio = 2, one group (id 3), N = 2.
    # seq 0: logp (−1, −2, pad), ref (−1, −1), ρ (3, 1) → w (2, 1), r = 1 ; KL̂_0 = 0 + (−1) = −1
    # seq 1: logp (−0.5, pad, pad), ref (−1.5), ρ (0.5) → w (0.5), r = 0 ; KL̂_1 = 1
    # r̄ = 0.5, KL̄ = 0 → A_0 = 0.5 − 0.5·(−1) = 1, A_1 = −0.5 − 0.5·1 = −1
    # Σ_t w·logp: seq 0 = 2·(−1) + 1·(−2) = −4 ; seq 1 = 0.5·(−0.5) = −0.25
    # L = −(1/2)·(1·(−4) + (−1)·(−0.25))/4 = −(1/2)(−3.75/4) = 0.46875
    # ∂L/∂logp_it = −A_i·w_it/(N·T_max) = −A_i·w_it/8 → seq 0: (−0.25, −0.125), seq 1: (0.0625)
    # (w and KL̂ detached: a live ratio would add w·logp = −2 at (0,1); a live KL̂ would add more)
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    ratio = torch.tensor([[3.0, 1.0, 1.0], [0.5, 1.0, 1.0]])
    behaviour = logp.detach() - ratio.log()
    ref = torch.tensor([[-1.0, -1.0, 55.0], [-1.5, NAN, -INF]])  # garbage on padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = tba_prime_loss(logp, behaviour, ref, mask, torch.tensor([1.0, 0.0]), torch.tensor([3, 3]), 0.5,
                          clip_ratio=2.0, max_tokens=4)
    assert loss.item() == pytest.approx(0.46875)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -0.125, 0.0], [0.0625, 0.0, 0.0]]))




def _grad(loss, theta):
    return torch.autograd.grad(loss, theta)[0]


def test_on_policy_beta0_gradient_equals_dr_grpo():
    # behaviour = logp → w = 1 and ρ = 1 (clip inactive); β = 0 → A = r − r̄ in both:
    # ∇L = −(1/(N·T_max)) Σ_i A_i Σ_t m ∇log π_θ for both objectives
    feats, theta, _, ref, mask, reward, group = token_toy(seed=1)
    on = token_logp(feats, theta).detach()
    g_prime = _grad(tba_prime_loss(token_logp(feats, theta), on, ref, mask, reward, group, 0.0, max_tokens=8), theta)
    g_dr = _grad(dr_grpo_loss(token_logp(feats, theta), on, ref, mask, reward, group, max_tokens=8), theta)
    torch.testing.assert_close(g_prime, g_dr)


def test_on_policy_gradient_equals_dr_grpo_on_kl_shaped_reward_and_scaled_tb():
    # A = (r − r̄) − β(KL̂ − KL̄) = r' − r̄' with r' = r − β·KL̂, so on-policy TBA′ = Dr. GRPO on r'.
    # And §2.3: ∇L_TB = (2/(Nβ)) Σ_i −A_i ∇log π_i, while ∇L_TBA′ = −(1/(N·T_max)) Σ_i A_i ∇log π_i
    #   → ∇L_TBA′ = β/(2·T_max) · ∇L_TB
    beta, t_max = 0.05, 8
    feats, theta, _, ref, mask, reward, group = token_toy(seed=2)
    on = token_logp(feats, theta).detach()
    logp = token_logp(feats, theta)
    g_prime = _grad(tba_prime_loss(logp, on, ref, mask, reward, group, beta, max_tokens=t_max), theta)
    kl = ((on - ref) * mask).sum(1)
    logp = token_logp(feats, theta)
    g_dr = _grad(dr_grpo_loss(logp, on, ref, mask, reward - beta * kl, group, max_tokens=t_max), theta)
    torch.testing.assert_close(g_prime, g_dr)
    seq_logp, seq_ref = (token_logp(feats, theta) * mask).sum(1), (ref * mask).sum(1)
    g_tb = _grad(vargrad_tb_loss(seq_logp, seq_ref, reward, group, beta), theta)
    torch.testing.assert_close(g_prime, beta / (2 * t_max) * g_tb, rtol=1e-4, atol=1e-6)


def test_off_policy_gradient_is_clamped_detached_weight_reinforce():
    feats, theta, behaviour, ref, mask, reward, group = token_toy(seed=3)
    beta, clip = 0.1, 1.5
    logp = token_logp(feats, theta)
    grad = _grad(tba_prime_loss(token_logp(feats, theta), behaviour, ref, mask, reward, group, beta, clip_ratio=clip,
                                max_tokens=8), theta)
    kl = ((logp - ref) * mask).sum(1).detach()
    adv = (reward - group_mean(reward, group)) - beta * (kl - group_mean(kl, group))
    w = (logp.detach() - behaviour).exp().clamp(max=clip)
    assert (w == clip).any() and (w < 1).any()  # the clamp is exercised
    expected = _grad(-(adv * (w * logp * mask).sum(1)).mean() / 8, theta)
    torch.testing.assert_close(grad, expected)


def test_invariant_to_sequence_order_and_group_labels():
    feats, theta, behaviour, ref, mask, reward, group = token_toy(seed=4)
    perm = torch.randperm(len(group), generator=torch.Generator().manual_seed(3))
    relabel = torch.tensor([10, 4, 99])[group]  # arbitrary, non-contiguous ids
    loss_a = tba_prime_loss(token_logp(feats, theta), behaviour, ref, mask, reward, group, 0.1, max_tokens=8)
    loss_b = tba_prime_loss(token_logp(feats[perm], theta), behaviour[perm], ref[perm], mask[perm], reward[perm],
                            relabel[perm], 0.1, max_tokens=8)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(_grad(loss_a, theta), _grad(loss_b, theta))


def test_invariant_to_extra_padding_with_garbage():
    feats, theta, behaviour, ref, mask, reward, group = token_toy(seed=5)
    n = len(group)
    garbage = torch.tensor([NAN, INF, -INF, 1e4]).expand(n, 4)
    loss_a = tba_prime_loss(token_logp(feats, theta), behaviour, ref, mask, reward, group, 0.1, max_tokens=8)
    loss_b = tba_prime_loss(torch.cat([token_logp(feats, theta), garbage], 1), torch.cat([behaviour, -garbage], 1),
                            torch.cat([ref, garbage.flip(1)], 1), torch.cat([mask, torch.zeros(n, 4)], 1),
                            reward, group, 0.1, max_tokens=8)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(_grad(loss_a, theta), _grad(loss_b, theta))


def test_rejects_bad_shapes():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        tba_prime_loss(x, x, x[:, :2], x, torch.zeros(2), torch.zeros(2, dtype=torch.long), 0.1, max_tokens=4)
    with pytest.raises(ValueError):
        tba_prime_loss(x, x, x, x, torch.zeros(2), torch.zeros(2, dtype=torch.long), 0.1, max_tokens=0)
