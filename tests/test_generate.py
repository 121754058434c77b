"""After the prefill: prompt framing, continuation NLL and answers from the compressed memory
(memstep.generate through memstep.runner.DocumentRun)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import ASSETS
from test_models import tiny_lm, tiny_lm_folder  # noqa: F401  (fixtures)

from memstep import runner
from memstep.documents import tokenize_document
from memstep.errors import MemstepError
from memstep.generate import prompt_parts
from memstep.passkey import answer_contains_passkey, make_haystack
from memstep.runner import DocumentRun

PROSE = (ASSETS / "pride_and_prejudice_ch1-12.txt").read_text()


@pytest.fixture(scope="module")
def document(tiny_lm):
    return tokenize_document(PROSE, tiny_lm.tokenizer, 300)[0]


def direct_nll(model, ids: list[int], held_out: int) -> float:
    """Mean NLL of the last `held_out` tokens from one plain full forward."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    first = len(ids) - held_out
    return float(torch.nn.functional.cross_entropy(logits[first - 1:-1], torch.tensor(ids[first:])))


# ---- prompt framing ------------------------------------------------------------------------
def test_prompt_parts_follow_the_chat_template(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    parts = prompt_parts(tokenizer, "Who rented Netherfield?")
    head, tail = tokenizer.decode(parts.head), tokenizer.decode(parts.tail)
    assert head.endswith("<|im_start|>user\n")  # SmolLM2's template opens the user turn
    assert "Who rented Netherfield?" in tail and tail.endswith("<|im_start|>assistant\n")
    assert prompt_parts(tokenizer).head == parts.head  # the head does not depend on the question


def test_prompt_parts_without_a_chat_template(tiny_lm):
    tokenizer = copy.deepcopy(tiny_lm.tokenizer)
    tokenizer.chat_template = None
    parts = prompt_parts(tokenizer, "Who?")
    assert parts.head == []
    assert tokenizer.decode(parts.tail) == "\n\nQuestion: Who?\nAnswer:"


# ---- continuation NLL ----------------------------------------------------------------------
def test_full_schedule_nll_equals_a_direct_forward(tiny_lm, document):
    run = DocumentRun(tiny_lm, document, schedule="full", continuation_tokens=24)
    result = run.run()
    expected = direct_nll(tiny_lm.model, run.head + document, 24)
    assert result.continuation_tokens == 24 and result.tokens == len(run.head) + len(document) - 24
    assert result.continuation_nll == pytest.approx(expected, abs=1e-4)
    # a chunked run whose budget holds everything is the same computation
    chunked = DocumentRun(tiny_lm, document, schedule="fm", chunk=64, memory=1000, continuation_tokens=24).run()
    assert chunked.continuation_nll == pytest.approx(expected, abs=1e-4)


def test_compressed_nll_is_finite_and_differs(tiny_lm, document):
    full = DocumentRun(tiny_lm, document, schedule="full", continuation_tokens=24).run().continuation_nll
    for schedule in ("fm", "im", "imdc"):
        nll = DocumentRun(tiny_lm, document, schedule=schedule, chunk=64, memory=32,
                          continuation_tokens=24).run().continuation_nll
        assert math.isfinite(nll) and nll != pytest.approx(full, abs=1e-6), schedule


def test_continuation_of_one_token(tiny_lm, document):
    run = DocumentRun(tiny_lm, document, schedule="full", continuation_tokens=1)
    assert run.run().continuation_nll == pytest.approx(direct_nll(tiny_lm.model, run.head + document, 1), abs=1e-4)


def test_the_run_holds_its_tokens_as_one_array(tiny_lm, document):
    """head + document (less the held-out tail) as one int64 array, not a list of Python ints;
    the held-out tokens stay a short list."""
    run = DocumentRun(tiny_lm, document, schedule="imdc", chunk=64, memory=32, continuation_tokens=24)
    assert isinstance(run.input_ids, np.ndarray) and run.input_ids.dtype == np.int64
    assert run.input_ids.tolist() == run.head + list(document[:-24]) and run.held_out == list(document[-24:])
    as_array = DocumentRun(tiny_lm, np.asarray(document), schedule="imdc", chunk=64, memory=32,
                           continuation_tokens=24)
    assert np.array_equal(as_array.input_ids, run.input_ids) and as_array.held_out == run.held_out


# ---- answers -------------------------------------------------------------------------------
def test_question_is_appended_uncompressed_and_memory_is_restored(tiny_lm, document, monkeypatch):
    grown = []
    real_crop = runner.crop_memory

    def spy_crop(engine, mark):  # how big the cache got while answering
        grown.append([layer.keys.shape[2] for layer in engine.cache.layers])
        real_crop(engine, mark)

    monkeypatch.setattr(runner, "crop_memory", spy_crop)
    run = DocumentRun(tiny_lm, document, schedule="imdc", chunk=64, memory=48, question="Who is Mr. Bingley?",
                      max_new_tokens=6, continuation_tokens=10)
    result = run.run()
    memory = result.steps[-1].memory_after
    assert memory == 48 + 4
    tail = len(prompt_parts(tiny_lm.tokenizer, "Who is Mr. Bingley?").tail)
    assert grown[0] == [memory + 9] * 2  # the 10 held-out tokens, less the one predicted from last_hidden
    # the question's tail and each generated token were appended to the memory, none evicted
    assert len(set(grown[1])) == 1 and memory + tail <= grown[1][0] <= memory + tail + 6
    for _ in range(2):  # asking again gives the same answer: the memory was restored
        assert run.ask("Who is Mr. Bingley?") == result.answer
        assert [layer.keys.shape[2] for layer in run.engine.cache.layers] == [memory] * 2
        assert run.engine.tokens_seen == result.tokens


def test_ask_errors(tiny_lm, document):
    run = DocumentRun(tiny_lm, document, schedule="fm", chunk=100, memory=50)
    with pytest.raises(MemstepError, match="run the prefill"):
        run.ask("Who?")
    run.run()
    with pytest.raises(MemstepError, match="question is empty"):
        run.ask("   ")


@pytest.mark.parametrize("kwargs,words", [
    (dict(schedule="fm", chunk=64, memory=2), "smaller than the 4 sink"),
    (dict(schedule="fm", chunk=10_000, memory=64), "larger than the document"),
    (dict(schedule="fm", chunk=64, memory=64, continuation_tokens=300), "continuation tokens"),
    (dict(schedule="fm", chunk=64, memory=64, max_new_tokens=0), "max new tokens"),
    (dict(schedule="fm", chunk=64, memory=64, scorer="h2o"), "unknown scorer"),
    (dict(schedule="imdc", chunk=10, memory=150, growth="square"), "IMDC"),
])
def test_document_run_checks_settings_before_any_work(tiny_lm, document, kwargs, words):
    with pytest.raises(MemstepError, match=words):
        DocumentRun(tiny_lm, document, **kwargs)


# ---- the embedded model: real behaviour -----------------------------------------------------
@pytest.mark.slow
def test_embedded_model_finds_the_passkey_with_the_full_schedule(embedded):
    doc = make_haystack(PROSE, embedded.tokenizer, 1000, depth=0.6, passkey=48213)
    ids, _ = tokenize_document(doc.text, embedded.tokenizer, None)
    assert 900 <= len(ids) <= 1000
    run = DocumentRun(embedded, ids, schedule="full", question=doc.question, max_new_tokens=16)
    result = run.run()
    assert answer_contains_passkey(result.answer, 48213), result.answer
    assert run.ask(doc.question) == result.answer


@pytest.mark.slow
def test_embedded_model_compressed_memory_costs_likelihood(embedded):
    ids, _ = tokenize_document(PROSE, embedded.tokenizer, 640)
    full = DocumentRun(embedded, ids, schedule="full", continuation_tokens=64).run().continuation_nll
    compressed = DocumentRun(embedded, ids, schedule="fm", chunk=256, memory=32, scorer="recency",
                             continuation_tokens=64).run().continuation_nll
    assert 1.0 < full < compressed < 10.0
