"""Behaviours a deliberate-bug check of the suite found untested (issue 12): each test
fails when the behaviour it names is broken. Tiny models and hand-computed values; fast."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import make_tiny_model
from test_models import tiny_lm, tiny_lm_folder  # noqa: F401  (fixtures)

from memstep import planner
from memstep.engine import ChunkedPrefill
from memstep.generate import answer, prompt_parts
from memstep.memory import ModelShape, attention_bytes, kv_peak_entries, step_bytes
from memstep.runner import DocumentRun
from memstep.schedules import check_run_settings, custom_schedule, make_schedule
from memstep.scorers import VATP, LayerState, RandomScorer, select_kept

GIB = 1 << 30


def test_a_run_whose_chunk_equals_the_document_length(tiny_lm):  # noqa: F811
    ids = tiny_lm.tokenizer("The rain in Spain stays mainly in the plain. " * 6, add_special_tokens=False)["input_ids"]
    head = len(prompt_parts(tiny_lm.tokenizer).head)
    tokens = head + len(ids)
    check_run_settings("fm", tokens, tokens, 16, 4)  # equal is allowed
    run = DocumentRun(tiny_lm, ids, schedule="fm", chunk=tokens, memory=16, sinks=4)
    records = list(run)
    assert [r.chunk_size for r in records] == [tokens]
    assert records[0].memory_before == 0 and records[0].memory_after == 16 + 4 and records[0].evicted


def test_vatp_uses_the_l1_norm_not_the_l2_norm():
    # equal attention (zero queries and keys); value vectors [1, 1] (L1 2, L2 1.41) and [1.5, 0] (L1 1.5, L2 1.5)
    values = [[[1.0, 1.0], [1.5, 0.0], [0.1, 0.0]]]
    layer = LayerState(torch.zeros(1, 1, 2), torch.zeros(1, 3, 2), torch.tensor(values), torch.arange(3)[None], 1.0)
    scores = VATP().score(layer)
    torch.testing.assert_close(scores, torch.tensor([[2 / 3, 0.5, 0.1 / 3]]))
    assert select_kept(scores, layer.positions, keep=1, sinks=0).tolist() == [[0]]  # L2 would keep position 1


def test_the_random_scorer_restarts_its_stream_when_the_engine_runs_again():
    model = make_tiny_model()
    engine = ChunkedPrefill(model, RandomScorer(seed=5), sinks=2)
    ids = torch.arange(3, 67)
    schedule = make_schedule("fm", 64, 16, 8)
    first = [r.kept_positions.copy() for r in engine.run(ids, schedule)]
    second = [r.kept_positions.copy() for r in engine.run(ids, schedule)]
    assert all((a == b).all() for a, b in zip(first, second))
    other = [r.kept_positions.copy() for r in ChunkedPrefill(model, RandomScorer(seed=6), sinks=2).run(ids, schedule)]
    assert any((a != b).any() for a, b in zip(first, other))  # the seed matters: the test can fail


def test_kv_peak_of_a_custom_schedule_whose_memory_shrinks():
    model = make_tiny_model(layers=3)
    engine = ChunkedPrefill(model, sinks=0)
    schedule = custom_schedule(60, [30, 10, 20], [24, 6, 6])  # memory shrinks from 24 to 6
    shape = engine.shape
    for record in engine.run(torch.arange(5, 65), schedule):
        before, chunk, after = record.memory_before, record.chunk_size, record.memory_after
        # while layer 0 scores, every later layer still holds the memory it started with
        expected = (before + chunk) + (shape.layers - 1) * max(after, before)
        assert kv_peak_entries(shape, before, chunk, after) == expected
        assert record.kv_bytes_actual == expected * shape.kv_bytes_per_entry
    assert (before, after) == (6, 6) and record.step == 2
    assert kv_peak_entries(shape, 24, 10, 6) == 34 + 2 * 24  # the shrinking step: not 34 + 2 * 6


SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128,
                   params=1000, dtype_bytes=2)


def test_step_zero_attention_needs_no_mask():
    # no memory: is_causal, no mask; output 4 heads * 10 * 16 * 2 bytes; cache copy
    # max(after, before) * kv entry (2 * 2 * 16 * 2 = 128 bytes)
    # (SDPA runs GQA natively: no repeated K/V)
    output = 4 * 10 * 16 * 2
    assert attention_bytes(SHAPE, 0, 10, 6) == output + 6 * 128
    # with a memory of 5: memstep's attention still builds no mask (CPU splits the step, CUDA
    # takes a lower-right bias); eager's explicit chunk x keys mask (10 x 15, in the model's
    # 2-byte dtype) is there at every step
    assert attention_bytes(SHAPE, 5, 10, 6) == output + 6 * 128
    repeated = 2 * 4 * 15 * 16 * 2  # eager repeats K/V to every query head
    scores = 2 * 4 * 10 * 15 * 4  # and holds float32 scores and probabilities
    assert attention_bytes(SHAPE, 5, 10, 6, "eager") == 10 * 15 * 2 + repeated + output + scores + 6 * 128


def test_scorer_working_set_counts_the_devices_one_pass_block():
    # a step that cuts the layer: memory 100, chunk 500, 600 keys; blocks of 32 query rows on
    # CPU, 256 on CUDA; logits + probabilities float32, 4 heads
    cpu = step_bytes(SHAPE, 100, 500, 60, device="cpu")["attention"]
    cuda = step_bytes(SHAPE, 100, 500, 60, device="cuda")["attention"]
    assert cuda - cpu == 2 * 4 * (256 - 32) * 600 * 4
    # a chunk shorter than the block: the whole chunk is one block
    short = step_bytes(SHAPE, 100, 200, 60, device="cuda")["attention"] - step_bytes(SHAPE, 100, 200, 60, device="cpu")["attention"]
    assert short == 2 * 4 * (200 - 32) * 300 * 4
    assert step_bytes(SHAPE, 100, 500, 60)["attention"] == cuda  # the planner plans GPUs
    # no eviction: no scorer working set on either device
    assert step_bytes(SHAPE, 100, 200, 300, device="cpu") == step_bytes(SHAPE, 100, 200, 300, device="cuda")


def test_planner_fits_when_the_peak_equals_the_usable_bytes():
    plan = planner.plan("smollm2-135m", "l4", schedule="fm", tokens=4096, chunk=512, memory=512)
    usable = plan.gpu.memory_bytes - plan.gpu.usable_bytes  # what the context and allocator take
    exact = dataclasses.replace(plan.gpu, memory_bytes=plan.peak_bytes + usable)
    assert exact.usable_bytes == plan.peak_bytes
    assert dataclasses.replace(plan, gpu=exact).fits
    assert not dataclasses.replace(plan, gpu=dataclasses.replace(exact, memory_bytes=exact.memory_bytes - 1)).fits


def test_planner_flops_size_the_kv_projections_by_kv_heads():
    # Llama-3.1-8B: 32 heads, 8 KV heads, head_dim 128, hidden 4096, MLP 14336
    shape = planner.resolve_model("llama-3.1-8b")
    per_layer = 4096 * (2 * 32 * 128 + 2 * 8 * 128) + 3 * 4096 * 14336
    assert per_layer == 218_103_808 and planner.layer_linear_params(shape) == per_layer
    assert planner.step_work(shape, 0, 10, 10)["linear"][0] == 2 * 10 * 32 * per_layer
    mha = dataclasses.replace(shape, kv_heads=32)
    assert planner.layer_linear_params(mha) - per_layer == 4096 * 2 * (32 - 8) * 128


def test_full_schedule_keeps_the_whole_passkey_through_the_api(tiny_lm_folder):  # noqa: F811
    from ui import api

    text = ("It was a bright cold day in April. " * 8 + "The magic number for the lighthouse is 48213. "
            + "The clocks were striking thirteen. " * 8)
    updates = list(api.prefill(document_text=text, schedule="full", model=str(tiny_lm_folder), max_tokens=400))
    result = updates[-1]
    assert result["event"] == "result" and result["passkey"] == "48213"
    assert result["passkey_kept"] == 1.0  # nothing is evicted under full: exactly every slot
    fm = list(api.prefill(document_text=text, schedule="fm", chunk=32, memory=16, model=str(tiny_lm_folder)))[-1]
    assert fm["passkey_kept"] < 1.0  # an evicting schedule loses some of it: the check can fail


def test_the_question_goes_through_the_chat_template_and_advances_positions(tiny_lm):  # noqa: F811
    tokenizer = tiny_lm.tokenizer
    question = "What is the magic number?"
    head = prompt_parts(tokenizer).head
    ids = head + tokenizer("A short document about numbers. " * 4, add_special_tokens=False)["input_ids"]
    engine = ChunkedPrefill(tiny_lm.model, sinks=4)
    calls = []  # (token ids, the position the engine runs them at)
    forward = engine.forward

    def spy(ids, position, *args, **kwargs):
        calls.append((ids[0].tolist(), position))
        return forward(ids, position, *args, **kwargs)

    engine.forward = spy
    list(engine.run(ids, make_schedule("fm", len(ids), 16, 16)))
    prefill, after_prefill = len(calls), engine.position
    answer(engine, tokenizer, question, max_new_tokens=3)
    tail = prompt_parts(tokenizer, question).tail
    assert "What is the magic number?" in tokenizer.decode(tail) and "assistant" in tokenizer.decode(tail)
    asked = calls[prefill:]
    assert prefill >= 1 and len(asked) >= 2
    assert asked[0][0] == tail  # the question arrives inside the template's tail, not bare
    assert asked[0][1] == after_prefill  # the question starts where the prefill left off
    for (before, at), (_, nxt) in zip(asked, asked[1:]):
        assert nxt == at + len(before)  # each answer token one position further
