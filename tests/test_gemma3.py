"""The real Gemma 3 270M (packaged, base model, 15 sliding layers with a 512-token window and
3 global ones): chunked prefill with nothing evicted equals one full forward at chunks
smaller than, equal to and larger than the window; the planner's KV bytes equal the
engine's real cache bytes; questions are asked as completions. Slow: a few forwards of
~560 tokens through the 270M model in fp32."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import ASSETS
from test_engine import TOL, full_prefill, run_engine

from memstep.schedules import make_schedule

pytestmark = pytest.mark.slow
TOKENS = 560


@pytest.fixture(scope="module")
def gemma3_270m():
    from memstep.models import load_model

    return load_model("gemma3-270m", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def document_ids(gemma3_270m):
    text = (ASSETS / "pride_and_prejudice_ch1-12.txt").read_text()[:8000]
    ids = gemma3_270m.tokenizer(text)["input_ids"][:TOKENS]  # <bos> first, as the model expects
    assert ids[0] == gemma3_270m.tokenizer.bos_token_id and len(ids) == TOKENS
    return torch.tensor(ids)


def test_the_packaged_model_is_hybrid(gemma3_270m):
    config = gemma3_270m.model.config
    assert config.model_type == "gemma3_text" and config.sliding_window == 512
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert gemma3_270m.name.startswith("Gemma 3 270M") and "Gemma terms" in gemma3_270m.name


def test_chunked_prefill_without_eviction_equals_one_pass(gemma3_270m, document_ids):
    """fp32 at chunks equal to and larger than the window, on the whole model. A chunk smaller than
    the window is checked in float64: in fp32 this model's hidden states (up to ~100) differ by
    ~4e-4 between two plain transformers forwards, a 200-token one and the first 200 rows of a
    560-token one, so fp32 cannot separate memstep from the kernels' rounding there; in float64
    memstep's chunked prefill must reproduce the one pass to rounding (1e-9). The float64 pass
    runs the model's first six layers, one period of its pattern (five sliding, one global): the
    same code paths at a third of the work."""
    model = gemma3_270m.model
    reference = full_prefill(model, document_ids)
    with torch.inference_mode():
        logits = model.get_output_embeddings()(reference[-1:])[0]
    for chunk in (512, 540):  # equal to, larger than the window
        engine, records = run_engine(model, document_ids, make_schedule("fm", TOKENS, chunk, 1024),
                                     collect_hidden=True)
        assert not any(r.evicted for r in records)
        torch.testing.assert_close(torch.cat(engine.hidden_chunks), reference, **TOL)
        with torch.inference_mode():
            next_logits = model.get_output_embeddings()(engine.last_hidden)[0]
        assert int(next_logits.argmax()) == int(logits.argmax())
        assert records[-1].layer_memory_after == ([511] * 5 + [TOKENS]) * 3
    with six_layers(model):
        model.to(torch.float64)  # fp32 -> fp64 -> fp32 is exact: the module's model is unchanged after
        reference = full_prefill(model, document_ids)
        engine, records = run_engine(model, document_ids, make_schedule("fm", TOKENS, 200, 1024), collect_hidden=True)
        assert len(records) == 3 and records[-1].layer_memory_after == [511] * 5 + [TOKENS]
        torch.testing.assert_close(torch.cat(engine.hidden_chunks), reference, rtol=0, atol=1e-9)


@contextlib.contextmanager
def six_layers(model):
    """The model cut to its first six decoder layers (five sliding, one global) and back, in fp32."""
    config, layers = model.config, model.model.layers
    kept = (config.num_hidden_layers, config.layer_types)
    try:
        model.model.layers = torch.nn.ModuleList(layers[:6])
        config.num_hidden_layers, config.layer_types = 6, config.layer_types[:6]
        assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
        yield
    finally:
        model.model.layers = layers
        config.num_hidden_layers, config.layer_types = kept
        model.to(torch.float32)


def test_planner_kv_bytes_equal_the_engine_cache_bytes(gemma3_270m, document_ids):
    from memstep.planner.catalogue import resolve_gpu, resolve_model
    from memstep.planner.plans import plan_schedule

    schedule = make_schedule("imdc", TOKENS, 256, 256)
    _, records = run_engine(gemma3_270m.model, document_ids, schedule, rope="compact")
    for shape in (resolve_model(gemma3_270m.model.config.to_dict(), "fp32"), resolve_model("gemma-3-270m", "fp32")):
        planned = plan_schedule(shape, resolve_gpu("h100"), schedule, dtype="fp32", sinks=4, device="cpu")
        assert [s.kv_bytes for s in planned.steps] == [r.kv_bytes_actual for r in records]
        assert [s.kv_bytes_by_type for s in planned.steps] == [r.kv_bytes_by_type for r in records]
    last = records[-1].to_dict()
    assert last["layer_budgets"] == ([512] * 5 + [256]) * 3
    assert last["layer_memory_after"] == ([511] * 5 + [260]) * 3


def test_questions_are_asked_as_completions(gemma3_270m):
    """A base model: the document, then "Question: ...", then "Answer:", after <bos>; with the
    full cache the 270M model answers the needle (it restates the question, then the code)."""
    from memstep.runner import DocumentRun

    tokenizer = gemma3_270m.tokenizer
    text = "The secret code of the lighthouse is 48213. " + (ASSETS / "persuasion_excerpt.txt").read_text()[:300]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    run = DocumentRun(gemma3_270m, ids, schedule="full", question="What is the secret code of the lighthouse?",
                      max_new_tokens=14)
    result = run.run()
    payload = result.to_dict()
    assert payload["prompt_form"] == "completion" and run.head == [tokenizer.bos_token_id]
    assert payload["layers"]["window"] == 512 and payload["layers"]["layers_by_type"] == {"global": 3, "sliding": 15}
    assert tokenizer.decode(prompt_tail(tokenizer)).endswith("Question: What is the secret code of the lighthouse?"
                                                            "\nAnswer:")
    assert "48213" in result.answer


def prompt_tail(tokenizer):
    from memstep.generate import prompt_parts

    return prompt_parts(tokenizer, "What is the secret code of the lighthouse?").tail
