"""RoCo's deviation uses one total of squared attention (the reference sums it over every row,
key and KV head: a torch.sum without a dimension), not each key's own sum of squares. The
squares here are not uniform, so the two readings drop different keys."""

from __future__ import annotations

import math

import torch

from memstep.scorers import LayerState, RoCo


def state_with(sums, squares, rows):
    """One KV head; the column sums and squared sums given; the last ``rows`` keys are the chunk's."""
    n = len(sums)
    keys = torch.zeros(1, n, 2)
    state = LayerState(torch.zeros(1, rows, 2), keys, keys.clone(), torch.arange(n)[None], 1.0, rows=rows)
    state._memo[0] = torch.tensor([sums])
    state._memo["square"] = torch.tensor([squares])
    return state


def test_roco_drops_by_the_total_of_the_squares():
    """4 keys, 2 chunk rows: keys 0-2 are seen by 2 rows, key 3 by 1. Sums 0.8, 0.4, 0.6, 0.2 give
    scores 0.4, 0.2, 0.3, 0.2. Squares 0.34, 0.30, 0.24, 0.05: S = 0.93, so the deviations
    sqrt(S / n_k - score^2) are sqrt(0.305), sqrt(0.425), sqrt(0.375), sqrt(0.89); a budget of 4
    zeroes the 4 // 2 = 2 lowest: keys 0 and 2. (Each key's own squares would give
    sqrt(0.01), sqrt(0.11), sqrt(0.03), sqrt(0.01) and zero keys 0 and 3 instead.)"""
    sums, squares = [0.8, 0.4, 0.6, 0.2], [0.34, 0.30, 0.24, 0.05]
    seen = [2, 2, 2, 1]
    scores = [s / n for s, n in zip(sums, seen)]
    total = sum(squares)
    deviation = [math.sqrt(total / n - x * x) for n, x in zip(seen, scores)]
    lowest = sorted(range(4), key=deviation.__getitem__)[:2]
    assert sorted(lowest) == [0, 2]  # the hand-worked reading above
    state = state_with(sums, squares, rows=2)
    state.budget = 4
    torch.testing.assert_close(RoCo().score(state), torch.tensor([[0.0, 0.2, 0.0, 0.2]]))
