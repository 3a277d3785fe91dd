"""Length buckets: which responses share a forward when log-probs are computed over many of them at once.

Why: a forward over N responses pads every row to the longest, and on long-tailed lengths (a few responses run to
max_new_tokens, most end early) most of a scoring forward is padding — π_ref scoring on `smollm2_rg_long_cpu`
spent about half its positions on it. Splitting the responses, longest first, into runs that are each padded to
their own longest costs one more forward per run (its prompts run again), so the split is the one that minimises
Σ (rows × longest + overhead) over the runs: an exact dynamic programme over the sorted lengths.
"""

from __future__ import annotations

import numpy as np


def length_buckets(lengths: list[int], overhead: float) -> list[list[int]]:
    """Indices of `lengths` in runs (longest first) that minimise Σ_run (len(run) · max length in run + overhead).
    `overhead`: what one more forward costs, in padded positions (its prompts' tokens run again, and the fixed
    cost of a call). One run holding everything when splitting saves less than it costs."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if len(order) < 2:
        return [order] if order else []
    longest = np.array([lengths[i] for i in order], dtype=np.float64)  # non-increasing
    n = len(order)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    start = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):  # best[j]: the first j sorted rows; a run [i, j) is padded to longest[i]
        i = np.arange(j)
        cost = best[:j] + (j - i) * longest[:j] + overhead
        start[j] = int(np.argmin(cost))
        best[j] = cost[start[j]]
    runs, j = [], n
    while j > 0:
        runs.append(order[start[j]:j])
        j = int(start[j])
    return runs[::-1]
