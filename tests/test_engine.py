"""The chunked prefill engine against plain transformers forwards.

- budget >= document: chunked == one full prefill (hidden states and next-token logits);
- after eviction the next chunk sees exactly the kept entries, RoPE'd at their true positions;
- cache sizes, kept positions and the KV bytes of every step;
- scoring runs on SDPA, one layer at a time, and its attention equals the real attention.
"""

from __future__ import annotations

import platform
import sys
import weakref

import numpy as np
import pytest
import torch
from conftest import ASSETS, make_tiny_model

from memstep.engine import ChunkedPrefill, cache_keyword, decoder_of, model_shape
from memstep.errors import MemstepError
from memstep.schedules import make_schedule
from memstep.scorers import SCORERS, ChunkAttention, make_scorer

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
TOL = dict(rtol=1e-4, atol=1e-4)


def random_ids(tokens: int, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(seed))


def full_prefill(model, ids, positions=None):
    """Hidden states of one plain forward (no memstep code involved)."""
    with torch.inference_mode():
        pos = None if positions is None else torch.as_tensor(positions)[None]
        return model.model(input_ids=torch.as_tensor(ids)[None], position_ids=pos).last_hidden_state[0]


def run_engine(model, ids, schedule, scorer="chunk-attention", sinks=4, rope="document", **kwargs):
    engine = ChunkedPrefill(model, make_scorer(scorer), sinks=sinks, rope=rope, **kwargs)
    return engine, list(engine.run(ids, schedule))


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, make_tiny_model(request.param)


# ---- no eviction: the chunked prefill is a full prefill ------------------------------------
def test_budget_covering_the_document_reproduces_full_prefill(family_model):
    family, model = family_model
    ids = random_ids(200)
    reference = full_prefill(model, ids)
    with torch.inference_mode():
        logits = model(input_ids=ids[None]).logits[0, -1]
    for schedule in (make_schedule("fm", 200, 48, 256), make_schedule("im", 200, 64, 1000),
                     make_schedule("full", 200)):
        engine, records = run_engine(model, ids, schedule, collect_hidden=True)
        assert not any(r.evicted for r in records), family
        torch.testing.assert_close(torch.cat(engine.hidden_chunks), reference, **TOL)
        with torch.inference_mode():
            next_logits = model.get_output_embeddings()(engine.last_hidden)[0]
        torch.testing.assert_close(next_logits, logits, **TOL)
        assert engine.tokens_seen == 200 and engine.cache.get_seq_length() == 200


# ---- eviction: the next chunk sees exactly the kept entries at their true positions -------
@pytest.mark.parametrize("rope", ["document", "compact", "shared"])
@pytest.mark.parametrize("family", FAMILIES)
def test_recency_eviction_equals_full_prefill_over_kept_tokens(family, rope):
    """With one layer, a cache entry's key and value depend only on its token and position, so
    after eviction a chunk must see exactly what a full prefill over [sinks + kept tokens +
    chunk] sees: at the original position ids (document), or at contiguous positions 0..n-1
    (compact; shared too, since recency keeps the same tokens in every head). Fails if eviction drops the wrong entries, rotates kept keys wrongly, or masks
    the compressed cache wrongly."""
    model = make_tiny_model(family, layers=1, seed=1)
    ids = random_ids(170, seed=1)
    sinks, memory = 4, 24
    schedule = make_schedule("fm", 170, 32, memory)
    engine, records = run_engine(model, ids, schedule, scorer="recency", sinks=sinks, collect_hidden=True,
                                 rope=rope)
    for step, record in enumerate(records):
        seen = record.tokens_seen
        expected = list(range(sinks)) + list(range(seen - memory, seen)) if seen > memory + sinks else list(
            range(seen))
        assert (record.kept_positions == np.array(expected)).all(), (family, step)
        if step == 0:
            continue
        kept = records[step - 1].kept_positions[0, 0].tolist()
        positions = kept + list(range(record.chunk_start, seen))
        rope_positions = positions if rope == "document" else list(range(len(positions)))
        assert record.first_position == rope_positions[len(kept)]
        reference = full_prefill(model, ids[positions], rope_positions)[-record.chunk_size:]
        torch.testing.assert_close(engine.hidden_chunks[step], reference, **TOL)
    # compact positions never exceed sinks + M + c; document positions reach the document's end
    assert engine.position == (170 if rope == "document" else sinks + memory)
    # and not merely because any context gives the same answer: the full context differs
    assert not torch.allclose(engine.hidden_chunks[-1], full_prefill(model, ids)[-records[-1].chunk_size:],
                              atol=1e-3)


