import pytest
import torch
from toys import assert_order_and_label_invariant, sequence_toy

from tba.algorithm.objectives.groups import group_mean
from tba.algorithm.objectives.rloo import rloo_loss


def test_hand_computed_example():
    # β = 0.5. Group 7: logp (−1, −2, −3), ref (−1, −1, −1), r (1, 0, 1)
    #   KL̂ = logp − ref = (0, −1, −2) → r' = r − 0.5·KL̂ = (1, 0.5, 2)
    #   b = ((0.5+2)/2, (1+2)/2, (1+0.5)/2) = (1.25, 1.5, 0.75) → A = (−0.25, −1.0, 1.25)
    # Group 2 (singleton): logp −4 → A = 0
    # L = −(1/4)·((−0.25)(−1) + (−1)(−2) + (1.25)(−3) + 0) = −(1/4)(0.25 + 2 − 3.75) = 0.375
    # ∂L/∂logp = −A/N = (0.0625, 0.25, −0.3125, 0)  (r' and b are detached)
    logp = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0, -1.0, -2.0])
    reward = torch.tensor([1.0, 0.0, 1.0, 1.0])
    group = torch.tensor([7, 7, 7, 2])
    loss = rloo_loss(logp, ref, reward, group, beta=0.5)
    assert loss.item() == pytest.approx(0.375)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0625, 0.25, -0.3125, 0.0]))


def test_pair_group_advantage_is_the_difference():
    # K = 2, β = 0: b_0 = r_1, b_1 = r_0 → A = (r_0 − r_1, r_1 − r_0) = (0.75, −0.75)
    # L = −(1/2)(0.75·(−1) − 0.75·(−2)) = −(1/2)(0.75) = −0.375
    loss = rloo_loss(torch.tensor([-1.0, -2.0]), torch.zeros(2), torch.tensor([1.0, 0.25]), torch.tensor([3, 3]), 0.0)
    assert loss.item() == pytest.approx(-0.375)




def test_matches_explicit_leave_one_out_loop_and_scaled_mean_baseline():
    feats, theta, ref, reward, group = sequence_toy(seed=5)
    beta = 0.1
    logp = feats @ theta
    (grad,) = torch.autograd.grad(rloo_loss(logp, ref, reward, group, beta), theta, retain_graph=True)
    shaped = (reward - beta * (logp - ref)).detach()
    adv = torch.empty_like(shaped)
    for i in range(len(group)):
        others = (group == group[i]) & (torch.arange(len(group)) != i)
        adv[i] = shaped[i] - shaped[others].mean()
    # identity: r' − b = K/(K−1)·(r' − mean_g r'), K = 4 here
    torch.testing.assert_close(adv, 4 / 3 * (shaped - group_mean(shaped, group)))
    (expected,) = torch.autograd.grad(-(adv * logp).mean(), theta)
    torch.testing.assert_close(grad, expected)


def test_invariant_to_sequence_order_and_group_labels():
    feats, theta, ref, reward, group = sequence_toy(seed=1)
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3])  # uneven sizes incl. a singleton
    assert_order_and_label_invariant(rloo_loss, feats, theta, ref, reward, group, [10, 4, 99, -7], 0.1)


def test_rejects_non_1d_inputs():
    x = torch.zeros(2, 2)
    with pytest.raises(ValueError):
        rloo_loss(x, x, x, x.long(), 0.1)
