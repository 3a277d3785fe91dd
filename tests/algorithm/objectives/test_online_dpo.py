import math

import pytest
import torch
from toys import assert_order_and_label_invariant

from tba.algorithm.objectives.online_dpo import online_dpo_loss


def _hand_example():
    # β = 0.5; log-ratio d = logp − ref per sequence.
    # Group 5 at positions 0,1,3,5: r (0.2, 1.0, 1.0, 0.2), d (−1, 1, 3, −5)
    #   chosen = first max = pos 1 (d = 1, not pos 3's d = 3); rejected = first min = pos 0 (d = −1)
    #   β·(1 − (−1)) = 1 → −log σ(1) = log(1 + e^−1) = 0.3132617
    # Group 9 at positions 2,6: r (0.5, 0.5) → tie, no pair
    # Group 2 at positions 4,7: r (0, 1), d (0.5, 0.5) → chosen pos 7, rejected pos 4, β·0 → log 2 = 0.6931472
    # L = (0.3132617 + 0.6931472)/2 = 0.5032044
    logp = torch.tensor([-2.0, -1.0, -3.0, 1.0, -0.5, -7.0, -1.0, -1.5], requires_grad=True)
    ref = torch.tensor([-1.0, -2.0, -1.0, -2.0, -1.0, -2.0, -1.0, -2.0])
    reward = torch.tensor([0.2, 1.0, 0.5, 1.0, 0.0, 0.2, 0.5, 1.0])
    group = torch.tensor([5, 5, 9, 5, 2, 5, 9, 2])
    return logp, ref, reward, group


def test_hand_computed_example():
    logp, ref, reward, group = _hand_example()
    loss = online_dpo_loss(logp, ref, reward, group, beta=0.5)
    expected = (math.log1p(math.exp(-1.0)) + math.log(2.0)) / 2
    assert loss.item() == pytest.approx(expected)
    # ∂/∂d_c of −log σ(β(d_c − d_l)) = −β·σ(−β(d_c − d_l)); ∂/∂d_l is its negative; then ÷ 2 pairs
    #   pair 1: −0.5·σ(−1)/2 = −0.5·0.2689414/2 = −0.0672354 on pos 1, +0.0672354 on pos 0
    #   pair 2: −0.5·σ(0)/2 = −0.125 on pos 7, +0.125 on pos 4 ; tie group and unpicked sequences get 0
    loss.backward()
    g1 = 0.5 * torch.sigmoid(torch.tensor(-1.0)).item() / 2
    torch.testing.assert_close(logp.grad, torch.tensor([g1, -g1, 0.0, 0.0, 0.125, 0.0, 0.0, -0.125]))


def test_no_pair_returns_zero_with_grad():
    logp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    loss = online_dpo_loss(logp, torch.zeros(3), torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 0, 1]), 0.1)
    assert loss.item() == 0.0
    loss.backward()
    assert logp.grad.tolist() == [0.0, 0.0, 0.0]


def test_integer_rewards_and_single_pair():
    # r (3, 1, 2) ints, one group: chosen pos 0 (d = 0), rejected pos 1 (d = 2); β = 1 → −log σ(−2) = log(1 + e^2)
    logp = torch.tensor([-1.0, 0.0, -5.0])
    loss = online_dpo_loss(logp, torch.tensor([-1.0, -2.0, 0.0]), torch.tensor([3, 1, 2]), torch.tensor([1, 1, 1]), 1.0)
    assert loss.item() == pytest.approx(math.log1p(math.exp(2.0)))


def test_invariant_to_group_relabeling_and_order_between_groups():
    # The pair rule is "first occurrence", so only permutations that keep within-group order are invariant;
    # with distinct rewards inside each group any permutation is.
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(12, 5, generator=g)
    theta = torch.randn(5, generator=g, requires_grad=True)
    ref = torch.randn(12, generator=g)
    reward = torch.randperm(12, generator=g).float()  # distinct → no ties
    group = torch.arange(3).repeat_interleave(4)
    assert_order_and_label_invariant(online_dpo_loss, feats, theta, ref, reward, group, [10, 4, 99], 0.3)


def test_rejects_non_1d_inputs():
    x = torch.zeros(2, 2)
    with pytest.raises(ValueError):
        online_dpo_loss(x, x, x, x.long(), 0.1)
