"""memstep's attention function (memstep/attention.py): the one pass that also yields the
scores, the plain lower-right causal SDPA and its fallbacks, and the reference's padded
attention, against SDPA and against the scorer's own computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_tiny_model
from test_models import tiny_lm, tiny_lm_folder  # noqa: F401  (fixtures)

import memstep.attention as attention
from memstep.engine import ChunkedPrefill
from memstep.schedules import make_schedule
from memstep.scorers import ChunkAttention, LayerState, make_scorer

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
EXACT = dict(rtol=1e-5, atol=1e-6)


def tensors(heads, kv_heads, rows, memory, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, rows, dim, generator=g)
    k = torch.randn(1, kv_heads, memory + rows, dim, generator=g)
    v = torch.randn(1, kv_heads, memory + rows, dim, generator=g)
    return q, k, v


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (6, 1)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("block", [3, 256])
def test_one_pass_equals_sdpa_and_the_scorers_sums(heads, kv_heads, block):
    q, k, v = tensors(heads, kv_heads, rows=11, memory=9)
    out, sums = attention.one_pass_attention(q, k, v, 0.25, ranges=((0, None), (6, None), (2, 5)), block=block)
    expected = attention.sdpa_lower_right(q, k, v, 0.25)
    torch.testing.assert_close(out, expected, **EXACT)
    state = LayerState(q[0], k[0], v[0], torch.arange(20).expand(kv_heads, -1), 0.25)
    for first in (0, 6):
        torch.testing.assert_close(sums[(first, None)], state.attention_sum(first), **EXACT)
    # a middle range: rows 2..4 = rows from 2 on less rows from 5 on
    torch.testing.assert_close(sums[(2, 5)], state.attention_sum(2) - state.attention_sum(5), **EXACT)
    # every query row's probabilities add up to one: rows x heads in all
    assert torch.isclose(sums[(0, None)].sum(), torch.tensor(11.0 * heads))


def test_padded_attention_equals_the_chunk_rows_of_full_attention():
    q, k, v = tensors(4, 2, rows=5, memory=7)
    out, sums = attention.padded_attention(q, k, v, 0.25, ranges=((0, None), (1, 3)))
    torch.testing.assert_close(out, attention.sdpa_lower_right(q, k, v, 0.25), **EXACT)
    _, one_pass = attention.one_pass_attention(q, k, v, 0.25, ranges=((0, None), (1, 3)))
    for key in ((0, None), (1, 3)):
        torch.testing.assert_close(sums[key], one_pass[key], **EXACT)


def masked_reference(q, k, v, scaling):
    """Lower-right causal attention written out in float64 with repeated KV heads."""
    rows, keys = q.shape[2], k.shape[2]
    groups = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    logits = q.double() @ k.transpose(-1, -2) * scaling
    hidden = torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows).logical_not()
    return torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (6, 1), (9, 3)], ids=["gqa", "mha", "mqa", "gqa3"])
@pytest.mark.parametrize("rows,memory", [(11, 9), (5, 1), (2, 300), (40, 3)])
def test_split_cpu_attention_equals_lower_right_causal(heads, kv_heads, rows, memory, dtype, tolerance):
    """The CPU path of a step that needs no scores: the memory part and the causal square as
    two flash calls merged by log-sum-exp, against the attention written out; the queries
    arrive transposed, as the model's projection hands them over."""
    q, k, v = tensors(heads, kv_heads, rows, memory, seed=rows + memory)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)
    expected = masked_reference(q, k, v, 0.3)
    out = attention.split_lower_right(q.to(dtype), k.to(dtype), v.to(dtype), 0.3)
    assert out is not None and out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(attention.sdpa_lower_right(q, k, v, 0.3).double(), expected, rtol=1e-5, atol=1e-6)


