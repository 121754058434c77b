"""The planner: formulas against hand-computed values, bad input, speed at 1M tokens, and
the modeled KV bytes against the engine's real cache tensors."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from memstep import planner
from memstep.errors import MemstepError
from memstep.memory import PARTS, step_bytes
from memstep.schedules import make_schedule

ROOT = Path(__file__).resolve().parent.parent
KIB, GIB = 1024, 1 << 30


# ---- presets and formulas -------------------------------------------------------------------
def test_kv_bytes_per_token_match_hand_computed_values():
    # Llama-2-7B: 2 (K, V) x 32 layers x 32 KV heads x 128 dims x 2 bytes = 512 KiB
    assert planner.resolve_model("llama-2-7b", "bf16").kv_bytes_per_token == 512 * KIB
    assert planner.resolve_model("Llama-2-7B", "fp32").kv_bytes_per_token == 1024 * KIB
    # GQA: Llama-3.1-8B 2 x 32 x 8 x 128 x 2 = 128 KiB; 70B 2 x 80 x 8 x 128 x 2 = 320 KiB
    assert planner.resolve_model("llama-3.1-8b").kv_bytes_per_token == 128 * KIB
    assert planner.resolve_model("llama-3.1-70b").kv_bytes_per_token == 320 * KIB
    # Qwen2.5-7B 2 x 28 x 4 x 128 x 2 = 56 KiB; SmolLM2-135M 2 x 30 x 3 x 64 x 2 = 22.5 KiB
    assert planner.resolve_model("qwen2.5-7b").kv_bytes_per_token == 56 * KIB
    assert planner.resolve_model("smollm2-135m").kv_bytes_per_token == 23040


@pytest.mark.parametrize("preset, published", [
    ("llama-2-7b", 6_738_415_616), ("llama-3.1-8b", 8_030_261_248), ("llama-3.1-70b", 70_553_706_496),
    ("mistral-7b", 7_241_732_096), ("qwen2.5-7b", 7_615_616_512), ("smollm2-135m", 134_515_008)])
def test_preset_parameter_counts_match_published_counts(preset, published):
    assert planner.resolve_model(preset).params == pytest.approx(published, rel=0.002)


def test_linear_flops_are_two_per_weight_per_token():
    shape = planner.resolve_model("llama-2-7b")
    # one layer: q, k, v, o 4 x 4096^2 = 67,108,864; MLP 3 x 4096 x 11008 = 135,266,304
    assert planner.layer_linear_params(shape) == 202_375_168
    work = planner.step_work(shape, 1028, 1024, 1028, "sdpa", scoring=True)
    assert work["linear"][0] == 2 * 1024 * 32 * 202_375_168
    # attention: QK^T and PV, 2 x 2 FLOPs per pair and dimension, 32 heads, 32 layers
    pairs = 1024 * 1028 + 1024 * 1025 // 2  # over the memory, then the chunk's causal triangle
    assert work["attention"][0] == 32 * 4 * 32 * 128 * pairs
    # the scores come from the attention's own probabilities (one pass): one add per pair and head
    assert work["scorer"][0] == 32 * 32 * pairs


def test_attention_pairs_by_implementation():
    assert planner.attention_pairs(0, 4, "sdpa") == 10  # causal triangle of the first chunk
    # chunk x memory, then the chunk's causal triangle: the hidden half is never computed
    assert planner.attention_pairs(6, 4, "sdpa") == 6 * 4 + 10
    assert planner.attention_pairs(6, 4, "eager") == 40  # chunk x (memory + chunk) under a mask
    assert planner.attention_pairs(6, 4, "padded") == 100  # (memory + chunk)^2


def test_plan_steps_use_the_shared_step_bytes_formula():
    shape = planner.resolve_model("llama-3.1-8b")
    schedule = make_schedule("imdc", 20_000, 1024, 1024)
    plan = planner.plan_schedule(shape, planner.resolve_gpu("h100"), schedule, attention="eager")
    for step, (before, after), chunk in zip(plan.steps, schedule.cache_lengths(4), schedule.chunk_sizes):
        parts = step_bytes(shape, before, chunk, after, attention="eager")
        assert step.parts == {p: parts[p] for p in PARTS}
        assert step.peak_bytes == parts["total"]
        assert step.kv_bytes == parts["kv_memory"] + parts["kv_chunk"]
    assert plan.peak_bytes == max(s.peak_bytes for s in plan.steps)


def test_fm_step_bytes_by_hand_for_llama_2_7b():
    plan = planner.plan("llama-2-7b", "a100-80gb", schedule="fm", tokens=4096, chunk=1024, memory=1024)
    step = plan.steps[2]  # steady state: 1028 entries before and after, chunk 1024
    assert (step.memory_before, step.chunk_size, step.memory_after) == (1028, 1024, 1028)
    entry = 16 * KIB  # one layer's K and V of one token: 2 x 32 x 128 x 2 bytes
    # running layer holds memory + chunk, the 31 others max(before, after)
    assert step.kv_bytes == (2052 + 31 * 1028) * entry
    assert step.parts["weights"] == 6_738_415_616 * 2  # the published parameter count, in bf16
    assert step.parts["activations"] == 1024 * (3 * 11008 + 4 * 4096) * 2


def test_roofline_is_compute_bound_for_big_chunks_and_bandwidth_bound_for_one_token():
    gpu = planner.resolve_gpu("custom", tflops=100, bandwidth_gbs=1000, memory_gib=80)
    shape = planner.resolve_model("llama-2-7b")
    weights = 32 * planner.layer_linear_params(shape) * 2
    one = planner.plan(shape, gpu, schedule="full", tokens=1, efficiency=1.0, bandwidth_efficiency=1.0)
    # one token: reading the layer weights dominates
    assert one.steps[0].seconds_parts["linear"] == pytest.approx(weights / 1e12, rel=0.01)
    big = planner.plan(shape, gpu, schedule="full", tokens=4096, efficiency=0.5, bandwidth_efficiency=1.0)
    flops = 2 * 4096 * weights / 2
    assert big.steps[0].seconds_parts["linear"] == pytest.approx(flops / 50e12)
    assert big.seconds == pytest.approx(sum(big.steps[0].seconds_parts.values()))


def test_launch_overhead_only_counts_when_the_gpu_work_is_shorter():
    small = planner.plan("smollm2-135m", "h200", schedule="fm", tokens=2048, chunk=256, memory=256)
    assert all(s.seconds_parts["overhead"] > 0 for s in small.steps)
    assert all(s.seconds >= 30 * planner.LAYER_OVERHEAD_SECONDS for s in small.steps)
    big = planner.plan("llama-3.1-70b", "h200", schedule="fm", tokens=8192, chunk=2048, memory=2048)
    assert all(s.seconds_parts["overhead"] == 0 for s in big.steps)


def test_gpu_presets_and_overrides():
    h100 = planner.resolve_gpu("H100")
    assert h100.name == "H100 80GB" and h100.bf16_tflops == 989 and h100.bandwidth_gbs == 3350
    assert h100.usable_bytes == h100.memory_bytes - planner.RESERVED_BYTES
    assert planner.resolve_gpu("a100", memory_gib=40).memory_bytes == 40 * GIB
    t4 = planner.resolve_gpu("t4")
    assert t4.peak_flops("fp16") == 65e12 and t4.peak_flops("bf16") == t4.peak_flops("fp32")
    plan = planner.plan("smollm2-135m", "t4", schedule="full", tokens=100, dtype="bf16")
    assert any("no bf16" in n for n in plan.notices)
    for key in ("t4", "l4", "a10g", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"):
        gpu = planner.GPU_PRESETS[key]
        assert gpu.fp16_tflops > gpu.fp32_tflops > 0 and gpu.bandwidth_gbs > 0 and gpu.memory_bytes > 14 * GIB


# ---- totals, fit, longest context, ratios -------------------------------------------------------
def test_fit_and_longest_context_of_a_full_prefill_is_the_largest_fitting_length():
    gpu = planner.resolve_gpu("a10g")
    longest = planner.longest_context("llama-3.1-8b", gpu, "full")
    assert not longest.unlimited and longest.tokens > 1000
    assert planner.plan("llama-3.1-8b", gpu, schedule="full", tokens=longest.tokens).fits
    assert not planner.plan("llama-3.1-8b", gpu, schedule="full", tokens=longest.tokens + 1).fits


def test_compressed_schedules_have_no_length_limit_when_their_steady_step_fits():
    longest = planner.longest_context("llama-3.1-8b", "h100", "imdc", chunk=1024, memory=1024)
    assert longest.unlimited and "no limit" in longest.label()
    nothing = planner.longest_context("llama-3.1-70b", "t4", "fm", chunk=512, memory=512, dtype="fp16")
    assert nothing.tokens == 0 and not nothing.unlimited and nothing.label() == "nothing fits"


def test_imdc_saves_against_fm_and_ratios_are_relative():
    plans = planner.compare("llama-2-7b", "a100-80gb", schedules=("fm", "imdc", "full"), tokens=32768,
                            chunk=1024, memory=1024, attention="padded", keep_maps=True)
    rows = {r["schedule"].split()[0]: r for r in planner.summary_rows(plans)}
    assert rows["FM"]["peak_vs_fm"] == 1.0 and rows["FULL"]["seconds_vs_full"] == 1.0
    assert rows["IMDC"]["peak_vs_fm"] < 0.9 and rows["IMDC"]["seconds_vs_fm"] < 1.0
    assert rows["FULL"]["peak_vs_fm"] > 10  # (32k)^2 maps in every layer
    fm = plans["fm"]
    # keeping every layer's padded maps adds (layers - 1) x heads x (b + c)^2 x 2 bytes
    plain = planner.plan("llama-2-7b", "a100-80gb", schedule="fm", tokens=32768, chunk=1024, memory=1024,
                         attention="padded")
    assert fm.steps[3].parts["attention"] - plain.steps[3].parts["attention"] == 31 * 32 * 2052 ** 2 * 2
    assert plain.evict_per_layer is False  # the reference code evicts after the forward


def test_one_million_tokens_plan_instantly(monkeypatch):
    """Bounded work, not a stopwatch: a step's bytes are computed once per distinct step shape
    (FM and IMDC repeat the same step thousands of times), so 1M tokens cost a few dozen."""
    from memstep.planner import plans as plans_module
    from memstep.planner import search

    computed = []
    step_bytes = plans_module.step_bytes

    def counted(*args, **kwargs):
        computed.append(args[1:4])
        return step_bytes(*args, **kwargs)

    monkeypatch.setattr(plans_module, "step_bytes", counted)
    monkeypatch.setattr(search, "step_bytes", counted)
    plans = planner.compare("llama-3.1-8b", "h200", schedules=("fm", "im", "imdc", "full"), tokens=1_000_000,
                            chunk=256, memory=384)
    longest = planner.longest_context("llama-3.1-8b", "h200", "imdc", chunk=256, memory=384)
    assert plans["imdc"].schedule.steps == 3907 and plans["full"].schedule.steps == 1
    assert longest.unlimited
    assert len(computed) <= 50, len(computed)  # 4 schedules x 3907 steps without the memo


def test_plan_json_has_steps_peak_seconds_and_fit():
    data = json.loads(json.dumps(planner.plan("mistral-7b", "l4", schedule="im", tokens=5000).to_dict()))
    assert {"steps", "peak_bytes", "seconds", "fits", "flops", "gpu", "model"} <= set(data)
    assert {"kv_bytes", "peak_bytes", "flops", "seconds"} <= set(data["steps"][0])
    assert data["peak_bytes"] == max(s["peak_bytes"] for s in data["steps"])
    assert data["seconds"] == pytest.approx(sum(s["seconds"] for s in data["steps"]))


# ---- inputs ---------------------------------------------------------------------------------
def test_config_json_file_folder_and_object(tmp_path, tiny_model):
    config = dict(planner.MODEL_PRESETS["mistral-7b"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_file = planner.resolve_model(tmp_path / "config.json")
    from_folder = planner.resolve_model(str(tmp_path))
    assert from_file.kv_bytes_per_token == from_folder.kv_bytes_per_token == 128 * KIB
    shape = planner.resolve_model(tiny_model.config, "fp32")
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (2, 4, 2, 16)


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a valid config.json"),
    ("[1, 2]", "expected a JSON object"),
    ('{"hidden_size": 64}', "missing sizes"),
    ('{"hidden_size": -1, "num_attention_heads": 4, "num_hidden_layers": 2}', "bad hidden_size"),
])
def test_malformed_configs_raise_memstep_error(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(MemstepError, match=message):
        planner.resolve_model(path)


def test_missing_config_and_unknown_names():
    with pytest.raises(MemstepError, match="not found"):
        planner.resolve_model("/nowhere/config.json")
    with pytest.raises(MemstepError, match="unknown model"):
        planner.resolve_model("gpt-5")
    with pytest.raises(MemstepError, match="unknown GPU"):
        planner.resolve_gpu("v100")
    with pytest.raises(MemstepError, match="custom GPU needs"):
        planner.resolve_gpu("custom", tflops=10)
    with pytest.raises(MemstepError, match="positive"):
        planner.resolve_gpu("l4", bandwidth_gbs=-5)
    with pytest.raises(MemstepError, match="unknown dtype"):
        planner.resolve_model("llama-2-7b", "int3")


@pytest.mark.parametrize("settings, message", [
    (dict(tokens=0), "tokens"), (dict(tokens=-5), "tokens"), (dict(chunk=0), "chunk"),
    (dict(chunk=-1), "chunk"), (dict(memory=0), "memory"), (dict(sinks=-1), "sinks"),
    (dict(schedule="custom"), "unknown schedule"), (dict(attention="flash"), "unknown attention"),
    (dict(efficiency=0), "efficiency"), (dict(efficiency=1.5), "efficiency"),
    (dict(memory=4096, chunk=1024, tokens=100_000), "IMDC"),
])
def test_bad_sizes_raise_memstep_error(settings, message):
    base = dict(schedule="imdc", tokens=8192, chunk=512, memory=512)
    with pytest.raises(MemstepError, match=message):
        planner.plan("llama-3.1-8b", "h100", **{**base, **settings})


def test_contexts_beyond_the_position_limit_warn_and_still_plan():
    plan = planner.plan("llama-2-7b", "a100", schedule="fm", tokens=32768, chunk=1024, memory=1024,
                        rope="document")
    assert plan.schedule.tokens == 32768 and len(plan.steps) == 32 and plan.largest_position == 32768
    assert any("document positions: 32768 tokens go beyond" in n and "4096 trained positions" in n
               for n in plan.notices)
    assert plan.to_dict()["rope"] == "document"
    # compact positions (the default) stop at the widest step: 4 sinks + 1024 + 1024
    compact = planner.plan("llama-2-7b", "a100", schedule="fm", tokens=32768, chunk=1024, memory=1024)
    assert compact.largest_position == 2052
    assert [n for n in compact.notices if "trained positions" in n] == [
        "32768 tokens are more than Llama-2-7B's 4096 trained positions, but with compact RoPE positions "
        "no step uses more than 2052 positions."]
    # shared positions: at most every layer and KV head holding different tokens (32 x 32 x 1028 + 1024),
    # never more than the document's
    shared = planner.plan("llama-2-7b", "a100", schedule="fm", tokens=32768, chunk=1024, memory=1024, rope="shared")
    assert shared.largest_position == 32768
    tight = planner.plan("llama-2-7b", "a100", schedule="fm", tokens=32768, chunk=64, memory=4, rope="shared")
    assert tight.largest_position == 32 * 32 * 8 + 64
    wide = planner.plan("llama-2-7b", "a100", schedule="fm", tokens=32768, chunk=4096, memory=1024)
    assert any("compact positions: the widest step (5124 entries) go beyond" in n for n in wide.notices)
    assert not planner.plan("llama-2-7b", "a100", schedule="fm", tokens=4096).notices
    full = planner.plan("llama-2-7b", "a100", schedule="full", tokens=32768)
    assert full.largest_position == 32768  # one pass: every token at its own position
    with pytest.raises(MemstepError, match="RoPE position mode"):
        planner.plan("llama-2-7b", "a100", schedule="fm", tokens=4096, rope="absolute")


def test_layerwise_growth_plans_bytes_per_layer():
    """square-sqrt on the SmolLM2 preset (30 layers): the lower 15 layers follow square, the upper
    15 sqrt; the KV peak adds up each layer's own entries."""
    from memstep.memory import kv_peak_entries

    shape = planner.resolve_model("smollm2-135m", "fp32")
    plan = planner.plan(shape, "a100", schedule="im", tokens=4096, chunk=512, memory=512, growth="square-sqrt",
                        dtype="fp32")
    step = plan.steps[1]  # after step 1: square 73, sqrt int(sqrt(1) * 448 / sqrt(7) + 64) = 233 (+4 sinks)
    assert step.layer_memory_after == [77] * 15 + [237] * 15
    before = [68] * 30  # after step 0 both curves are at a = 64
    # while layer l runs: layers below hold their new entries, l memory + chunk, the rest memory
    expected = max(sum(step.layer_memory_after[:l]) + before[l] + 512 + sum(before[l + 1:]) for l in range(30))
    assert expected == kv_peak_entries(shape, before, 512, step.layer_memory_after)
    assert step.kv_bytes == expected * shape.kv_bytes_per_entry
    assert plan.to_dict()["steps"][1]["layer_memory_after"][0] == 77
    assert plan.to_dict()["schedule"]["layers"] == 30


