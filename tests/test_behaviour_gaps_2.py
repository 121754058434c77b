"""The ten behaviours a deliberate-bug check found untested (issue 19), each checked against a
hand-computed case or against the other code's own source (transformers' eager attention and
mask builder, torch's SDPA): a 1-token question in question-aware mode; VATP's division by
visible queries; eager/padded mask bytes at step 0; the cache copy term when memory shrinks;
the planner's scorer gather bytes; SparseGPT's w^2/d^2 criterion; the block-reconstruction
loss normalized by the target; Latin code-page ties (cp1252 wins); a prefix that ends within
the tokenizer margin (tests/test_api_bounds.py); GQA with 8 query heads over 2 KV heads in
the engine, the attention and the scorer. Tiny models, fast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_model

import memstep.engine as engine_module
from memstep import attention
from memstep.engine import ChunkedPrefill
from memstep.memory import ModelShape, attention_bytes
from memstep.schedules import make_schedule
from memstep.scorers import VATP, ChunkAttention, LayerState

# 8 query heads over 2 KV heads: groups of 4, so groups != KV heads and both are above 1
GQA = dict(num_attention_heads=8, num_key_value_heads=2, head_dim=8)
TIGHT = dict(rtol=1e-4, atol=1e-5)


def gqa_model(layers: int = 2, seed: int = 3, eager: bool = False):
    model = make_tiny_model(layers=layers, seed=seed, **GQA)
    if eager:
        model.config._attn_implementation = "eager"
    return model


def random_ids(tokens: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(20, 128, (tokens,), generator=torch.Generator().manual_seed(seed))


def eager_attention(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the (heads, rows, keys) probabilities transformers' eager attention computes."""
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model.model(input_ids=ids[None], output_attentions=True, use_cache=False)
    finally:
        model.config._attn_implementation = "sdpa"
    return [a[0].float() for a in out.attentions]


def model_groups(probabilities: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Sum over each KV head's query heads as transformers groups them (repeat_kv: query head h
    reads KV head h // (heads / kv_heads)), from (heads, ...) to (kv_heads, ...)."""
    heads = probabilities.shape[0]
    owner = torch.arange(heads) // (heads // kv_heads)
    return torch.stack([probabilities[owner == g].sum(dim=0) for g in range(kv_heads)])


# ---- 1. a one-token question in question-aware mode ---------------------------------------------
def test_a_one_token_question_scores_with_its_own_attention(monkeypatch):
    """With a 1-token question the question's attention is one query row per head: at the first
    step (no memory yet, so compact and true positions agree) it must equal that row of the
    eager model's attention over the chunk, summed over each KV group's 8 / 2 = 4 query heads."""
    model = gqa_model(layers=2)
    ids, question = random_ids(120, seed=4), [77]
    seen = []
    mix = engine_module.question_mix

    def spy(base, q, *rest, **kwargs):
        seen.append(q.clone())
        return mix(base, q, *rest, **kwargs)

    monkeypatch.setattr(engine_module, "question_mix", spy)
    engine = ChunkedPrefill(model, ChunkAttention(), sinks=2, question_ids=question)
    records = list(engine.run(ids, make_schedule("fm", 120, 40, 24)))
    assert [r.question_tokens for r in records] == [1, 1, 1]
    assert len(seen) == 2 * 3  # every layer of every (evicting) step mixed the question in
    assert all(layer.keys.shape[2] == 24 + 2 for layer in engine.cache.layers)  # its entry never stays
    reference = eager_attention(model, torch.cat([ids[:40], torch.tensor(question)]))
    for layer in range(2):
        expected = model_groups(reference[layer][:, 40, :40], kv_heads=2)  # the question's row, chunk keys
        torch.testing.assert_close(seen[layer], expected, **TIGHT)
    agnostic = list(ChunkedPrefill(model, ChunkAttention(), sinks=2).run(ids, make_schedule("fm", 120, 40, 24)))
    assert any((a.kept_positions != b.kept_positions).any() for a, b in zip(agnostic, records))


# ---- 2. VATP divides the attention by the queries that see each key -----------------------------
def test_vatp_divides_by_the_visible_queries_per_kv_head():
    """Zero queries and keys: every query row spreads its attention evenly over the keys it sees.
    Memory 2, chunk 3: rows see 3, 4 and 5 keys; each memory key gets 1/3 + 1/4 + 1/5 per query
    head and is seen by 3 rows, chunk key 1 gets 1/4 + 1/5 from 2 rows, chunk key 2 gets 1/5 from
    1. Four query heads per KV head; value L1 norms 1 (KV head 0) and 2 (KV head 1)."""
    values = torch.zeros(2, 5, 8)
    values[0, :, 0], values[1, :, :2] = 1.0, 1.0
    layer = LayerState(torch.zeros(8, 3, 8), torch.zeros(2, 5, 8), values, torch.arange(5).expand(2, -1), 1.0)
    sums = torch.tensor([47 / 60, 47 / 60, 47 / 60, 9 / 20, 1 / 5]) * 4
    visible = torch.tensor([3.0, 3, 3, 2, 1])
    expected = torch.stack([sums / visible, 2 * sums / visible])
    torch.testing.assert_close(VATP().score(layer), expected)
    # the division changes the order: undivided, key 3 (0.45 x 4) would outrank key 4's 0.2 x 4 by
    # less than divided (0.225 vs 0.2); the memory keys' 0.783 fall to 0.261
    assert VATP().score(layer)[0, 0] < 0.3 * 4


# ---- 3. eager / padded mask bytes at step 0 --------------------------------------------------------
SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128,
                   params=1000, dtype_bytes=2)


