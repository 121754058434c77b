"""What it takes (memstep.planner.needs and the Plan tab's answer panel): int8/int4 weights
counted in bytes only, the fewest GPUs of a kind, the longest context on one of them."""

from __future__ import annotations

import math

import pytest

from memstep import planner
from memstep.errors import MemstepError
from memstep.planner.needs import pooled

SETTINGS = dict(tokens=32768, chunk=1024, memory=1024, growth="linear", attention="sdpa", dtype="bf16", sinks=4,
                keep_maps=False, rope="compact")


def test_quantized_weights_change_the_weight_bytes_only():
    shape = planner.resolve_model("llama-2-7b", "bf16")
    gpu = planner.resolve_gpu("a100-80gb")
    plans = {w: planner.plan(planner.with_weights(shape, w), gpu, schedule="imdc", **SETTINGS)
             for w in ("dtype", "int8", "int4")}
    weights = {w: p.steps[0].parts["weights"] for w, p in plans.items()}
    assert weights["dtype"] == shape.params * 2  # bf16: 2 bytes per parameter
    assert weights["int8"] == shape.params and weights["int4"] == math.ceil(shape.params / 2)
    for w in ("int8", "int4"):  # the KV cache, activations and the time stay at the dtype
        for part in ("kv_memory", "kv_chunk", "attention", "activations"):
            assert plans[w].steps[3].parts[part] == plans["dtype"].steps[3].parts[part]
        assert plans[w].seconds == pytest.approx(plans["dtype"].seconds)
    with pytest.raises(MemstepError, match="unknown weights"):
        planner.with_weights(shape, "int3")


def test_what_it_takes_a_70b_model_on_80_gb_gpus():
    shape = planner.resolve_model("llama-3.1-70b", "bf16")
    gpu = planner.resolve_gpu("a100-80gb")
    needs = {(n.schedule, n.weights): n for n in planner.what_it_takes(shape, gpu, ["imdc", "full"], SETTINGS)}
    # bf16 weights (131 GiB) need two 80 GB GPUs: nothing fits on one, a long context on two
    bf16 = needs[("imdc", "dtype")]
    assert bf16.gpus == 2 and bf16.longest.tokens == 0 and bf16.longest_split is not None
    assert bf16.longest_split.unlimited  # IMDC's steady step fits: no limit on two
    assert bf16.gpus == math.ceil(bf16.peak_bytes / gpu.usable_bytes)
    # int8 (65 GiB) fits one; int4 leaves the full prefill room for a longer context than int8
    assert needs[("imdc", "int8")].gpus == 1 and needs[("imdc", "int8")].longest.unlimited
    full8, full4 = needs[("full", "int8")], needs[("full", "int4")]
    assert full4.longest.tokens > (full8.longest.tokens if full8.gpus == 1 else 0)
    assert pooled(gpu, 3).usable_bytes == 3 * gpu.usable_bytes


def test_the_plan_tab_answers_what_it_takes():
    from ui.tabs import plan as tab

    plans, _, needs = tab.compute("llama-3.1-70b", None, "a100-80gb", "bf16", 32768, 1024, 1024, "linear", "sdpa",
                                  ["fm", "imdc", "full"], 4)
    text = tab.what_it_takes(needs, plans["fm"].gpu, "bf16", 32768)
    assert text.startswith("**What it takes** on A100 80GB")
    # a small table: one row per schedule and weight format, one column per question
    assert "| schedule | weights | GPUs needed | longest context on one GPU |" in text
    rows = [line for line in text.splitlines() if line.startswith("| IMDC")]
    cap = needs[0].longest.cap if needs[0].longest.unlimited else 16_777_216
    assert rows[0] == f"| IMDC | bf16 | 2 | nothing fits; on 2: any length (checked up to {cap:,} tokens) |"
    assert rows[1:] == [f"| IMDC | {w} | 1 | any length (checked up to {cap:,} tokens) |" for w in ("int8", "int4")]
    assert "no limit (" not in text and " / " not in text  # no self-contradiction, no slash-packed triples
    quantized, _, _ = tab.compute("llama-3.1-70b", None, "a100-80gb", "bf16", 32768, 1024, 1024, "linear", "sdpa",
                                  ["imdc"], 4, weights="int4")
    assert quantized["imdc"].fits and not plans["imdc"].fits


def test_plan_cli_takes_int4_weights(capsys):
    from memstep.cli import main

    assert main(["plan", "--model", "llama-3.1-70b", "--gpu", "a100-80gb", "--tokens", "32768", "--weights",
                 "int4"]) == 0
    out = capsys.readouterr().out
    assert "int4 weights (bytes only)" in out and "longest context that fits: no limit" in out