# ---- against reality ----------------------------------------------------------------------------
@pytest.mark.slow
def test_modeled_kv_bytes_equal_the_engine_cache_tensors_every_step(embedded):
    """The planner's KV bytes (from the SmolLM2 preset, not the loaded model) equal the bytes of
    the engine's real cache tensors at every step, and its totals equal the engine's modeled ones."""
    from memstep.engine import ChunkedPrefill, model_shape

    text = (ROOT / "assets" / "pride_and_prejudice_ch1-12.txt").read_text(encoding="utf-8")
    ids = embedded.tokenizer(text)["input_ids"][:768]
    real = model_shape(embedded.model)
    preset = planner.resolve_model("smollm2-135m", "fp32")
    assert (preset.layers, preset.hidden, preset.heads, preset.kv_heads, preset.head_dim, preset.intermediate,
            preset.vocab) == (real.layers, real.hidden, real.heads, real.kv_heads, real.head_dim,
                              real.intermediate, real.vocab)
    gpu = planner.resolve_gpu("h100")
    engine = ChunkedPrefill(embedded.model)
    for name, tokens, chunk, memory in (("fm", 384, 96, 64), ("imdc", 768, 128, 192)):
        schedule = make_schedule(name, tokens, chunk, memory)
        # the engine runs on CPU here: its one-pass blocks are the CPU's
        modeled = planner.plan_schedule(preset, gpu, schedule, dtype="fp32", device="cpu")
        exact = planner.plan_schedule(real, gpu, schedule, dtype="fp32", device="cpu")
        records = list(engine.run(ids[:tokens], schedule))
        assert len(records) == len(modeled.steps) == schedule.steps
        for record, step, same in zip(records, modeled.steps, exact.steps):
            assert (record.memory_before, record.memory_after) == (step.memory_before, step.memory_after)
            assert record.kv_bytes_actual == step.kv_bytes, (name, record.step)
            assert record.bytes_modeled == same.peak_bytes