def _without_mask(before: int, chunk: int, after: int, attention_name: str) -> int:
    """attention_bytes' other terms, from memory.py's documented parts (hand-computed)."""
    keys, item = before + chunk, 2
    repeated = 2 * 4 * keys * 16 * item
    output = 4 * chunk * 16 * item
    scores = 2 * 4 * chunk * keys * 4 if attention_name == "eager" else 2 * 4 * keys * keys * item
    return repeated + output + scores + max(after, before) * SHAPE.kv_bytes_per_entry


def test_sdpa_builds_no_mask_at_step_zero_and_the_later_masks_stay_counted():
    assert attention_bytes(SHAPE, 0, 10, 6) == 4 * 10 * 16 * 2 + 6 * 128  # output + cache copy only
    for name in ("eager", "padded"):  # a later step: the explicit mask is counted
        assert attention_bytes(SHAPE, 5, 10, 6, name) > _without_mask(5, 10, 6, name)


def test_eager_mask_bytes_follow_transformers_mask_builder():
    from transformers.masking_utils import eager_mask

    for before, chunk in ((0, 10), (5, 10)):
        mask = eager_mask(batch_size=1, q_length=chunk, kv_length=before + chunk, q_offset=before,
                          kv_offset=0, mask_function=lambda b, h, q, k: k <= q, dtype=torch.bfloat16)
        assert mask is not None and mask.nbytes == chunk * (before + chunk) * 2
        expected = _without_mask(before, chunk, 6, "eager") + mask.nbytes
        assert attention_bytes(SHAPE, before, chunk, 6, "eager") == expected


def test_padded_mask_bytes_follow_the_padded_attention():
    for before, chunk in ((0, 10), (5, 10)):
        keys = before + chunk
        # padded_attention: torch.ones(n, n, dtype=torch.bool).tril() with n = memory + chunk
        expected = _without_mask(before, chunk, 6, "padded") + keys * keys
        assert attention_bytes(SHAPE, before, chunk, 6, "padded") == expected


# ---- 4. the cache copy term when memory shrinks ----------------------------------------------------
def test_the_cache_copy_counts_the_larger_of_memory_before_and_after():
    """Appending the chunk concatenates (DynamicCache: torch.cat of the memory and the chunk, the
    old memory alive until the new tensor exists), eviction gathers the kept entries beside the
    full cache: the transient copy is max(before, after) entries. When memory shrinks (24 -> 6)
    that is the 24 entries before, not the 6 after."""
    output, entry = 4 * 10 * 16 * 2, SHAPE.kv_bytes_per_entry
    assert entry == 2 * 2 * 16 * 2
    assert attention_bytes(SHAPE, 24, 10, 6) == output + 24 * entry  # shrinking
    assert attention_bytes(SHAPE, 6, 10, 24) == output + 24 * entry  # growing
    assert attention_bytes(SHAPE, 24, 10, 24) == output + 24 * entry


# ---- 5. the planner's scorer gather bytes ---------------------------------------------------------
def test_the_planners_scorer_moves_the_cache_into_the_kept_entries():
    """memstep's one pass gives the column sums with the attention; the scorer then adds them up
    (heads x query-key pairs FLOPs) and gathers the kept entries: it reads the layer's memory +
    chunk entries and writes the kept ones, (keys + after) x KV entry bytes per layer. Nothing
    is gathered when nothing is evicted."""
    from memstep.planner import attention_pairs, step_work

    entry = SHAPE.kv_bytes_per_entry
    flops, moved = step_work(SHAPE, 30, 20, 40)["scorer"]
    assert flops == 2 * 4 * attention_pairs(30, 20, "sdpa")
    assert moved == 2 * (50 + 40) * entry
    assert step_work(SHAPE, 30, 20, 50)["scorer"] == (0, 0)  # keys == after: no eviction
    assert step_work(SHAPE, 30, 20, 40, scoring=False)["scorer"] == (0, 0)  # the full schedule
    padded_flops, padded_moved = step_work(SHAPE, 30, 20, 40, attention="padded")["scorer"]
    assert padded_moved == 2 * (4 * 20 * 50 * 2 + (50 + 40) * entry)  # + the maps' chunk rows read


