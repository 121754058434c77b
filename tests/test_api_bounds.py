"""Bounded work per request, by construction: pasted text is tokenized like uploads (a prefix,
offsets only for the tokens a run keeps), uploads are read a few at a time, /schedule counts
layers x steps before computing, the API's types are strict (bool is bool), and the model field
tells nobody which server paths exist."""

from __future__ import annotations

import threading
import time

import gradio as gr
import psutil
import pytest
from test_models import tiny_lm_folder  # noqa: F401  (fixture)

from memstep.errors import MemstepError
from memstep import reading
from ui import api, documents, handlers, uploads
from ui import models as app_models
from ui.runs import prepare


@pytest.fixture(scope="module")
def tokenizer(tiny_lm_folder):  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_lm_folder))


def big_text(size: int) -> str:
    paragraph = (documents.PERSUASION.read_text(encoding="utf-8"))
    return (paragraph * (size // len(paragraph) + 1))[:size]


def test_a_14_mb_pasted_text_cut_to_16_tokens_costs_what_its_prefix_costs(tiny_lm_folder, monkeypatch):  # noqa: F811
    """The issue's acceptance, by the work done (it took 42 s and 5 GB): the tokenizer reads a
    prefix of the 14 MB text, never the whole of it, and the RSS grows by under 200 MB."""
    from transformers import PreTrainedTokenizerBase

    text = big_text(14_000_000)
    list(api.prefill(document_text="Warm up the model and the tokenizer. " * 4, schedule="full", max_tokens=16,
                     model=str(tiny_lm_folder)))
    read, call = [], PreTrainedTokenizerBase.__call__

    def counting(self, text=None, *args, **kwargs):
        read.append(len(text) if isinstance(text, str) else sum(map(len, text or [])))
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counting)
    process = psutil.Process()
    rss = process.memory_info().rss
    result = list(api.prefill(document_text=text, schedule="full", max_tokens=16, model=str(tiny_lm_folder)))[-1]
    growth = process.memory_info().rss - rss
    assert result["event"] == "result" and result["tokens"] - result["prefix_tokens"] == 16
    assert any("truncated to 16 tokens" in n for n in result["notices"])
    assert read and sum(read) < len(text) // 100, read  # a prefix: at most 1% of the text tokenized
    assert growth < 200e6, growth / 1e6


@pytest.mark.parametrize("size", [300, 5000, 200_000])
def test_spans_of_a_prefix_are_those_of_the_whole_text(tokenizer, size):
    text = big_text(size)
    for limit in (1, 16, 700):
        document = prepare(documents.with_needle("t", text), tokenizer, limit, 8192)
        whole = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        n = len(document.ids)
        assert document.ids == whole["input_ids"][:n]
        assert document.spans.tolist() == [list(s) for s in whole["offset_mapping"][:n]]


def test_a_prefix_ending_inside_the_tokenizer_margin_is_grown(tokenizer):
    """A run of spaces is tokenized into long pieces, and cut short it tokenizes differently: the
    first guess at the prefix (8 characters per token + 256) holds a token or two more than the
    limit, within the margin, and its first tokens are not the whole text's. tokenize_prefix
    must grow the prefix then, and the spans must follow the same tokens."""
    from memstep.documents import _BOUNDARY_TOKENS, CHARS_PER_TOKEN_GUESS, tokenize_prefix

    limit = 5
    text = " " * 4000 + "The end."
    first = tokenizer(text[:limit * CHARS_PER_TOKEN_GUESS + 256], add_special_tokens=False)["input_ids"]
    whole = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert limit < len(first) <= limit + _BOUNDARY_TOKENS  # the cut lands inside the margin...
    assert first[:limit] != whole["input_ids"][:limit]  # ...where the cut text tokenizes differently
    ids, cut = tokenize_prefix(text, tokenizer, limit)
    assert cut and ids == whole["input_ids"][:limit]
    assert documents.token_spans(text, tokenizer, ids).tolist() == [list(s) for s in whole["offset_mapping"][:limit]]


def test_uploads_are_read_a_few_at_a_time(tmp_path, monkeypatch):
    gate, inside = threading.Event(), []

    def slow_read(data, name, **limits):
        inside.append(name)
        gate.wait(10)
        return "Some text."

    monkeypatch.setattr(reading, "read_isolated", slow_read)
    monkeypatch.setattr(uploads, "UPLOAD_WAIT_SECONDS", 0.5)
    paths = []
    for i in range(uploads.UPLOAD_CONCURRENCY + 1):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text("x")
    threads = [threading.Thread(target=documents.read_upload, args=(p,)) for p in paths[:-1]]
    for t in threads:
        t.start()
    while len(inside) < uploads.UPLOAD_CONCURRENCY:
        time.sleep(0.01)
    with pytest.raises(MemstepError, match="busy reading other documents"):
        documents.read_upload(paths[-1])
    # refused while every slot is still held (the gate is closed): it did not wait for one to free
    assert not gate.is_set() and len(inside) == uploads.UPLOAD_CONCURRENCY
    gate.set()
    for t in threads:
        t.join()
    assert documents.read_upload(paths[-1]).text == "Some text."  # a slot is free again


def test_token_counts_keep_digests_not_texts(tokenizer):
    handlers._COUNTS.clear()
    for i in range(3):
        handlers._count_tokens(big_text(200_000) + str(i), tokenizer)
    assert len(handlers._COUNTS) == 3
    assert all(isinstance(digest, bytes) and len(digest) == 16 for digest, _ in handlers._COUNTS)
    assert handlers._count_tokens(big_text(200_000) + "0", tokenizer) == list(handlers._COUNTS.values())[0]


def test_schedule_counts_layers_times_steps_before_any_work(monkeypatch):
    with monkeypatch.context() as patch:
        def built(*args, **kwargs):
            raise AssertionError("a schedule was built before the refusal")

        patch.setattr(api, "make_schedule", built)
        with pytest.raises(gr.Error, match="16,384 steps x 1,024 layers"):  # the request that never answered
            api.schedule(16_777_216, "im", 1024, 1024, "double-inverse", 4, 1024)
    steps = api.MAX_SCHEDULE_CELLS // 32
    out = api.schedule(steps * 64, "im", 64, 1024, "double-inverse", 4, 32)  # at the bound: answered
    assert len(out["layer_memory_sizes"]) == steps and len(out["layer_memory_sizes"][0]) == 32
    with pytest.raises(gr.Error, match="per-layer budgets"):
        api.schedule((steps + 1) * 64, "im", 64, 1024, "double-inverse", 4, 32)
    assert api.schedule(16384 * 64, "imdc", 64, 1024, "linear", 4, 1024)["steps"] == 16384  # not layer-wise


@pytest.mark.parametrize("name, value", [("full_reference", "x"), ("full_reference", [1]), ("full_reference", 1),
                                         ("full_reference", "true"), ("question_aware", 1),
                                         ("question_aware", "yes"), ("chunk", "512"), ("chunk", True),
                                         ("memory", [512]), ("sinks", 4.5), ("max_tokens", "16"),
                                         ("question", 7), ("document_text", b"bytes"), ("example_name", 3),
                                         ("schedule", 1), ("model", {"path": "/"})])
def test_prefill_types_are_strict(name, value):
    kwargs = {"document_text": "Some text.", name: value}
    if name in ("document_text", "example_name"):
        kwargs = {name: value}
    with pytest.raises(gr.Error) as err:
        next(api.prefill(**kwargs))
    assert err.value.message.startswith(name) and "\n" not in err.value.message  # refused for its type, by name


@pytest.mark.parametrize("name, value", [("tokens", "4096"), ("tokens", True), ("chunk", "512"), ("layers", 30.5),
                                         ("layers", "30"), ("sinks", None)])
def test_schedule_types_are_strict(name, value):
    kwargs = {"tokens": 4096, name: value}
    with pytest.raises(gr.Error) as err:
        api.schedule(**kwargs)
    assert err.value.message.startswith(name)


def test_the_model_field_does_not_tell_which_server_paths_exist(tmp_path, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("MEMSTEP_ALLOWED_MODELS", raising=False)
    (tmp_path / "exists").mkdir()
    (tmp_path / "file.bin").write_bytes(b"\0" * 10)
    messages = set()
    for spec in ("/root", str(tmp_path / "exists"), str(tmp_path / "missing"), str(tmp_path / "file.bin"),
                 "/etc/passwd", "/nonexistent/model.gguf", "/etc"):
        with pytest.raises(MemstepError) as err:
            app_models.get_model(spec)
        messages.add(str(err.value).replace(spec[:80], "SPEC"))
    assert len(messages) == 1, messages
    with pytest.raises(gr.Error) as err:  # and through the API
        next(api.prefill(document_text="Some text.", model="/root"))
    assert "Unrecognized" not in str(err.value) and "no model memstep can load there" in str(err.value)


LACO_OK = dict(model_spec="embedded", C=2, L=1, H=0, I=1, T=0.8, variant="paper", reference="dense", sentences=2,
               tokens=16, evaluate=False)
SPARSE_OK = dict(spec="embedded", method="wanda", pattern="unstructured", sparsity=0.5, techniques=["none"],
                 calibration="text", samples=2, seq_len=16, epochs=1, lr=1e-3)


@pytest.mark.parametrize("section, name, value, words", [
    ("laco", "C", "5", "C must be a whole number"), ("laco", "T", True, "T must be a number"),
    ("laco", "evaluate", "x", "measure must be true or false"), ("laco", "variant", {"a": 1}, "merge must be one of"),
    ("laco", "sentences", [6], "calibration sentences must be a whole number"),
    ("laco", "keep_worse", "yes", "keep a worse model must be true or false"),
    ("sparse", "samples", "16", "samples must be a whole number"), ("sparse", "techniques", "br", "techniques must be"),
    ("sparse", "sparsity", None, "sparsity must be a number"), ("sparse", "lr", float("nan"), "learning rate must be"),
    ("sparse", "epochs", 2.5, "epochs must be a whole number"),
])
def test_compress_events_started_through_the_queue_have_strict_types_too(section, name, value, words):
    """The Compress tab's events are private, but the queue starts them for anyone: the same rule."""
    from ui.tabs.compress import laco, sparse

    fn, kwargs = (laco.run_laco, LACO_OK) if section == "laco" else (sparse.prune, SPARSE_OK)
    with pytest.raises(gr.Error, match=words):
        next(fn(**{**kwargs, name: value}))


@pytest.mark.parametrize("name", ["question", "document_text", "model", "example_name", "schedule", "scorer", "rope",
                                  "preset", "attention", "ntk"])
def test_every_text_field_refuses_a_lone_surrogate_in_one_line(name):
    kwargs = {"document_text": "Some text.", name: "why\ud800"}
    if name in ("document_text", "example_name"):
        kwargs = {name: "why\ud800"}
    with pytest.raises(gr.Error) as err:
        next(api.prefill(**kwargs))
    message = err.value.message
    assert message.startswith(f"{name} holds an unpaired surrogate") and "\n" not in message
    message.encode("utf-8")  # the refusal itself is valid text (the bug's reply was {"error": null})
    with pytest.raises(gr.Error, match="growth holds an unpaired surrogate"):
        api.schedule(tokens=4096, growth="\udfff")


def test_the_page_run_refuses_a_lone_surrogate_in_its_question():
    from memstep.errors import MemstepError
    from ui.runs import prefill_stream, settings_from

    with pytest.raises(MemstepError, match="question holds an unpaired surrogate"):
        next(prefill_stream("", [1, 2, 3], settings_from("full", 512, 512, "linear", None, 4), "why\ud800"))
