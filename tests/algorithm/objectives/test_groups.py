import torch

from tba.algorithm.objectives.groups import group_index, group_mean, group_size


def test_group_mean_by_id_not_position():
    # x = (1, 2, 5, 10, 6): group 7 = {1, 5} → 3 ; group 3 = {2, 6} → 4 ; group 42 = {10} → 10
    x = torch.tensor([1.0, 2.0, 5.0, 10.0, 6.0])
    group = torch.tensor([7, 3, 7, 42, 3])
    assert group_mean(x, group).tolist() == [3.0, 4.0, 3.0, 10.0, 4.0]
    assert group_size(group).tolist() == [2, 2, 2, 1, 2]
    inverse, num_groups = group_index(group)
    assert num_groups == 3 and inverse.tolist() == [1, 0, 1, 2, 0]  # sorted ids 3, 7, 42


def test_group_mean_gradient():
    # ∂/∂x_j Σ_i w_i·mean_{g(i)} x = (Σ_{i∈g(j)} w_i) / K_g
    # w = (1, 2, 3): group a = {0, 2} → (1+3)/2 = 2 for x_0, x_2 ; singleton {1} → 2 for x_1
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (group_mean(x, torch.tensor([5, 9, 5])) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_empty():
    assert group_mean(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