# ---- 6. SparseGPT's criterion w^2 / [H^-1]_jj^2 ---------------------------------------------------
def test_sparsegpt_prunes_by_w_squared_over_the_inverse_hessian_diagonal_squared():
    """A diagonal Hessian H = diag(h) without damping: H^-1 = diag(1/h), its upper Cholesky factor
    diag(1/sqrt(h)), so d_j^2 = 1/h_j and the criterion w^2 / d^2 is w^2 x h. With h = [16, 1, 1,
    0.25]: row [0.5, 1.5, 1.0, 2.5] scores [4, 2.25, 1, 1.5625], row [1.5, 0.5, 0.5, 1.5] scores
    [36, 0.25, 0.25, 0.5625]; at 50% of the block the four lowest go (0.25, 0.25, 0.5625, 1).
    Magnitude (w^2), w^2/d, |w|/d^2 and w^2 x d^2 each choose another mask here. A diagonal H^-1
    makes the OBS update zero: the survivors keep their values."""
    from memstep.compress.sparse.masks import Pattern, sparsegpt_prune

    weight = torch.tensor([[0.5, 1.5, 1.0, 2.5], [1.5, 0.5, 0.5, 1.5]])
    hessian = torch.diag(torch.tensor([16.0, 1.0, 1.0, 0.25]))
    new, keep = sparsegpt_prune(weight, hessian, Pattern(sparsity=0.5), block_columns=4, damp=0.0)
    expected = torch.tensor([[True, True, False, True], [True, False, False, False]])
    assert keep.tolist() == expected.tolist()
    torch.testing.assert_close(new, weight * expected)


# ---- 7. block reconstruction: the loss is normalized by the target --------------------------------
def test_block_reconstruction_loss_is_the_error_over_the_targets_energy():
    from memstep.compress.sparse.blocks import call_block, decoder_layers, embed, layer_kwargs, linear_layers
    from memstep.compress.sparse.config import TrainOptions
    from memstep.compress.sparse.reconstruct import train_blocks

    model = make_tiny_model(layers=1, seed=5)
    kwargs = layer_kwargs(model, 12)
    x = embed(model, torch.randint(0, 128, (3, 12), generator=torch.Generator().manual_seed(1)).tolist())
    block = decoder_layers(model)[0]
    masks = [{name: torch.ones_like(lin.weight) for name, lin in linear_layers(block).items()}]
    with torch.no_grad():
        start = call_block(block, x, kwargs[0])
    for scale in (1.0, 1000.0):  # the loss does not depend on the target's scale when the error scales too
        target = scale * (start + 0.1 * torch.randn(start.shape, generator=torch.Generator().manual_seed(2)))
        state = {k: v.clone() for k, v in block.state_dict().items()}
        with torch.no_grad():
            current = call_block(block, x, kwargs[0])
        losses = train_blocks([block], 0, kwargs, masks, x, target, TrainOptions(lr=1e-9, steps=1, batch_size=3))
        expected = ((current - target) ** 2).mean() / (target ** 2).mean()
        assert losses[0] == pytest.approx(float(expected), rel=1e-4)
        block.load_state_dict(state)


# ---- 8. Latin code pages that tie decode with cp1252 -----------------------------------------------
def test_a_latin_code_page_tie_is_won_by_cp1252():
    """0xBD is '½' in cp1252 (typographic: +1) and 'œ' in ISO 8859-15 (a letter between letters:
    +1): the two decodings score the same, and cp1252, the common one, must win the tie."""
    from memstep.documents import _LATIN_ENCODINGS, _decode_text, _latin_score

    data = ("Le c\xbdur a ses raisons que la raison ne conna\xeet point. " * 6).encode("latin-1")
    cp1252, latin9 = data.decode("cp1252"), data.decode("iso8859_15")
    assert cp1252 != latin9 and _latin_score(cp1252) == _latin_score(latin9)  # a real tie, decoded apart
    assert _LATIN_ENCODINGS[0] == "cp1252"
    assert _decode_text(data, "note.txt") == cp1252