def reference_run(model, ids, records):
    """Replays the engine's kept positions with plain transformers calls: each chunk runs on a
    DynamicCache that holds the kept entries, and is evicted after the whole forward."""
    from transformers import DynamicCache

    cache, positions, hidden = DynamicCache(), None, []
    for record in records:
        start, stop = record.chunk_start, record.tokens_seen
        chunk_pos = torch.arange(start, stop)
        with torch.inference_mode():
            out = model.model(input_ids=ids[None, start:stop], position_ids=chunk_pos[None], use_cache=True,
                              **{cache_keyword(model.model): cache})
        hidden.append(out.last_hidden_state[0])
        new_positions = []
        for layer_idx, layer in enumerate(cache.layers):
            kv_heads = layer.keys.shape[1]
            seen = chunk_pos.expand(kv_heads, -1) if positions is None else torch.cat(
                [positions[layer_idx], chunk_pos.expand(kv_heads, -1)], dim=1)
            kept = torch.as_tensor(record.kept_positions[layer_idx])
            index = torch.searchsorted(seen.contiguous(), kept)
            assert torch.equal(seen.gather(1, index), kept), "kept a position the cache never held"
            index4 = index[None, :, :, None].expand(1, -1, -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, index4), layer.values.gather(2, index4)
            new_positions.append(kept)
        positions = new_positions
    return hidden


@pytest.mark.parametrize("scorer", ["chunk-attention", "snapkv", "random"])
def test_per_layer_eviction_matches_a_plain_replay(scorer):
    """Multi-layer, per-head eviction (different positions per layer and head): the engine's
    hidden states equal a plain transformers replay of the same kept positions."""
    model = make_tiny_model("llama", layers=3, seed=2)
    ids = random_ids(260, seed=2)
    schedule = make_schedule("imdc", 260, 64, 48)
    engine, records = run_engine(model, ids, schedule, scorer=scorer, collect_hidden=True)
    assert sum(r.evicted for r in records) >= 3
    kept = records[-1].kept_positions
    assert any(not np.array_equal(kept[0, 0], kept[l, h]) for l in range(3) for h in range(2))
    for step, (ours, theirs) in enumerate(zip(engine.hidden_chunks, reference_run(model, ids, records))):
        torch.testing.assert_close(ours, theirs, **TOL, msg=lambda m: f"step {step}: {m}")


# ---- sizes, positions and bytes of every step ---------------------------------------------
@pytest.mark.parametrize("name,growth", [("fm", "linear"), ("im", "sqrt"), ("imdc", "linear"),
                                         ("imdc", "inverse-convex"), ("full", "linear")])
def test_cache_sizes_positions_and_kv_bytes_each_step(tiny_model, name, growth):
    ids = random_ids(300, seed=3)
    sinks = 4
    schedule = make_schedule(name, 300, 64, 80, growth)
    engine = ChunkedPrefill(tiny_model, ChunkAttention(), sinks=sinks)
    shape = model_shape(tiny_model)
    expected_lengths = schedule.cache_lengths(sinks)
    before = 0
    for step, record in enumerate(engine.run(ids, schedule)):
        seen = record.tokens_seen
        budget = schedule.memory_sizes[step]
        after = min(budget + sinks, seen)
        assert (record.memory_before, record.memory_after) == (before, after) == expected_lengths[step]
        assert record.chunk_start == schedule.chunk_starts[step] and record.chunk_size == schedule.chunk_sizes[step]
        assert record.memory_budget == budget and record.step == step and record.steps == schedule.steps
        assert record.evicted == (before + record.chunk_size > after)
        for layer_idx, layer in enumerate(engine.cache.layers):  # the real cache, right now
            assert layer.keys.shape[2] == layer.values.shape[2] == after
            assert torch.equal(engine.positions[layer_idx].cpu(), torch.as_tensor(record.kept_positions[layer_idx]).long())
        assert record.kept_positions.shape == (shape.layers, shape.kv_heads, after)
        for row in record.kept_positions.reshape(-1, after):
            assert (np.diff(row) > 0).all()  # sorted and unique
            assert row[-1] < seen and row[0] >= 0
            assert set(range(min(sinks, seen))) <= set(row.tolist())
        # the modeled KV part is the real cache's peak during the step, to the byte
        parts = record.bytes_modeled_parts
        assert record.kv_bytes_actual == parts["kv_memory"] + parts["kv_chunk"]
        assert record.bytes_modeled == sum(parts.values())
        assert record.bytes_measured is None  # CPU has no device counter
        assert engine.cache_bytes() == after * shape.kv_bytes_per_token
        fraction = record.kept_fraction()
        assert fraction.shape == (seen,) and fraction[:sinks].tolist() == [1.0] * sinks
        assert abs(fraction.sum() - after) < 1e-9  # each slot keeps `after` positions
        before = after
    assert engine.tokens_seen == 300


