"""Each scorer on hand-made tensors, with expected values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from memstep.errors import MemstepError
from memstep.scorers import (SCORERS, VATP, ChunkAttention, Conv, KeyNorm, LayerState, RandomScorer, Recency, SnapKV,
                             make_scorer, select_kept)

LN2, LN3 = math.log(2), math.log(3)


def state(queries, keys, values=None, positions=None, scaling=1.0):
    """LayerState from nested lists: queries (heads, chunk, dim), keys (kv_heads, keys, dim)."""
    q = torch.tensor(queries, dtype=torch.float32)
    k = torch.tensor(keys, dtype=torch.float32)
    v = torch.ones_like(k) if values is None else torch.tensor(values, dtype=torch.float32)
    if positions is None:
        positions = torch.arange(100, 100 + k.shape[1]).expand(k.shape[0], -1)
    return LayerState(q, k, v, torch.as_tensor(positions), scaling)


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-6)


# One head, one memory key then a chunk of 2 (dim 1, q = 1, keys 0, ln 2, 0; logits = q * k):
#   row 0 sees keys 0, 1:    exp 1, 2    -> 1/3, 2/3
#   row 1 sees keys 0, 1, 2: exp 1, 2, 1 -> 1/4, 1/2, 1/4
# attention sums 7/12, 7/6, 1/4; visible queries 2, 2, 1; chunk-attention 7/24, 7/12, 1/4.
ONE_HEAD = dict(queries=[[[1.0], [1.0]]], keys=[[[0.0], [LN2], [0.0]]])


def test_chunk_attention_normalizes_by_visible_queries():
    layer = state(**ONE_HEAD)
    assert layer.memory_size == 1 and layer.chunk_size == 2
    close(layer.attention_sum(), [[7 / 12, 7 / 6, 1 / 4]])
    close(layer.visible_queries(), [2, 2, 1])
    close(ChunkAttention().score(layer), [[7 / 24, 7 / 12, 1 / 4]])


def test_scaling_multiplies_the_logits():
    # scaling 2 turns ln 2 into ln 4: row 0 -> 1/5, 4/5; row 1 -> 1/6, 4/6, 1/6
    layer = state(**ONE_HEAD, scaling=2.0)
    close(layer.attention_sum(), [[1 / 5 + 1 / 6, 4 / 5 + 4 / 6, 1 / 6]])


def test_gqa_sums_the_query_heads_of_a_group():
    # a second query head (q = 0) attends uniformly: row 0 -> 1/2, 1/2; row 1 -> 1/3 each
    layer = state(queries=[[[1.0], [1.0]], [[0.0], [0.0]]], keys=ONE_HEAD["keys"])
    close(layer.attention_sum(), [[7 / 12 + 5 / 6, 7 / 6 + 5 / 6, 1 / 4 + 1 / 3]])
    close(ChunkAttention().score(layer), [[17 / 24, 1.0, 7 / 12]])


def test_gqa_groups_are_consecutive_query_heads():
    # 4 query heads, 2 KV heads: heads 0, 1 (q = 1) use KV head 0, heads 2, 3 (q = 0) KV head 1,
    # as transformers' repeat_kv does. Interleaved groups would mix q = 1 and q = 0 heads.
    keys = [[[0.0], [LN2], [0.0]], [[0.0], [LN2], [0.0]]]
    layer = state(queries=[[[1.0], [1.0]]] * 2 + [[[0.0], [0.0]]] * 2, keys=keys)
    close(ChunkAttention().score(layer), [[7 / 12, 7 / 6, 1 / 2], [5 / 6, 5 / 6, 2 / 3]])


def test_attention_sum_from_a_later_row():
    layer = state(**ONE_HEAD)
    close(layer.attention_sum(1), [[1 / 4, 1 / 2, 1 / 4]])  # only row 1
    close(layer.visible_queries(1), [1, 1, 1])


def test_attention_sum_over_several_query_blocks(monkeypatch):
    # blocks of query rows must add up to the single-block result
    import memstep.scorers as scorers

    torch.manual_seed(0)
    q, k = torch.randn(4, 7, 8), torch.randn(2, 10, 8)
    whole = LayerState(q, k, k, torch.arange(10).expand(2, -1), 0.3).attention_sum()
    monkeypatch.setattr(scorers, "QUERY_BLOCK", 2)
    blocked = LayerState(q, k, k, torch.arange(10).expand(2, -1), 0.3).attention_sum()
    torch.testing.assert_close(blocked, whole)
    # every query row's probabilities sum to 1: the total is rows x heads per group
    torch.testing.assert_close(whole.sum(dim=1), torch.full((2,), 7.0 * 2))


def test_vatp_prefers_the_larger_value_norm_at_equal_attention():
    # query 0 against zero keys: uniform attention 1/5 over 4 memory keys + 1 chunk key
    values = [[[1.0, 0.0], [3.0, 0.0], [-2.0, 0.0], [0.5, 0.0], [0.0, 0.7]]]  # L1 norms 1, 3, 2, .5, .7
    layer = state(queries=[[[0.0, 0.0]]], keys=[[[0.0, 0.0]] * 5], values=values)
    close(ChunkAttention().score(layer), [[0.2] * 5])  # chunk-attention alone cannot tell them apart
    close(VATP().score(layer), [[0.2, 0.6, 0.4, 0.1, 0.14]])
    kept = select_kept(VATP().score(layer), layer.positions, keep=2, sinks=0)
    assert kept.tolist() == [[1, 2]]


def test_conv_pools_the_sums_with_zero_padding_counted_then_divides():
    # ONE_HEAD: attention sums 7/12, 7/6, 1/4 (14/24, 28/24, 6/24); kernel 3 with one zero pad each side,
    # counted in the average: (0 + 14 + 28)/3, (14 + 28 + 6)/3, (28 + 6 + 0)/3 in 24ths = 42/72, 48/72, 34/72;
    # divided by the visible queries 2, 2, 1
    layer = state(**ONE_HEAD)
    close(Conv(kernel=3).score(layer), [[42 / 144, 48 / 144, 34 / 72]])
    # kernel 5 (the reference's): pads of 2, every window divides by 5:
    # (14 + 28 + 6)/5, (14 + 28 + 6)/5, (14 + 28 + 6)/5 in 24ths, then / 2, 2, 1
    close(Conv().score(layer), [[48 / 240, 48 / 240, 48 / 120]])
    close(Conv(kernel=1).score(layer), ChunkAttention().score(layer).tolist())  # no pooling


def test_conv_kernel_is_checked():
    assert make_scorer("conv", kernel=7).kernel == 7
    for bad in (0, 4, -3, 257):
        with pytest.raises(MemstepError, match="odd number"):
            make_scorer("conv", kernel=bad)


def test_snapkv_pools_the_window_attention_and_keeps_the_window():
    # one query (the window) over keys 0, ln 2, ln 3, 0 (memory) and 0 (chunk): exp 1, 2, 3, 1, 1 / 8
    layer = state(queries=[[[1.0]]], keys=[[[0.0], [LN2], [LN3], [0.0], [0.0]]])
    scores = SnapKV(window=1, kernel=3).score(layer)
    # average over neighbours, padding not counted: (1+2)/2, (1+2+3)/3, (2+3+1)/3, (3+1+1)/3 in eighths
    close(scores[:, :4], [[3 / 16, 1 / 4, 1 / 4, 5 / 24]])
    assert scores[0, 4] > scores[0, :4].max()  # the window outranks the rest


def test_snapkv_window_is_always_kept():
    torch.manual_seed(1)
    q, k = torch.randn(2, 8, 4), torch.randn(1, 13, 4)  # memory 5, chunk 8
    layer = LayerState(q, k, k, torch.arange(13)[None], 0.5)
    kept = select_kept(SnapKV(window=3).score(layer), layer.positions, keep=3, sinks=0)
    assert kept.tolist() == [[10, 11, 12]]
    kept = select_kept(SnapKV(window=3).score(layer), layer.positions, keep=6, sinks=2)
    assert kept[0, :2].tolist() == [0, 1] and kept[0, -3:].tolist() == [10, 11, 12]
    # a window larger than the budget: the sinks still come first, then the window's most recent
    kept = select_kept(SnapKV(window=8).score(layer), layer.positions, keep=5, sinks=2)
    assert kept.tolist() == [[0, 1, 10, 11, 12]]


def test_knorm_keeps_low_norm_keys():
    keys = [[[3.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.3, 0.4]], [[0.1, 0.0], [5.0, 0.0], [0.0, 0.2], [9.0, 0.0]]]
    layer = state(queries=[[[0.0, 0.0]]] * 2, keys=keys)
    kept = select_kept(KeyNorm().score(layer), layer.positions, keep=2, sinks=0)
    assert kept.tolist() == [[1, 3], [0, 2]]  # norms 1 and 0.5; 0.1 and 0.2 (per KV head)


def test_recency_keeps_sinks_and_the_most_recent():
    positions = torch.tensor([[0, 1, 2, 3, 10, 11, 12]])
    layer = LayerState(None, torch.zeros(1, 7, 2), torch.zeros(1, 7, 2), positions, 1.0)
    kept = select_kept(Recency().score(layer), positions, keep=4, sinks=2)
    assert positions.gather(1, kept).tolist() == [[0, 1, 11, 12]]


def test_random_is_deterministic_per_seed_and_differs_across_seeds():
    layer = LayerState(None, torch.zeros(2, 50, 2), torch.zeros(2, 50, 2), torch.arange(50).expand(2, -1), 1.0)

    def stream(scorer):
        scorer.reset()
        return [scorer.score(layer) for _ in range(3)]

    first, again, other = stream(make_scorer("random", seed=1)), stream(RandomScorer(seed=1)), stream(
        RandomScorer(seed=2))
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])
    assert not torch.equal(first[0], first[1])  # successive layers draw different scores
    kept_1 = select_kept(first[0], layer.positions, 10, 4)
    kept_2 = select_kept(other[0], layer.positions, 10, 4)
    assert not torch.equal(kept_1, kept_2)


def test_select_kept_always_keeps_sinks_sorted_and_unique():
    torch.manual_seed(3)
    positions = torch.stack([torch.arange(40), torch.arange(40)])
    scores = torch.randn(2, 40)
    scores[:, :4] = -1e9  # the sinks score lowest, yet are kept
    kept = select_kept(scores, positions, keep=12, sinks=4)
    assert kept.shape == (2, 12)
    for head in range(2):
        row = kept[head].tolist()
        assert row[:4] == [0, 1, 2, 3]
        assert row == sorted(set(row))
        # the 8 others are the 8 best non-sink scores of that head
        best = torch.topk(scores[head, 4:], 8).indices + 4
        assert sorted(best.tolist()) == row[4:]


def test_select_kept_keeps_sinks_above_infinite_scores():
    positions = torch.arange(10)[None]
    scores = torch.full((1, 10), float("inf"))
    scores[0, 1] = float("nan")
    assert select_kept(scores, positions, keep=4, sinks=2)[0, :2].tolist() == [0, 1]


def test_select_kept_protects_sinks_by_position_not_index():
    positions = torch.tensor([[7, 0, 9, 1, 8]])  # the sinks (positions < 2) sit at indices 1 and 3
    kept = select_kept(torch.tensor([[5.0, -9.0, 1.0, -9.0, 3.0]]), positions, keep=3, sinks=2)
    assert kept.tolist() == [[0, 1, 3]]


def test_make_scorer_names_and_errors():
    assert set(SCORERS) == {"chunk-attention", "conv", "snapkv", "vatp", "knorm", "recency", "random",
                            "random-shared", "roco", "chunk-prefix", "random-query"}
    for name in SCORERS:
        assert make_scorer(name).name == name
    assert make_scorer("snapkv", window=7).window == 7
    with pytest.raises(MemstepError, match="unknown scorer 'h2o'"):
        make_scorer("h2o")
    with pytest.raises(MemstepError, match="window"):
        make_scorer("snapkv", window=0)