# ---- 10. GQA: 8 query heads over 2 KV heads -------------------------------------------------------
def reference_attention(q, k, v, scaling):
    """Lower-right causal attention written out: K/V repeated as transformers' repeat_kv does
    (query head h reads KV head h // groups), an explicit mask, float64 softmax."""
    heads, kv_heads = q.shape[1], k.shape[1]
    groups, rows, keys = heads // kv_heads, q.shape[2], k.shape[2]
    k = k[:, :, None].expand(-1, -1, groups, -1, -1).reshape(1, heads, keys, -1)
    v = v[:, :, None].expand(-1, -1, groups, -1, -1).reshape(1, heads, keys, -1)
    logits = (q.double() @ k.double().transpose(-1, -2)) * scaling
    visible = torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
    probabilities = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    return (probabilities @ v.double()).float(), probabilities[0].float()


def test_attention_with_8_query_heads_over_2_kv_heads():
    g = torch.Generator().manual_seed(8)
    q, k, v = torch.randn(1, 8, 11, 16, generator=g), torch.randn(1, 2, 20, 16, generator=g), \
        torch.randn(1, 2, 20, 16, generator=g)
    expected, probabilities = reference_attention(q, k, v, 0.25)
    torch.testing.assert_close(attention.sdpa_lower_right(q, k, v, 0.25), expected, **TIGHT)
    out, sums = attention.one_pass_attention(q, k, v, 0.25, ranges=((0, None), (6, None)), block=4)
    torch.testing.assert_close(out, expected, **TIGHT)
    torch.testing.assert_close(sums[(0, None)], model_groups(probabilities.sum(dim=1), 2), **TIGHT)
    torch.testing.assert_close(sums[(6, None)], model_groups(probabilities[:, 6:].sum(dim=1), 2), **TIGHT)
    padded_out, padded_sums = attention.padded_attention(q, k, v, 0.25)
    torch.testing.assert_close(padded_out, expected, **TIGHT)
    torch.testing.assert_close(padded_sums[(0, None)], sums[(0, None)], **TIGHT)


def test_scorer_sums_with_8_query_heads_over_2_kv_heads():
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(8, 7, 16, generator=g), torch.randn(2, 12, 16, generator=g)
    layer = LayerState(q, k, torch.randn(2, 12, 16, generator=g), torch.arange(12).expand(2, -1), 0.25)
    _, probabilities = reference_attention(q[None], k[None], k[None], 0.25)
    torch.testing.assert_close(layer.attention_sum(), model_groups(probabilities.sum(dim=1), 2), **TIGHT)
    torch.testing.assert_close(layer.attention_sum(3), model_groups(probabilities[:, 3:].sum(dim=1), 2), **TIGHT)


def test_engine_with_8_query_heads_over_2_kv_heads():
    """A budget that covers the document reproduces the full prefill, and the scorer's sums on a
    compressed cache equal what transformers' eager attention computes, grouped as the model
    groups its heads."""
    model = gqa_model(layers=2, seed=11)
    ids = random_ids(96, seed=11)
    with torch.no_grad():
        full = model.model(input_ids=ids[None], use_cache=False).last_hidden_state[0]
    engine = ChunkedPrefill(model, ChunkAttention(), sinks=2, rope="document", collect_hidden=True)
    records = list(engine.run(ids, make_schedule("fm", 96, 32, 96)))
    assert records[-1].kept_positions.shape == (2, 2, 96)
    torch.testing.assert_close(torch.cat(engine.hidden_chunks), full, rtol=1e-4, atol=2e-5)

    eager = gqa_model(layers=2, seed=11, eager=True)
    probabilities, sums = {}, []

    def keep_probabilities(module, args, output):
        probabilities[module.layer_idx] = output[1][0]

    class Capture(ChunkAttention):
        def score(self, layer):
            sums.append((layer.layer, layer.attention_sum().clone()))
            return super().score(layer)

    handles = [layer.self_attn.register_forward_hook(keep_probabilities) for layer in eager.model.layers]
    try:
        checked = 0
        for _ in ChunkedPrefill(eager, Capture(), sinks=2, rope="document").run(ids, make_schedule("fm", 96, 32, 20)):
            for layer_idx, total in sums:
                real = probabilities[layer_idx].float()  # (8 heads, chunk, keys)
                # the scorer sees the keys after the 2 sinks (the reference's sink handling)
                torch.testing.assert_close(total, model_groups(real.sum(dim=1), 2)[..., 2:], **TIGHT)
                checked += 1
            sums.clear()
    finally:
        for handle in handles:
            handle.remove()
    assert checked == 2 * 3
