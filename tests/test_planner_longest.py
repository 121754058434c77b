"""The planner's longest context, checked against plan() itself: the longest context T is the
largest length whose planned peak fits (plan at T fits, plan at T + 1 does not), with the
weights and the question the plan is made for. Two ways to get it wrong: the multi-GPU split
searched with the unquantized model, and the search leaving out the question's tokens."""

from __future__ import annotations

import dataclasses

from memstep import planner
from memstep.planner.needs import pooled

SETTINGS = dict(chunk=1024, memory=1024, growth="linear", attention="sdpa", dtype="bf16", sinks=4,
                keep_maps=False, rope="compact")


def assert_longest(longest, shape, gpu, schedule, **settings):
    """``longest`` is the largest length whose plan fits ``gpu`` (plan() is the reference)."""
    def fits(tokens):
        return planner.plan(shape, gpu, schedule=schedule, tokens=tokens, **SETTINGS, **settings).fits

    assert not longest.unlimited and longest.tokens > 0
    assert fits(longest.tokens) and not fits(longest.tokens + 1), longest


def test_the_split_longest_context_counts_the_quantized_weights():
    """Llama-3.1-70B in int4 (about 35 GB of weights) needs two 24 GB L4s with its whole cache:
    the longest context on the pair is found with int4 weights, which leave more room than bf16."""
    shape, gpu = planner.resolve_model("llama-3.1-70b", "bf16"), planner.resolve_gpu("l4")
    needs = {(n.schedule, n.weights): n
             for n in planner.what_it_takes(shape, gpu, ["full"], dict(tokens=32768, **SETTINGS), ["int4", "int8"])}
    int4 = needs[("full", "int4")]
    assert int4.gpus >= 2 and int4.longest_split is not None
    quantized = planner.with_weights(shape, "int4")
    assert_longest(int4.longest_split, quantized, pooled(gpu, int4.gpus), "full")
    # the bf16 model on the same GPUs holds a shorter context: the weights' bytes matter here
    unquantized = planner.longest_context(shape, pooled(gpu, int4.gpus), "full", **SETTINGS)
    assert unquantized.tokens < int4.longest_split.tokens


def test_the_longest_context_reads_the_question_with_every_step():
    """An FM plan's peak is flat once the chunk is full; a GPU sized between the peak without a
    question and the peak with 512 question tokens read after every chunk holds any length
    without the question, and only a shorter chunk's worth of document with it."""
    shape = planner.resolve_model("llama-3.1-8b", "bf16")
    peak = {q: planner.plan(shape, "l4", schedule="fm", tokens=65536, question_tokens=q, **SETTINGS).peak_bytes
            for q in (0, 512)}
    assert peak[512] > peak[0]
    base = planner.resolve_gpu("l4")
    gpu = dataclasses.replace(base, memory_bytes=base.memory_bytes - base.usable_bytes + (peak[0] + peak[512]) // 2)
    assert planner.longest_context(shape, gpu, "fm", **SETTINGS).unlimited
    with_question = planner.longest_context(shape, gpu, "fm", question_tokens=512, **SETTINGS)
    assert_longest(with_question, shape, gpu, "fm", question_tokens=512)