def test_split_attention_steps_aside_where_the_kernel_is_missing_or_refuses(monkeypatch):
    q, k, v = tensors(4, 2, rows=6, memory=10)
    expected = masked_reference(q, k, v, 0.3)
    monkeypatch.setattr(attention, "_flash_cpu", None)  # a torch without the CPU flash kernel
    assert attention.split_lower_right(q, k, v, 0.3) is None
    torch.testing.assert_close(attention.sdpa_lower_right(q, k, v, 0.3).double(), expected, rtol=1e-5, atol=1e-6)

    def refuses(*args, **kwargs):
        raise RuntimeError("not for these inputs")

    monkeypatch.setattr(attention, "_flash_cpu", refuses)
    assert attention.split_lower_right(q, k, v, 0.3) is None
    torch.testing.assert_close(attention.sdpa_lower_right(q, k, v, 0.3).double(), expected, rtol=1e-5, atol=1e-6)
    assert attention.split_lower_right(q.double(), k.double(), v.double(), 0.3) is None  # dtype the kernel lacks


def test_fallbacks_without_the_causal_bias_or_native_gqa(monkeypatch):
    q, k, v = tensors(4, 2, rows=6, memory=10)
    expected = attention.sdpa_lower_right(q, k, v, 0.3)
    monkeypatch.setattr(attention, "_flash_cpu", None)  # SDPA's own paths, as on other devices
    monkeypatch.setattr(attention, "causal_lower_right", None)  # an older torch: an explicit mask
    torch.testing.assert_close(attention.sdpa_lower_right(q, k, v, 0.3), expected, **EXACT)
    real = torch.nn.functional.scaled_dot_product_attention

    def no_gqa(*args, enable_gqa=False, **kwargs):  # a backend that rejects native GQA
        if enable_gqa:
            raise RuntimeError("enable_gqa is not supported here")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", no_gqa)
    torch.testing.assert_close(attention.sdpa_lower_right(q, k, v, 0.3), expected, **EXACT)


class Recomputing(ChunkAttention):
    """chunk-attention that asks for no column sums: the scorer recomputes the query-key
    products itself (the path before the one-pass attention)."""

    def attention_rows(self, chunk):
        return ()


def run(model, ids, schedule, scorer, **kwargs):
    engine = ChunkedPrefill(model, scorer, sinks=4, collect_hidden=True, **kwargs)
    records = list(engine.run(ids, schedule))
    return torch.cat(engine.hidden_chunks), [r.kept_positions for r in records]


@pytest.mark.parametrize("rope", ["compact", "document", "shared"])
@pytest.mark.parametrize("family", FAMILIES)
def test_engine_one_pass_equals_the_recomputing_scorer(family, rope):
    model = make_tiny_model(family, layers=2, seed=4)
    ids = torch.randint(0, 128, (230,), generator=torch.Generator().manual_seed(4))
    schedule = make_schedule("imdc", 230, 64, 48)
    hidden, kept = run(model, ids, schedule, ChunkAttention(), rope=rope)
    hidden_ref, kept_ref = run(model, ids, schedule, Recomputing(), rope=rope)
    assert all(np.array_equal(a, b) for a, b in zip(kept, kept_ref)), family
    torch.testing.assert_close(hidden, hidden_ref, **EXACT)


@pytest.mark.parametrize("scorer", ["chunk-attention", "conv", "snapkv", "vatp"])
def test_padded_reference_attention_keeps_the_same_sets(scorer):
    model = make_tiny_model("llama", layers=3, seed=5)
    ids = torch.randint(0, 128, (260,), generator=torch.Generator().manual_seed(5))
    schedule = make_schedule("fm", 260, 64, 40)
    hidden, kept = run(model, ids, schedule, make_scorer(scorer))
    hidden_padded, kept_padded = run(model, ids, schedule, make_scorer(scorer), attention="padded")
    assert all(np.array_equal(a, b) for a, b in zip(kept, kept_padded))
    torch.testing.assert_close(hidden, hidden_padded, rtol=1e-4, atol=1e-4)