@pytest.mark.parametrize("scorer", sorted(SCORERS))
def test_every_scorer_keeps_budget_plus_sinks(tiny_model, scorer):
    ids = random_ids(150, seed=4)
    engine, records = run_engine(tiny_model, ids, make_schedule("fm", 150, 40, 20), scorer=scorer)
    assert [r.memory_after for r in records] == [24, 24, 24, 24]
    for record in records:
        parts = record.bytes_modeled_parts
        assert record.kv_bytes_actual == parts["kv_memory"] + parts["kv_chunk"]
        rows = record.kept_positions.reshape(-1, 24)
        assert (np.diff(rows, axis=1) > 0).all() and (rows[:, :4] == np.arange(4)).all()
    if scorer == "recency":
        assert (records[-1].kept_positions[..., 4:] == np.arange(130, 150)).all()


def test_random_scorer_runs_are_reproducible(tiny_model):
    ids = random_ids(150, seed=5)
    schedule = make_schedule("fm", 150, 40, 20)

    def kept(seed):
        engine = ChunkedPrefill(tiny_model, make_scorer("random", seed=seed))
        return [r.kept_positions for r in engine.run(ids, schedule)][-1]

    assert np.array_equal(kept(7), kept(7))
    assert not np.array_equal(kept(7), kept(8))


# ---- scoring: SDPA, one layer at a time ---------------------------------------------------
class SpyScorer(ChunkAttention):
    """Chunk-attention that records each call and checks the previous layer's state is gone."""

    def __init__(self):
        self.calls, self.previous = [], None

    def score(self, layer):
        if self.previous is not None:
            assert self.previous() is None, "the previous layer's scores are still alive"
        scores = super().score(layer)
        self.calls.append(layer.layer)
        self.previous = weakref.ref(layer)  # holds the layer's queries and attention sums
        return scores


def test_scoring_runs_on_sdpa_once_per_layer_per_evicting_step():
    model = make_tiny_model("llama", layers=3, seed=6)
    assert model.config._attn_implementation == "sdpa"
    weights = []
    handles = [layer.self_attn.register_forward_hook(lambda m, a, out: weights.append(out[1]))
               for layer in model.model.layers]
    spy = SpyScorer()
    engine = ChunkedPrefill(model, spy, sinks=4)
    schedule = make_schedule("fm", 160, 32, 40)  # step 0 fits in 44 entries: no eviction there
    try:
        records = list(engine.run(random_ids(160, seed=6), schedule))
    finally:
        for handle in handles:
            handle.remove()
    evicting = [r.step for r in records if r.evicted]
    assert evicting == [1, 2, 3, 4]
    assert spy.calls == [0, 1, 2] * len(evicting)
    assert all(w is None for w in weights)  # SDPA returned no attention matrix: none was needed
    assert len(weights) == 3 * schedule.steps


