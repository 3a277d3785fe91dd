import pytest
import torch
from toys import assert_order_and_label_invariant, sequence_toy

from tba.algorithm.objectives.tb import beta_at, vargrad_log_z, vargrad_tb_loss


def test_hand_computed_example():
    # β = 0.5. Group 0: logp (-1,-2), ref (-1.5,-1.5), r (1,0) → r/β (2,0)
    #   log Ẑ = mean(2+1-1.5, 0+2-1.5) = mean(1.5, 0.5) = 1.0 ; δ = (1-1+1.5-2, 1-2+1.5-0) = (-0.5, 0.5)
    # Group 1: logp (-3,-1), ref (-2,-2), r (0,1) → r/β (0,2)
    #   log Ẑ = mean(0+3-2, 2+1-2) = 1.0 ; δ = (1-3+2-0, 1-1+2-2) = (0, 0)
    # L = mean(0.25, 0.25, 0, 0) = 0.125
    logp = torch.tensor([-1.0, -2.0, -3.0, -1.0])
    ref = torch.tensor([-1.5, -1.5, -2.0, -2.0])
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0])
    group = torch.tensor([7, 7, 3, 3])
    assert vargrad_tb_loss(logp, ref, reward, group, beta=0.5).item() == pytest.approx(0.125)
    assert vargrad_log_z(logp, ref, reward, group, 0.5).tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_huber_residual_by_hand():
    # the example above: δ = (-0.5, 0.5, 0, 0). With c = 1 every |δ| ≤ c: the same loss as δ².
    logp = torch.tensor([-1.0, -2.0, -3.0, -1.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.5, -2.0, -2.0])
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0])
    group = torch.tensor([7, 7, 3, 3])
    assert vargrad_tb_loss(logp, ref, reward, group, 0.5, residual_clip=1.0).item() == pytest.approx(0.125)
    # c = 0.25: ρ(±0.5) = 2·0.25·0.5 − 0.0625 = 0.1875 → L = (0.1875 + 0.1875 + 0 + 0) / 4
    loss = vargrad_tb_loss(logp, ref, reward, group, 0.5, residual_clip=0.25)
    assert loss.item() == pytest.approx(0.09375)
    # dL/dlog π_j = (1/N)·2·clamp(δ_j, −c, c) (log Ẑ is detached): (−0.5, 0.5, 0, 0)/4·... clamped to ±0.25
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad.tolist() == pytest.approx([-0.125, 0.125, 0.0, 0.0])


def test_huber_residual_keeps_the_fixed_point():
    # at π*, log π − log π_ref − r/β is the same for every sample of a prompt: δ = 0 and no gradient, clipped or not
    torch.manual_seed(0)
    ref, reward = torch.randn(8), torch.rand(8)
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    logp = (ref + reward / 0.05 - torch.tensor([3.0] * 4 + [-2.0] * 4)).requires_grad_()
    for clip in (None, 0.5, 5.0):
        loss = vargrad_tb_loss(logp, ref, reward, group, 0.05, residual_clip=clip)
        (grad,) = torch.autograd.grad(loss, logp)
        assert loss.item() == pytest.approx(0.0, abs=1e-8)
        assert grad.abs().max().item() < 1e-6


def test_on_policy_gradient_is_mean_baseline_reinforce_on_kl_shaped_reward():
    # §2.3: ∇L = (2/N) Σ δ ∇log π, with δ = -(1/β)·A, A = (r - r̄) - β(KL̂ - KL̄), KL̂ = log π_θ - log π_ref
    beta = 0.05
    feats, theta, ref, reward, group = sequence_toy()
    logp = feats @ theta  # a differentiable stand-in for log π_θ(y|x)
    (grad_tb,) = torch.autograd.grad(vargrad_tb_loss(logp, ref, reward, group, beta), theta, retain_graph=True)

    kl = (logp - ref).detach()
    adv = torch.empty_like(kl)
    for gid in group.unique():
        m = group == gid
        adv[m] = (reward[m] - reward[m].mean()) - beta * (kl[m] - kl[m].mean())
    surrogate = -(adv * logp).mean()  # REINFORCE with a per-prompt mean baseline
    (grad_pg,) = torch.autograd.grad(surrogate, theta)
    torch.testing.assert_close(grad_tb, (2.0 / beta) * grad_pg, rtol=1e-4, atol=1e-5)


def test_invariant_to_sequence_order_and_group_labels():
    feats, theta, ref, reward, group = sequence_toy(seed=1)
    assert_order_and_label_invariant(vargrad_tb_loss, feats, theta, ref, reward, group, [10, 4, 99], 0.1)


def test_groups_are_by_id_not_by_position():
    # interleaved ids must equal the same data laid out contiguously
    logp = torch.tensor([-1.0, -3.0, -2.0, -1.0])
    ref = torch.tensor([-1.5, -2.0, -1.5, -2.0])
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0])
    interleaved = vargrad_tb_loss(logp, ref, reward, torch.tensor([0, 1, 0, 1]), 0.5)
    assert interleaved.item() == pytest.approx(0.125)


def test_rejects_non_1d_inputs():
    x = torch.zeros(2, 2)
    with pytest.raises(ValueError):
        vargrad_tb_loss(x, x, x, x.long(), 0.1)


def test_beta_schedule_gsm8k_and_tldr():
    # GSM8K (Table 2): 0.012 → 0.004 linearly, reached at step 500
    assert beta_at(1, 0.012, 0.004, 500, 500) == pytest.approx(0.012)
    assert beta_at(251, 0.012, 0.004, 500, 500) == pytest.approx(0.008)
    assert beta_at(500, 0.012, 0.004, 500, 500) == pytest.approx(0.004)
    assert beta_at(900, 0.012, 0.004, 500, 500) == pytest.approx(0.004)
    # TL;DR, U = 256: decay end 128, hard stop at 32 → the deliberate jump 0.777 → 0.05
    assert beta_at(31, 1.0, 0.05, 128, 32) == pytest.approx(1.0 - 30 / 128 * 0.95)
    assert beta_at(32, 1.0, 0.05, 128, 32) == pytest.approx(0.05)
    assert beta_at(10, 0.05, 0.01, None, None) == 0.05