def _validate_module():
    spec = importlib.util.spec_from_file_location("validate_planner", ROOT / "benchmarks" / "validate_planner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")
def test_modeled_peak_within_15_percent_of_cuda_max_memory_allocated(artifacts_dir):
    validate = _validate_module()
    report = validate.validate(model="embedded", device="cuda", dtype="bfloat16", tokens=4096, chunk=512,
                               memory=512, schedules=("fm", "imdc", "full"))
    (artifacts_dir / "validate_planner.json").write_text(json.dumps(report, indent=1))
    for run in report["runs"]:
        measured, modeled = run["peak_bytes_measured"], run["peak_bytes_modeled"]
        assert abs(modeled - measured) <= 0.15 * measured, (run["schedule"], modeled, measured)


# ---- the Plan tab's figures, table and handler (no browser) -------------------------------------
def _tab():
    pytest.importorskip("gradio")
    from ui.tabs import plan as plan_tab

    return plan_tab


def test_scale_groups_and_sampled_steps_keep_the_peak():
    tab = _tab()
    assert tab.scale_groups([1.0, 1.2, 50.0]) == [0, 0, 2]
    assert tab.scale_groups([10.0, 1.0, 3.9]) == [0, 1, 1]  # 10 > 4 x 1: its own scale
    plan = planner.plan("llama-3.1-8b", "h100", schedule="imdc", tokens=1_000_000, chunk=256, memory=384)
    idx = tab.sampled_steps(plan, max_points=500)
    assert len(idx) <= 500 and idx == sorted(idx)
    assert plan.peak_step in idx


