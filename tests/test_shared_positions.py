"""Shared compact RoPE positions (rope shared): one position per kept token across layers and heads.

- the rank table against a hand-computed one;
- nothing evicted: the chunked prefill is the full prefill (shared ranks are the document's);
- heads that keep different tokens: each key is rotated at its token's rank among all the
  tokens any layer or head holds (checked against the model's own rotary embedding, ranks
  counted in plain Python), the rows read after the memory right after the last rank;
- where heads differ the run differs from compact; bad combinations are refused.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model
from test_engine import TOL, full_prefill, random_ids, run_engine

from memstep.engine import ChunkedPrefill
from memstep.errors import MemstepError
from memstep.presets import Fidelity
from memstep.schedules import make_schedule
from memstep.scorers import make_scorer
from memstep.shared_positions import held_tokens, shared_positions


def test_ranks_by_hand():
    layer0 = torch.tensor([[0, 1, 5, 9], [0, 1, 7, 9]])
    layer1 = torch.tensor([[0, 1, 2, 9], [0, 1, 5, 7]])
    held = held_tokens([layer0, layer1, torch.zeros(2, 0, dtype=torch.long)])
    assert held.tolist() == [0, 1, 2, 5, 7, 9]
    # ranks: 0->0, 1->1, 2->2, 5->3, 7->4, 9->5; three entries read after the memory at 6, 7, 8
    assert shared_positions(held, layer0, 3).tolist() == [[0, 1, 3, 5, 6, 7, 8], [0, 1, 4, 5, 6, 7, 8]]
    assert shared_positions(held, layer1, 0).tolist() == [[0, 1, 2, 5], [0, 1, 3, 4]]
    assert held_tokens([]).numel() == 0


def test_nothing_evicted_is_the_full_prefill():
    model = make_tiny_model("llama", layers=2, seed=3)
    ids = random_ids(200, seed=3)
    engine, records = run_engine(model, ids, make_schedule("fm", 200, 48, 256), rope="shared", collect_hidden=True)
    assert not any(r.evicted for r in records)
    torch.testing.assert_close(torch.cat(engine.hidden_chunks), full_prefill(model, ids), **TOL)
    assert engine.position == 200


def _rotated(model, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """x (rows, dim) rotated at ``positions`` by the model's own rotary embedding (no memstep code)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cos, sin = model.model.rotary_emb(x[None], torch.tensor(positions)[None])
    return apply_rotary_pos_emb(x[None, None], x[None, None], cos, sin)[0][0, 0]


def test_heads_that_keep_different_tokens_read_one_position_per_token():
    model = make_tiny_model("llama", layers=2, seed=4)
    ids = random_ids(170, seed=4)
    engine, records = run_engine(model, ids, make_schedule("fm", 170, 32, 24), scorer="random", rope="shared")
    kept = records[-1].kept_positions  # (layers, kv_heads, entries)
    assert len({tuple(head) for layer in kept.tolist() for head in layer}) > 1, "the heads must keep different tokens"
    everywhere = sorted({p for layer in kept.tolist() for head in layer for p in head})
    assert engine.position == len(everywhere)
    # one layer's cache (memory + 3 rows read after it), rotated as memstep's attention rotates it
    module = model.model.layers[1].self_attn
    kv_heads, entries = kept.shape[1], kept.shape[2]
    generator = torch.Generator().manual_seed(0)
    key = torch.randn(1, kv_heads, entries + 3, 16, generator=generator)
    query = torch.randn(1, 4, 3, 16, generator=generator)
    engine._held = None
    q, k = engine.rotate(module, query, key)
    later = [len(everywhere) + i for i in range(3)]
    for head in range(kv_heads):
        ranks = [everywhere.index(p) for p in kept[1, head].tolist()] + later
        torch.testing.assert_close(k[0, head], _rotated(model, key[0, head], ranks), **TOL)
    for head in range(4):
        torch.testing.assert_close(q[0, head], _rotated(model, query[0, head], later), **TOL)


def test_where_heads_differ_shared_is_not_compact():
    model = make_tiny_model("llama", layers=2, seed=5)
    ids = random_ids(170, seed=5)
    schedule = make_schedule("fm", 170, 32, 24)
    hidden = {}
    for rope in ("compact", "shared"):
        engine, _ = run_engine(model, ids, schedule, scorer="random", rope=rope, collect_hidden=True)
        hidden[rope] = engine.hidden_chunks[-1]
    assert not torch.allclose(hidden["compact"], hidden["shared"], atol=1e-3)


def test_refusals():
    model = make_tiny_model("llama", layers=1, seed=6)
    with pytest.raises(MemstepError, match="shared"):
        ChunkedPrefill(model, make_scorer("recency"), rope="sideways")
    with pytest.raises(MemstepError, match="dynamic NTK rescales the compact positions"):
        ChunkedPrefill(model, make_scorer("recency"), rope="shared", fidelity=Fidelity(ntk="dynamic"))
    eager = make_tiny_model("llama", layers=1, seed=6)
    eager.config._attn_implementation = "eager"
    with pytest.raises(MemstepError, match="shared RoPE positions need"):
        list(ChunkedPrefill(eager, rope="shared").run(random_ids(100), make_schedule("fm", 100, 40, 20)))


def test_the_trained_positions_notice_bounds_shared_positions():
    """Shared positions can reach layers x KV heads x (sinks + M) + c, never more than the document."""
    from types import SimpleNamespace

    from memstep.runner import DocumentRun

    config = SimpleNamespace(max_position_embeddings=4096)
    schedule = make_schedule("fm", 8000, 512, 128)

    def notice(rope: str, layers: int, kv_heads: int) -> list[str]:
        engine = SimpleNamespace(sinks=4, shape=SimpleNamespace(kv_heads=kv_heads), decoder=SimpleNamespace(
            layers=[None] * layers))
        run = SimpleNamespace(schedule=schedule, engine=engine, fidelity=Fidelity())
        return DocumentRun._positions_notice(run, config, rope)

    assert notice("compact", 30, 3) == []  # 4 + 128 + 512
    assert notice("shared", 2, 2) == []  # 4 x 132 + 512 = 1040
    assert notice("shared", 30, 3) == ["shared RoPE positions can reach 8000, beyond the model's 4096 trained "
                                       "positions: answers may degrade."]  # 90 x 132 + 512 > 8000
    assert notice("document", 2, 2)[0].startswith("document RoPE positions reach 8000")