@pytest.mark.parametrize("family", FAMILIES)
def test_scorer_attention_equals_the_model_attention(family):
    """The queries the scorer rebuilds (q_proj hook, q_norm, RoPE at true positions) give the
    attention an eager model really computes, on a compressed cache."""
    model = make_tiny_model(family, layers=2, seed=7)
    model.config._attn_implementation = "eager"
    probabilities = {}

    def keep_probabilities(module, args, output):
        probabilities[module.layer_idx] = output[1][0]  # (heads, chunk, keys)

    sums = []

    class Capture(ChunkAttention):
        def score(self, layer):
            sums.append((layer.layer, layer.attention_sum().clone()))
            return super().score(layer)

    handles = [layer.self_attn.register_forward_hook(keep_probabilities) for layer in model.model.layers]
    engine = ChunkedPrefill(model, Capture(), sinks=2, rope="document")  # eager: the model rotates
    checked = 0
    try:
        for record in engine.run(random_ids(150, seed=7), make_schedule("fm", 150, 40, 30)):
            for layer_idx, attention in sums:
                real = probabilities[layer_idx]
                kv_heads = engine.shape.kv_heads
                expected = real.float().reshape(kv_heads, -1, *real.shape[1:]).sum(dim=(1, 2))
                # the scorer sees the keys after the 2 sinks (taken out before scoring, as the reference)
                torch.testing.assert_close(attention, expected[:, 2:], rtol=1e-4, atol=1e-5)
                checked += 1
            sums.clear()
    finally:
        for handle in handles:
            handle.remove()
    assert checked == 2 * 4  # 2 layers x 4 steps, all evicting (40 > 30 + 2 sinks)


# ---- errors --------------------------------------------------------------------------------
def test_engine_rejects_bad_settings(tiny_model):
    with pytest.raises(MemstepError, match="sinks"):
        ChunkedPrefill(tiny_model, sinks=-1)
    engine = ChunkedPrefill(tiny_model)
    with pytest.raises(MemstepError, match="covers 100 tokens but the input has 99"):
        list(engine.run(random_ids(99), make_schedule("fm", 100, 10, 10)))
    with pytest.raises(MemstepError, match="Llama-style"):
        decoder_of(torch.nn.Linear(2, 2))


# ---- the embedded model --------------------------------------------------------------------
@pytest.mark.slow
def test_embedded_model_chunked_equals_full_prefill(embedded):
    text = (ASSETS / "pride_and_prejudice_ch1-12.txt").read_text()[:6000]
    ids = torch.tensor(embedded.tokenizer(text)["input_ids"][:400])
    model = embedded.model
    reference = full_prefill(model, ids)
    with torch.inference_mode():  # what model(ids).logits[0, -1] computes, without a second forward
        logits = model.get_output_embeddings()(reference[-1:])[0]
    engine, records = run_engine(model, ids, make_schedule("fm", 400, 96, 512), collect_hidden=True)
    assert len(records) == 5 and not any(r.evicted for r in records)
    torch.testing.assert_close(torch.cat(engine.hidden_chunks), reference, **TOL)
    with torch.inference_mode():
        next_logits = model.get_output_embeddings()(engine.last_hidden)[0]
    torch.testing.assert_close(next_logits, logits, **TOL)
    assert int(next_logits.argmax()) == int(logits.argmax())


# ---- positions after the prefill, per-layer budgets, refusals -------------------------------
@pytest.mark.parametrize("rope", ["compact", "document", "shared"])
def test_appended_tokens_continue_right_after_the_memory(rope):
    """A question appended after the prefill sees the kept entries at their positions and sits
    right after them: after the compact memory (compact) or after the document's end (document)."""
    from memstep.generate import _extend

    model = make_tiny_model("llama", layers=1, seed=1)
    ids, extra = random_ids(170, seed=1), random_ids(5, seed=9)
    engine, records = run_engine(model, ids, make_schedule("fm", 170, 32, 24), scorer="recency", rope=rope)
    kept = records[-1].kept_positions[0, 0].tolist()
    logits = _extend(engine, extra.tolist())
    tokens = torch.cat([ids[kept], extra])
    positions = kept + list(range(170, 175)) if rope == "document" else list(range(len(kept) + 5))
    with torch.inference_mode():
        reference = model.get_output_embeddings()(full_prefill(model, tokens, positions))[-5:]
    torch.testing.assert_close(logits, reference, **TOL)
    assert engine.position == positions[-1] + 1 and engine.tokens_seen == 175