def test_memory_figure_has_one_stacked_panel_per_schedule():
    tab = _tab()
    plans = planner.compare("llama-2-7b", "a100", schedules=("fm", "imdc", "full"), tokens=32768)
    fig = tab.plan_memory_figure(plans)  # weights left out by default
    names = {t.name for t in fig.data}
    assert names == {"KV of memory", "KV of chunk", "attention + scorer working set", "activations"}
    assert len(fig.data) == 3 * 4 and all(t.type == "bar" for t in fig.data)
    # stacked values add up to each step's peak above the weights
    fm_traces = [t for t in fig.data if t.xaxis == "x"]
    step3 = sum(t.y[3] for t in fm_traces) * (1 << 30)
    assert step3 == pytest.approx(plans["fm"].steps[3].peak_bytes - plans["fm"].steps[3].parts["weights"])
    assert "full on its own scale" in fig.layout.title.text
    with_weights = tab.plan_memory_figure(plans, include_weights=True)
    assert "weights" in {t.name for t in with_weights.data}
    assert any("does not fit" in a.text for a in tab.plan_memory_figure(
        planner.compare("llama-2-7b", "t4", schedules=("full",), tokens=32768, dtype="fp16")).layout.annotations)


def test_long_schedules_are_drawn_as_stacked_areas_and_time_adds_up():
    tab = _tab()
    plans = planner.compare("qwen2.5-7b", "h200", schedules=("fm", "imdc"), tokens=400_000, chunk=512, memory=512)
    fig = tab.plan_time_figure(plans)
    assert all(t.type == "scatter" and t.stackgroup for t in fig.data)
    first = [t for t in fig.data if t.xaxis == "x"]
    assert sum(t.y[0] for t in first) == pytest.approx(plans["fm"].steps[0].seconds * 1e3)
    assert "total" in fig.layout.annotations[0].text