def test_cpu_engine_steps_without_scores_take_the_split_kernel(monkeypatch):
    """On CPU a step over a memory that needs no scores runs the split flash calls (no mask),
    and the hidden states equal those of SDPA with an explicit lower-right mask."""
    calls = []
    split = attention.split_lower_right

    def counted(*args, **kwargs):
        out = split(*args, **kwargs)
        calls.append(out is not None)
        return out

    model = make_tiny_model("qwen2", layers=2, seed=7)
    ids = torch.randint(0, 128, (150,), generator=torch.Generator().manual_seed(7))
    schedule = make_schedule("fm", 150, 32, 40)
    monkeypatch.setattr(attention, "split_lower_right", counted)
    hidden, kept = run(model, ids, schedule, make_scorer("recency"))
    assert calls and all(calls) and len(calls) == 2 * (schedule.steps - 1)  # every layer of every step after the first
    monkeypatch.setattr(attention, "split_lower_right", lambda *args, **kwargs: None)  # SDPA's own mask path
    hidden_masked, kept_masked = run(model, ids, schedule, make_scorer("recency"))
    assert all(np.array_equal(a, b) for a, b in zip(kept, kept_masked))
    torch.testing.assert_close(hidden, hidden_masked, **EXACT)


def test_padded_reference_attention_gives_the_same_answer(tiny_lm):  # noqa: F811
    """Through the whole path a user takes: prefill with eviction, then a greedy answer from
    the memory; padded and memstep's attention agree on the answer and its logits."""
    from memstep.generate import _extend, answer, prompt_parts

    tokenizer = tiny_lm.tokenizer
    ids = prompt_parts(tokenizer).head + tokenizer("The magic number is 4417. " * 12,
                                                   add_special_tokens=False)["input_ids"]
    schedule = make_schedule("imdc", len(ids), 32, 24)
    results = {}
    for mode in ("sdpa", "padded"):
        engine = ChunkedPrefill(tiny_lm.model, make_scorer("chunk-attention"), sinks=4, attention=mode)
        kept = [r.kept_positions for r in engine.run(ids, schedule)]
        mark = [p.clone() for p in engine.positions], engine.position
        first = _extend(engine, prompt_parts(tokenizer, "What is the magic number?").tail, logits_to_keep=1)
        list(engine.run(ids, schedule))  # the same memory again, for the whole greedy answer
        results[mode] = (kept, first, answer(engine, tokenizer, "What is the magic number?", max_new_tokens=6), mark)
    (kept, first, said, mark), (kept_p, first_p, said_p, mark_p) = results["sdpa"], results["padded"]
    assert all(np.array_equal(a, b) for a, b in zip(kept, kept_p))
    assert all(torch.equal(a, b) for a, b in zip(mark[0], mark_p[0])) and mark[1] == mark_p[1]
    torch.testing.assert_close(first, first_p, rtol=1e-4, atol=1e-4)
    assert said == said_p


def test_one_pass_runs_only_where_a_layer_is_cut(monkeypatch):
    """Steps that evict nothing, and scorers that read no attention, take plain SDPA."""
    calls = {"one_pass": 0, "sdpa": 0}
    one_pass, sdpa = attention.one_pass_attention, attention.sdpa_lower_right

    def count(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(attention, "one_pass_attention", count("one_pass", one_pass))
    monkeypatch.setattr(attention, "sdpa_lower_right", count("sdpa", sdpa))
    model = make_tiny_model("llama", layers=2, seed=6)
    ids = torch.randint(0, 128, (160,), generator=torch.Generator().manual_seed(6))
    schedule = make_schedule("fm", 160, 32, 40)  # step 0 keeps all 32: no eviction there
    list(ChunkedPrefill(model, make_scorer("chunk-attention")).run(ids, schedule))
    assert calls == {"one_pass": 2 * 4, "sdpa": 2 * 1}
    calls.update(one_pass=0, sdpa=0)
    list(ChunkedPrefill(model, make_scorer("recency")).run(ids, schedule))
    assert calls == {"one_pass": 0, "sdpa": 2 * 5}


def test_engine_rejects_an_unknown_attention():
    from memstep.errors import MemstepError

    with pytest.raises(MemstepError, match="unknown attention 'flash'"):
        ChunkedPrefill(make_tiny_model("llama", layers=1), attention="flash")
