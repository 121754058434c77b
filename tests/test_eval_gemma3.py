"""The evaluation on a hybrid model (Gemma 3: sliding-window layers beside global ones), on a
tiny random Gemma 3 (window 8, two sliding layers for each global one):
- memstep's retention counts the global layers only (a sliding layer holds its window whatever
  the schedule), and the cells say so;
- the kvpress peer's cache on a hybrid model: sliding layers left whole, global layers cut, and
  the continuation read over it equals a one-pass forward masked the same way;
- a press that fails is recorded (one line per configuration and reason), not a crash;
- cells of the chunk-by-chunk Finch of earlier runs read as finch-chunked, under their own keys.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import types
from pathlib import Path

import pytest
import torch

from memstep.evaluation import runner
from memstep.evaluation.grid import Config, upgrade_cell
from memstep.evaluation.store import ResultStore
from memstep.evaluation.suite import make_case
from memstep.evaluation.worker import run_case
from memstep.layers import GLOBAL, SLIDING
from memstep.models import LoadedModel

try:
    from conftest import make_tiny_model
    from fixtures_documents import tokenizer  # noqa: F401 (a pytest fixture)
except ImportError:  # tests/ imported as a package
    from tests.conftest import make_tiny_model
    from tests.fixtures_documents import tokenizer  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 8
TYPES = [SLIDING, SLIDING, GLOBAL] * 2
GLOBAL_LAYERS = [i for i, t in enumerate(TYPES) if t == GLOBAL]


def _peer():
    spec = importlib.util.spec_from_file_location("kvpress_peer_gemma3_test", ROOT / "peers" / "kvpress_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gemma3(tokenizer) -> LoadedModel:
    model = make_tiny_model("gemma3_text", layers=len(TYPES), seed=3, sliding_window=WINDOW, layer_types=TYPES,
                            vocab_size=len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return LoadedModel(model, tokenizer, "tiny-gemma3", "cpu", "float32")


def test_retention_counts_the_global_layers_only(gemma3, tokenizer):
    prose = (ROOT / "assets" / "persuasion_excerpt.txt").read_text(encoding="utf-8")
    case = make_case(prose, tokenizer, 200, 0.5, 0, continuation_tokens=4).to_dict()
    settings = {"sinks": 4, "window": 32, "max_new_tokens": 2}
    full = run_case(gemma3, Config("memstep", "full").to_dict(), settings, case)
    # with no eviction every global slot keeps the needle; the sliding layers (window 8) lost it long
    # ago, so counting them would give 0 whole-needle slots in 4 layers of 6
    assert full["retention_layers"] == "global" and len(full["retention"]) == len(GLOBAL_LAYERS)
    assert full["needle_whole"] == 1.0 and full["retention"] == [1.0] * len(GLOBAL_LAYERS)
    fm = run_case(gemma3, Config("memstep", "fm", None, "recency", 16, 32, "compact").to_dict(), settings, case)
    assert fm["retention_layers"] == "global" and fm["needle_whole"] == 0.0  # the needle is far from the last 16
    assert fm["memory_entries"] == 16 + 4  # a global layer's budget and sinks (a sliding layer holds 7)


def test_peer_hybrid_cache_and_masks_match_a_masked_one_pass(gemma3):
    peer = _peer()
    model = gemma3.model
    ids = torch.randint(5, 5000, (1, 40), generator=torch.Generator().manual_seed(1))
    document, continuation = ids[:, :30], ids[:, 30:]
    cache = peer.make_cache(model)
    assert [type(layer).__name__ for layer in cache.layers].count("WholeSlidingLayer") == 4
    with torch.inference_mode():
        model.model(input_ids=document, past_key_values=cache, use_cache=True)
        # a press kept these positions in every global layer (both KV heads); sliding layers stay whole
        kept_positions = [0, 1, 2, 3, 9, 10, 11, 17, 25, 26, 27, 28, 29]
        kept = {i: torch.tensor([kept_positions, kept_positions]) for i in GLOBAL_LAYERS}
        for i in GLOBAL_LAYERS:
            layer = cache.layers[i]
            index = torch.tensor(kept_positions)
            layer.keys, layer.values = layer.keys[:, :, index], layer.values[:, :, index]
        peer.drop_positions(cache, kept, 30)  # nothing at or after 30: a no-op for every layer
        got = peer.extend(model, cache, continuation[0].tolist(), 30, False)
        # the same as one pass where the continuation's queries see only the kept positions in global layers
        q = torch.arange(40)[:, None]
        k = torch.arange(40)[None]
        causal = k <= q
        dropped = torch.ones(40, dtype=torch.bool)
        dropped[kept_positions] = False
        dropped[30:] = False
        full = causal & ~((q >= 30) & dropped[None])
        sliding = causal & (k > q - WINDOW)
        masks = {"full_attention": full[None, None], "sliding_attention": sliding[None, None]}
        want = model(input_ids=ids, attention_mask=masks).logits[0, 30:].float()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# Run by the kvpress virtualenv's python (its transformers < 5.3, where the masks transformers
# derives from one cache length let the continuation see past what the global layers kept).
MASKS_IN_KVPRESS_VENV = """
import importlib.util, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(3)
types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
config = AutoConfig.for_model("gemma3_text", vocab_size=500, hidden_size=64, intermediate_size=128,
    num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
    layer_types=types, max_position_embeddings=4096, tie_word_embeddings=False)
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
spec = importlib.util.spec_from_file_location("peer", sys.argv[1])
peer = importlib.util.module_from_spec(spec); spec.loader.exec_module(peer)
ids = torch.randint(5, 500, (1, 40), generator=torch.Generator().manual_seed(1))
kept = [0, 1, 2, 3, 9, 10, 11, 17, 25, 26, 27, 28, 29]
rows = {}
for masked in (True, False):
    cache = peer.make_cache(model)
    with torch.inference_mode():
        model.model(input_ids=ids[:, :30], past_key_values=cache, use_cache=True)
        for i in (2, 5):
            layer = cache.layers[i]
            layer.keys, layer.values = layer.keys[:, :, kept], layer.values[:, :, kept]
        if not masked:
            peer.hybrid_masks = lambda *args: None  # transformers' own masks
        rows[masked] = peer.extend(model, cache, ids[0, 30:].tolist(), 30, False)
    q, k = torch.arange(40)[:, None], torch.arange(40)[None]
    dropped = torch.ones(40, dtype=torch.bool); dropped[kept] = False; dropped[30:] = False
    full = (k <= q) & ~((q >= 30) & dropped[None])
    masks = {"full_attention": full[None, None], "sliding_attention": ((k <= q) & (k > q - 8))[None, None]}
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=masks).logits[0, 30:].float()
print(float((rows[True] - want).abs().max()), float((rows[False] - want).abs().max()))
"""


@pytest.mark.kvpress
@pytest.mark.slow  # the kvpress virtualenv's torch and transformers load in a subprocess (~10-30 s)
@pytest.mark.skipif(not (ROOT / ".venv-kvpress" / "bin" / "python").exists(), reason="no .venv-kvpress")
def test_peer_masks_are_needed_in_the_kvpress_virtualenv():
    out = subprocess.run([str(ROOT / ".venv-kvpress" / "bin" / "python"), "-c", MASKS_IN_KVPRESS_VENV,
                          str(ROOT / "peers" / "kvpress_peer.py")], capture_output=True, text=True, timeout=300)
    ours, theirs = map(float, out.stdout.split())
    assert ours < 1e-4  # the peer's masks: the same as the masked one pass
    assert theirs > 1e-2  # without them the continuation reads the wrong entries there


def test_a_failing_press_is_recorded_not_a_crash(monkeypatch, tmp_path):
    lines = [json.dumps({"event": "ready"}),
             json.dumps({"event": "error", "key": "k0", "message": "AttributeError: no attribute 'inv_freq'"}),
             json.dumps({"event": "error", "key": "k1", "message": "AttributeError: no attribute 'inv_freq'"})]

    class Worker:
        def __init__(self, command, **kwargs):
            self.stdout = iter(line + "\n" for line in lines)

        def wait(self):
            return 0

    monkeypatch.setattr(runner, "worker_command", lambda config, path, python=None: ["python3", path])
    monkeypatch.setattr(runner.subprocess, "Popen", Worker)
    store, report = ResultStore(tmp_path), runner.RunReport()
    case = types.SimpleNamespace(length=2048, to_dict=lambda: {}, cell={})
    config = Config("kvpress", "full", None, "finch", 512, question_aware=True)
    runner.run_group(config, [case, case], ["k0", "k1"], runner.EvalSettings(), store, report)
    assert len(report.errors) == 2 and len(store) == 0  # reported, no cell stored, nothing raised
    assert store.failures() == [{"label": config.label, "length": 2048, "cases": 2,
                                 "message": "AttributeError: no attribute 'inv_freq'"}]


def test_chunked_finch_cells_of_earlier_runs_read_as_finch_chunked():
    old = {"key": "abc", "config": Config("kvpress", "full", None, "finch", 512, question_aware=True).to_dict(),
           "settings": {"press": "FinchPress", "chunk_length": 512}, "length": 2048}
    cell = upgrade_cell(old)
    assert cell["label"] == "kvpress finch-chunked M=512 question-aware" and cell["key"] == "abc-chunked"
    new = {**old, "settings": {"press": "FinchPress", "chunk_length": "none (one top-k over the context)"}}
    assert upgrade_cell(new)["label"] == "kvpress finch M=512 question-aware" and upgrade_cell(new)["key"] == "abc"


def _cell(config: Config, depth: float, correct: bool, kl: float, scope: str) -> dict:
    return {"key": f"{config.label}{depth}", "config": config.to_dict(), "label": config.label,
            "peer": config.is_peer, "haystack": "a.txt", "length": 2048, "depth": depth, "seed": 0, "kind": "word",
            "correct": correct, "continuation_nll": 2.0 + kl, "prefill_seconds": 1.0, "seconds": 2.0,
            "peak_rss_bytes": 10, "baseline_rss_bytes": 5, "memory_entries": 516, "retention": [0.5],
            "retention_layers": scope, "kl": kl, "top1": 1.0 - kl, "needle_whole": 0.5, "settings": None}


def test_docs_gemma3_section_names_the_retention_layers_and_each_failure(tmp_path):
    spec = importlib.util.spec_from_file_location("eval_docs_test", ROOT / "benchmarks" / "eval_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    store = ResultStore(tmp_path)
    full, aware = Config("memstep", "full"), Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact", True)
    for depth in (0.2, 0.5, 0.8):
        store.add(_cell(full, depth, True, 0.0, "global"))
        store.add(_cell(aware, depth, depth < 0.7, 0.05, "global"))
    finch = "kvpress finch M=512 question-aware"
    for _ in range(3):  # one line per configuration and reason, however many cases hit it
        store.add_failure(finch, 2048, "AttributeError: 'Gemma3RotaryEmbedding' object has no attribute 'inv_freq'")
    text = "\n".join(docs.gemma3_section(tmp_path))
    assert "(the cells' `retention_layers`: global)" in text
    assert text.count(f"- {finch}: AttributeError") == 1 and "sliding_attention_inv_freq" in text
    assert "2/3 (67%" in text  # counted accuracy of the question-aware row, from the cells
    line = "\n".join(docs.gemma3_sentence(tmp_path))
    assert "2,048 tokens: 2/3 (67%" in line and "kvpress finch question-aware does not run on Gemma 3" in line


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_peer_full_cache_equals_memstep_full_on_both_kinds_of_model(family, tokenizer, tmp_path):
    """The peer's run without a press (the HF full cache) on a plain and on a hybrid model: its
    continuation matches memstep's full cache (KL ~0 against it) and it reports its entries."""
    extra = {"sliding_window": WINDOW, "layer_types": TYPES} if family == "gemma3_text" else {}
    model = make_tiny_model(family, layers=len(TYPES) if extra else 2, seed=3, vocab_size=len(tokenizer), **extra)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    lm = LoadedModel(model, tokenizer, "tiny", "cpu", "float32")
    prose = (ROOT / "assets" / "persuasion_excerpt.txt").read_text(encoding="utf-8")
    case = make_case(prose, tokenizer, 120, 0.5, 0, continuation_tokens=6).to_dict()
    path = str(tmp_path / "reference.npy")
    run_case(lm, Config("memstep", "full").to_dict(), {"sinks": 4, "window": 32, "max_new_tokens": 2}, case,
             {"write": path})
    peer = _peer()
    settings = {"press_name": None, "question_aware": False, "budget": None, "sinks": 4, "max_new_tokens": 2,
                "vocab": len(tokenizer), "press_settings": {}}
    out = peer.run_case(model, tokenizer, None, settings, case, {"read": path})
    assert out["kl"] < 1e-6 and out["top1"] == 1.0
    assert out["memory_entries"] == len(case["head_ids"]) + len(case["document_ids"])
