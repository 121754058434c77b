"""The GPU benchmarks' pieces that run anywhere: the random-weight models' shapes (against the
published parameter counts), and the tables rendered from the measurements' JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from memstep.errors import MemstepError

ROOT = Path(__file__).resolve().parent.parent
GPU_RESULTS = ROOT / "benchmarks" / "results" / "gpu"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _meta_parameters(config) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # shapes only: nothing is allocated
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_random_models_have_the_published_shapes():
    random_model = _module("random_model")
    # Llama-2-7B with its own vocabulary: meta-llama/Llama-2-7b-hf's published 6,738,415,616 parameters
    config = random_model.llama_config("llama-2-7b", 100, "bfloat16")
    assert config.vocab_size == 32000
    assert _meta_parameters(config) == 6_738_415_616
    # with SmolLM2's 49,152-token tokenizer: the embedding and the head grow by (49152 - 32000) rows each
    config = random_model.llama_config("llama-2-7b", 49152, "bfloat16")
    assert config.vocab_size == 49152
    assert _meta_parameters(config) == 6_738_415_616 + 2 * (49152 - 32000) * 4096
    # the embedded model's shape: SmolLM2-135M's 134,515,008 parameters (tied embeddings)
    assert _meta_parameters(random_model.llama_config("smollm2-135m", 49152, "bfloat16")) == 134_515_008
    with pytest.raises(MemstepError, match="sliding-window"):
        random_model.llama_config("gemma-3-270m", 100, "bfloat16")
    with pytest.raises(MemstepError, match="unknown preset"):
        random_model.llama_config("llama-9", 100, "bfloat16")


def test_the_measured_memory_saving_is_rendered_only_where_it_was_measured():
    bench_engine = _module("bench_engine")
    gpu = json.loads((GPU_RESULTS / "bench_engine_cuda_32k.json").read_text())
    sdpa = gpu["padded"][0]["sdpa"]  # memstep's attention: its FM and IMDC runs are the table's runs
    runs = {r["schedule"]: r for r in gpu["runs"] if r.get("attention") == "sdpa"}
    assert sdpa["memory_saved_measured"] == pytest.approx(  # the two measured peaks' (weights included)
        1 - runs["imdc"]["peak_bytes_measured"] / runs["fm"]["peak_bytes_measured"])
    table = bench_engine.markdown(gpu)
    assert "planned | measured |" in table
    for attention in ("padded", "sdpa"):
        assert f"| {gpu['padded'][0][attention]['memory_saved_measured']:.1%} |" in table
    cpu = json.loads((ROOT / "benchmarks" / "results" / "bench_engine_cpu.json").read_text())
    assert "measured |" not in bench_engine.markdown(cpu).split("IMDC speed-up")[1]


def test_validate_planner_renders_its_runs():
    validate = _module("validate_planner")
    report = {"model": "m", "device_name": "NVIDIA H200", "dtype": "bfloat16", "document": "book.txt",
              "tokens": 32768, "chunk": 1024, "memory": 1024, "gpu_preset": "h200-141gb",
              "runs": [{"schedule": "fm", "peak_bytes_measured": 2 << 30, "peak_bytes_modeled": 3 << 29,
                        "peak_error": -0.25, "kv_bytes_match": True, "seconds_measured": 3.0,
                        "seconds_modeled": 1.0}]}
    table = validate.markdown(report).splitlines()
    assert table[0].startswith("m on NVIDIA H200 (bfloat16), book.txt 32768 tokens")
    assert table[-1] == "| fm | 2.0 GiB | 1.5 GiB | -25.0% | True | 3.00 | 1.00 |"


def test_span_cost_tables_name_their_clock():
    span_cost = _module("span_cost")
    rows = [{"pool": "max:15", "span": "None", "ratio": 1.0}, {"pool": "p", "span": "None", "ratio": 1.1}]
    cpu = span_cost.table({"budget": 128, "repeat": 3, "rows": [dict(r, cpu_seconds=2.0) for r in rows]})
    assert "| question pool | span | CPU s | ratio to the first row |" in cpu
    assert cpu[-1] == "| p | none (token top-k) | 2.00 | 1.100 |"
    gpu = span_cost.table({"budget": 128, "repeat": 5, "model": "m", "device": "cuda", "dtype": "bfloat16",
                           "rows": [dict(r, seconds=0.5, peak_above_model_bytes=3 << 20) for r in rows]})
    assert "| question pool | span | s | peak above the model | ratio to the first row |" in gpu
    assert gpu[-1] == "| p | none (token top-k) | 0.500 | 3.0 MiB | 1.100 |"
