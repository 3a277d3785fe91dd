"""Online DPO (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback") on reward-ranked pairs.

In each prompt group g the pair is built from the rewards of the sampled responses:

    c_g = first index (tensor order) with r = max_{j∈g} r_j        (chosen)
    l_g = first index (tensor order) with r = min_{j∈g} r_j        (rejected)
    groups with max r = min r give no pair and are skipped (so c_g ≠ l_g always)

    L = mean over pairs of −log σ( β·[(log π_θ(y_c) − log π_ref(y_c)) − (log π_θ(y_l) − log π_ref(y_l))] )

log π is summed over response tokens. With no pair at all the loss is a zero that still has a graph.
Pairs are found with scatter reductions over the group index (the same torch.unique grouping as group_mean);
a mean is of no use here, the pair needs each group's max and min.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tba.algorithm.objectives.groups import check_sequence_inputs, group_index


def online_dpo_loss(logp: torch.Tensor, ref_logp: torch.Tensor, reward: torch.Tensor, group: torch.Tensor,
                    beta: float) -> torch.Tensor:
    """Scalar loss. logp, ref_logp, reward, group: 1-D tensors of length N (one per sequence)."""
    check_sequence_inputs(logp, ref_logp, reward, group)
    inverse, num_groups = group_index(group)
    n = logp.shape[0]
    r = reward.detach() if reward.is_floating_point() else reward.to(logp.dtype)  # rewards only rank
    r_max = r.new_full((num_groups,), -torch.inf).scatter_reduce(0, inverse, r, "amax")  # max_{j∈g} r_j
    r_min = r.new_full((num_groups,), torch.inf).scatter_reduce(0, inverse, r, "amin")  # min_{j∈g} r_j
    position = torch.arange(n, device=logp.device)
    past_end = torch.full_like(position, n)  # sentinel larger than any index
    first = torch.full((num_groups,), n, dtype=position.dtype, device=logp.device)
    chosen = first.scatter_reduce(0, inverse, torch.where(r == r_max[inverse], position, past_end), "amin")  # c_g
    rejected = first.scatter_reduce(0, inverse, torch.where(r == r_min[inverse], position, past_end), "amin")  # l_g
    has_pair = r_max > r_min  # skip groups where every reward ties
    if not bool(has_pair.any()):
        return (logp * 0).sum()  # zero with grad
    log_ratio = logp - ref_logp.to(logp.dtype)  # log π_θ − log π_ref per sequence
    margin = log_ratio[chosen[has_pair]] - log_ratio[rejected[has_pair]]  # chosen minus rejected
    return -F.logsigmoid(beta * margin).mean()  # mean over pairs of −log σ(β·margin)
