"""Shared toy batches for the per-token objective tests."""

import torch


def token_toy(seed=0, groups=3, k=4, length=6, dim=5):
    """Random per-token batch: features, parameters, behaviour/ref log-probs, ragged mask, 0/1 rewards, groups."""
    g = torch.Generator().manual_seed(seed)
    n = groups * k
    feats = torch.randn(n, length, dim, generator=g)
    theta = torch.randn(dim, generator=g, requires_grad=True)
    behaviour = -torch.rand(n, length, generator=g) * 2
    ref = -torch.rand(n, length, generator=g) * 2
    lengths = torch.randint(1, length + 1, (n,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    reward = torch.randint(0, 2, (n,), generator=g).float()
    group = torch.arange(groups).repeat_interleave(k)
    return feats, theta, behaviour, ref, mask, reward, group


def token_logp(feats, theta):
    return -torch.nn.functional.softplus(feats @ theta)  # differentiable stand-in for per-token log π_θ


def sequence_toy(seed=0, groups=3, k=4, dim=5):
    """Random per-sequence batch: features, parameters (log π = feats @ theta), ref log-probs, rewards, groups."""
    g = torch.Generator().manual_seed(seed)
    n = groups * k
    feats = torch.randn(n, dim, generator=g)
    theta = torch.randn(dim, generator=g, requires_grad=True)
    ref = torch.randn(n, generator=g)
    reward = torch.randint(0, 2, (n,), generator=g).float()
    group = torch.arange(groups).repeat_interleave(k)
    return feats, theta, ref, reward, group


def assert_order_and_label_invariant(loss_fn, feats, theta, ref, reward, group, new_ids, beta):
    """Loss and gradient must not change when sequences are permuted and groups get arbitrary ids."""
    perm = torch.randperm(len(group), generator=torch.Generator().manual_seed(3))
    relabel = torch.tensor(new_ids)[group]
    loss_a = loss_fn(feats @ theta, ref, reward, group, beta)
    loss_b = loss_fn((feats @ theta)[perm], ref[perm], reward[perm], relabel[perm], beta)
    (ga,) = torch.autograd.grad(loss_a, theta)
    (gb,) = torch.autograd.grad(loss_b, theta)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(ga, gb)