def test_summary_table_and_headline():
    tab = _tab()
    plans, longest, _ = tab.compute("llama-2-7b", None, "a100-80gb", "bf16", 32768, 1024, 1024, "linear", "padded",
                                 ["full", "imdc", "fm"], 4, True)
    assert list(plans) == ["fm", "imdc", "full"]  # the tab's order, whatever the click order
    rows = tab.summary_table(plans, longest)
    assert [r[0] for r in rows] == ["FM", "IMDC (linear)", "FULL"] and len(rows[0]) == len(tab.TABLE_HEADERS)
    assert rows[0][7] == "1.000x" and rows[2][4] == "NO" and rows[2][-1].endswith("tokens")
    assert rows[0][-1].startswith("any length (checked up to") and not any("no limit" in r[-1] for r in rows)
    text = tab.headline(plans)
    assert "**IMDC** vs FM: 0.825x peak memory (17.5% saved)" in text and "4096 trained positions" in text


def test_tab_handler_reads_an_uploaded_config_and_reports_bad_input(tmp_path):
    tab = _tab()
    import gradio as gr

    path = tmp_path / "config.json"
    path.write_text(json.dumps(planner.MODEL_PRESETS["mistral-7b"]))
    plans, _, _ = tab.compute("config", str(path), "custom", "fp16", 8192, 512, 512, "sqrt", "eager", ["im"], 4,
                           False, 100, 1000, 24)
    assert plans["im"].gpu.memory_bytes == 24 * GIB and plans["im"].model.kv_bytes_per_token == 128 * KIB
    base = dict(model="config", config_file=str(path), gpu="h100", dtype="bf16", tokens=8192, chunk=512,
                memory=512, growth="linear", attention="sdpa", schedules=["fm"])
    for change, message in ((dict(config_file=None), "upload a config.json"), (dict(tokens=None), "tokens is empty"),
                            (dict(chunk=0), "chunk must be"), (dict(tokens=1.5), "whole number"),
                            (dict(gpu="custom"), "custom GPU needs")):
        with pytest.raises(MemstepError, match=message):
            tab.compute(**{**base, **change})
    with pytest.raises(MemstepError, match="at least one schedule"):
        tab.compute("llama-2-7b", None, "h100", "bf16", 8192, 512, 512, "linear", "sdpa", [])
    with pytest.raises(gr.Error):
        tab.on_plan("llama-2-7b", None, "h100", "bf16", -1, 512, 512, "linear", "sdpa", ["fm"], 4, False, False,
                    None, None, None)


