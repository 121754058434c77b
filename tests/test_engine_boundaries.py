"""The engine at its boundaries, each checked against a definition computed apart from it:

- a 1-token question rides after each chunk and never stays in the cache: after every step each
  layer holds exactly its kept entries (also in steps that evict nothing);
- dynamic NTK (the reference's rule): a step whose last position is the trained length keeps
  RoPE as the model has it; one position more rotates with base * 3^(dim / (dim - 2)), the same
  as a model whose RoPE base is that number;
- score rows "last-c": the sums the engine hands its scorer are the attention of the last c rows
  of the zero-padded query block, as LayerState(window=c) computes them from scratch.
"""

from __future__ import annotations

import torch
from conftest import make_tiny_model

from memstep.engine import ChunkedPrefill
from memstep.presets import Fidelity
from memstep.schedules import make_schedule
from memstep.scorers import ChunkAttention, LayerState

LIMIT = 32  # the tiny model's trained length (max_position_embeddings)
HEAD_DIM = 16


def random_ids(tokens: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 128, (tokens,), generator=torch.Generator().manual_seed(seed))


def plain_hidden(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model.model(input_ids=ids[None]).last_hidden_state[0]


# ---- a 1-token question never stays in the cache ----------------------------------------------
def test_a_one_token_question_leaves_only_the_kept_entries_after_every_step():
    model = make_tiny_model(layers=2, seed=3)
    sinks = 4
    # chunks of 16 into a memory of 32: steps 0 and 1 evict nothing, later steps do
    schedule = make_schedule("fm", 100, 16, 32)
    engine = ChunkedPrefill(model, ChunkAttention(), sinks=sinks, rope="compact", question_ids=[7])
    evicted = []
    for record in engine.run(random_ids(100, seed=3), schedule):
        expected = min(record.chunk_start + record.chunk_size, 32 + sinks)
        for index, layer in enumerate(engine.cache.layers):
            assert layer.keys.shape[2] == layer.values.shape[2] == engine.positions[index].shape[1] == expected, \
                (record.step, index, layer.keys.shape)
        assert int(engine.positions[0].max()) < record.chunk_start + record.chunk_size  # document positions only
        evicted.append(record.evicted)
    assert evicted[:2] == [False, False] and all(evicted[2:])


# ---- dynamic NTK at the trained length ----------------------------------------------------------
def ntk_run(model, tokens: int) -> torch.Tensor:
    engine = ChunkedPrefill(model, ChunkAttention(), sinks=0, rope="compact", collect_hidden=True,
                            fidelity=Fidelity(ntk="dynamic"))
    list(engine.run(random_ids(tokens), make_schedule("full", tokens)))
    return torch.cat(engine.hidden_chunks)


def test_dynamic_ntk_starts_one_position_past_the_trained_length():
    """Qwen's dynamic NTK as the reference applies it: factor 1 while the step's last position is
    at most the trained length, then 2^ceil(log2(p / limit) + 1) - 1 = 3 for p = limit + 1, and
    RoPE's base becomes base * factor^(dim / (dim - 2))."""
    model = make_tiny_model(layers=2, seed=1, max_position_embeddings=LIMIT)
    base = model.config.rope_parameters["rope_theta"]
    # last position LIMIT (LIMIT + 1 tokens): RoPE as the model has it
    torch.testing.assert_close(ntk_run(model, LIMIT + 1), plain_hidden(model, random_ids(LIMIT + 1)),
                               rtol=1e-4, atol=1e-4)
    # last position LIMIT + 1: the base grows by 3^(16/14)
    scaled = make_tiny_model(layers=2, seed=1, max_position_embeddings=LIMIT,
                             rope_theta=base * 3 ** (HEAD_DIM / (HEAD_DIM - 2)))
    got = ntk_run(model, LIMIT + 2)
    torch.testing.assert_close(got, plain_hidden(scaled, random_ids(LIMIT + 2)), rtol=1e-4, atol=1e-4)
    assert (got - plain_hidden(model, random_ids(LIMIT + 2))).abs().max() > 1e-3  # it did change


# ---- score rows "last-c" --------------------------------------------------------------------------
class SpyAttention(ChunkAttention):
    """The chunk-attention scorer, recording the engine's sums beside sums computed from scratch."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def score(self, layer: LayerState) -> torch.Tensor:
        fresh = LayerState(layer.queries.clone(), layer.keys.clone(), layer.values, layer.positions, layer.scaling,
                           layer.layer, window=layer.window, grouping=layer.grouping)
        self.seen.append((layer.chunk_size, layer.attention_sum().clone(), fresh.attention_sum()))
        return super().score(layer)


def test_last_c_rows_sums_equal_the_padded_blocks_last_c_rows():
    model = make_tiny_model(layers=2, seed=2)
    spy = SpyAttention()
    # chunks of 16 into a memory of 24: the last chunk has 4 rows, so 12 zero rows count before it
    engine = ChunkedPrefill(model, spy, sinks=0, rope="compact", fidelity=Fidelity(score_rows="last-c"))
    list(engine.run(random_ids(100, seed=2), make_schedule("fm", 100, 16, 24)))
    assert {chunk for chunk, _, _ in spy.seen} == {16, 4}
    for chunk, engine_sums, fresh_sums in spy.seen:
        assert fresh_sums.shape == engine_sums.shape
        torch.testing.assert_close(engine_sums, fresh_sums, rtol=1e-4, atol=1e-5)
