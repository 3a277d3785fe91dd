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