def test_build_tab_inside_blocks():
    tab = _tab()
    import gradio as gr

    with gr.Blocks() as demo:
        with gr.Tab("Plan"):
            parts = tab.build_tab()
    assert {"model", "gpu", "tokens", "schedules", "memory_plot", "time_plot", "table"} <= set(parts)
    assert parts["memory_plot"].value is not None and demo is not None
    from memstep.presets import ROPE_MODES

    assert [value for _, value in parts["rope"].choices] == list(ROPE_MODES)  # every mode the planner plans


def test_tab_plans_shared_positions():
    tab = _tab()
    plans, _, _ = tab.compute("llama-2-7b", None, "a100", "bf16", 32768, 64, 4, "linear", "sdpa", ["fm"], 4,
                              rope="shared")
    # at most every layer and KV head holding different tokens: 32 x 32 x (4 + 4) + 64
    assert plans["fm"].largest_position == 32 * 32 * 8 + 64


def test_question_tokens_count_in_every_compressed_step():
    """Question-aware: each step also reads the question (20 tokens here): its KV entries sit in the
    running layer until the cut, and its rows cost projections and attention."""
    shape = planner.resolve_model("smollm2-135m", "fp32")
    plain = planner.plan(shape, "a100", schedule="imdc", tokens=4096, chunk=512, memory=512, dtype="fp32")
    aware = planner.plan(shape, "a100", schedule="imdc", tokens=4096, chunk=512, memory=512, dtype="fp32",
                         question_tokens=20)
    for a, b in zip(plain.steps, aware.steps):
        assert b.chunk_size == a.chunk_size  # the chunk is the same; the step reads 20 tokens more
        assert b.kv_bytes == a.kv_bytes + 20 * shape.kv_bytes_per_entry
        assert b.flops > a.flops
    assert aware.to_dict()["question_tokens"] == 20
    full = planner.plan(shape, "a100", schedule="full", tokens=4096, dtype="fp32", question_tokens=20)
    assert full.question_tokens == 0  # nothing is cut: nothing to score
    with pytest.raises(MemstepError, match="question tokens"):
        planner.plan(shape, "a100", schedule="fm", tokens=4096, question_tokens=-1)