def test_layerwise_budgets_keep_a_different_number_of_entries_per_layer():
    model = make_tiny_model("llama", layers=4, seed=8)
    ids = random_ids(300, seed=8)
    schedule = make_schedule("imdc", 300, 64, 60, "double-inverse", layers=4)
    engine = ChunkedPrefill(model, make_scorer("chunk-attention"), sinks=4)
    shape = model_shape(model)
    for step, (record, (before, after)) in enumerate(zip(engine.run(ids, schedule), schedule.layer_cache_lengths(4))):
        assert [layer.keys.shape[2] for layer in engine.cache.layers] == after == record.layer_entries
        assert record.layer_budgets == schedule.layer_budgets(step, 4)
        assert record.memory_after == max(after) and record.memory_before == max(before)
        parts = record.bytes_modeled_parts
        assert record.kv_bytes_actual == parts["kv_memory"] + parts["kv_chunk"]  # per-layer bytes, to the byte
        assert engine.cache_bytes() == sum(after) * shape.kv_bytes_per_entry
        for layer, entries in enumerate(after):  # padding only beyond each layer's own entries
            assert (record.kept_positions[layer][:, :entries] >= 0).all()
            assert (record.kept_positions[layer][:, entries:] == -1).all()
        assert abs(record.kept_fraction().sum() - sum(after) / 4) < 1e-9
        data = record.to_dict(with_positions=True)
        assert data["layer_memory_after"] == after and len(data["kept_positions"][0][0]) == after[0]
    assert len(set(after)) == 1  # the last step is M everywhere
    assert len(set(schedule.layer_cache_lengths(4)[2][1])) == 2  # mid-run the halves differ


def test_compact_and_layerwise_need_sdpa(tiny_model):
    eager = make_tiny_model("llama", layers=2, seed=3)
    eager.config._attn_implementation = "eager"
    with pytest.raises(MemstepError, match="compact RoPE positions need"):
        list(ChunkedPrefill(eager, rope="compact").run(random_ids(100), make_schedule("fm", 100, 40, 20)))
    with pytest.raises(MemstepError, match="layer-wise budgets need"):
        list(ChunkedPrefill(eager, rope="document").run(
            random_ids(100), make_schedule("im", 100, 40, 20, "square-sqrt", layers=2)))
    with pytest.raises(MemstepError, match="unknown RoPE position mode 'absolute'"):
        ChunkedPrefill(tiny_model, rope="absolute")
    with pytest.raises(MemstepError, match="made for 3 layers"):
        list(ChunkedPrefill(tiny_model).run(random_ids(100), make_schedule("im", 100, 40, 20, "square-sqrt",
                                                                            layers=3)))
    assert eager.config._attn_implementation == "eager"  # left as it was


def test_a_long_runs_report_keeps_its_steps_compact(tiny_model, monkeypatch):
    """What a run keeps for its report grows with its steps: each step's kept positions are one
    int32 array (equal to the engine's int64 positions), the heap is trimmed once per step,
    and the JSON's per-position fractions are the same numbers as rounding each one."""
    from memstep import heap
    from memstep.records import RunResult

    trims = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(1) or True)
    schedule = make_schedule("imdc", 400, 64, 48)
    engine = ChunkedPrefill(tiny_model, ChunkAttention(), sinks=4)
    records = []
    for record in engine.run(random_ids(400, seed=9), schedule):
        assert record.kept_positions.dtype == np.int32
        assert np.array_equal(record.kept_positions, torch.stack(engine.positions).numpy())
        records.append(record)
    assert len(trims) == schedule.steps == len(records)
    result = RunResult(model="tiny", tokens=400, prefix_tokens=0, schedule=schedule.to_dict(), scorer="chunk-attention",
                       sinks=4, device="cpu", dtype="float32", steps=records)
    fractions = result.to_dict()["kept_fraction"]
    assert fractions == [round(float(x), 4) for x in result.kept_fraction()] and len(fractions) == 400
    assert len({id(x) for x in fractions}) == len(set(fractions)) < 400  # one object per distinct value


def test_the_heap_trim_runs_here():
    from memstep import heap

    assert heap.trim() is (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc")
