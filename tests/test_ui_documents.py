"""The app's document handling without a model: examples, uploads checked on the server,
passkey needles found and mapped to tokens, truncation with a notice, settings checks."""

from __future__ import annotations

import pytest

from memstep.errors import MemstepError
from memstep.passkey import make_haystack
from ui.documents import EXAMPLES, example, needle_tokens, read_upload, token_spans, with_needle
from ui.runs import RunSettings, check_settings, document_limit, prepare, settings_from

from tests.fixtures_documents import ASSETS, tokenizer  # noqa: F401


def test_every_example_builds_and_passkey_examples_know_their_needle(tokenizer):  # noqa: F811
    for name in EXAMPLES:
        source = example(name, tokenizer)
        assert source.text and source.question
        if name.startswith("Passkey"):
            start, end = source.needle_chars
            assert source.text[start:end] == f"The magic number for the {source.question.split()[-1][:-1]} " \
                                              f"is {source.passkey}."
    assert example(next(iter(EXAMPLES)), tokenizer) is example(next(iter(EXAMPLES)), tokenizer)  # cached


def test_needle_tokens_match_the_haystack_generator(tokenizer):  # noqa: F811
    text = (ASSETS / "persuasion_excerpt.txt").read_text()
    doc = make_haystack(text, tokenizer, 900, 0.3, 27182, thing="garden")
    source = with_needle("doc", doc.text)
    assert source.passkey == "27182" and source.question == "What is the magic number for the garden?"
    ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
    spans = token_spans(doc.text, tokenizer, ids)
    assert needle_tokens(spans, source.needle_chars) == (doc.needle_token_start, doc.needle_token_end)
    assert needle_tokens(spans[: doc.needle_token_start + 2], source.needle_chars) is None  # cut off


def test_prepare_truncates_with_a_notice_and_says_when_the_passkey_was_cut(tokenizer):  # noqa: F811
    text = (ASSETS / "persuasion_excerpt.txt").read_text()
    doc = make_haystack(text, tokenizer, 900, 0.8, 11111)
    prepared = prepare(with_needle("doc", doc.text), tokenizer, 300, context=8192)
    assert len(prepared.ids) == 300 and prepared.needle is None
    assert prepared.notices[0].startswith("Document truncated to 300 tokens (the max tokens setting): about the "
                                          f"first {len(tokenizer.decode(prepared.ids)):,} of its {len(doc.text):,}")
    assert "passkey" in prepared.notices[1]
    by_context = prepare(with_needle("doc", doc.text), tokenizer, None, context=600)
    assert len(by_context.ids) == 600 - by_context.prefix_tokens - 128
    assert "context" in by_context.notices[0]
    whole = prepare(with_needle("doc", doc.text), tokenizer, 4096, context=8192)
    assert not whole.notices and whole.needle == (doc.needle_token_start, doc.needle_token_end)


@pytest.mark.parametrize("name, data, message", [
    ("notes.docx", b"PK\x03\x04", "Unsupported file type"),
    ("empty.md", b"", "contains no text"),
    ("blob.txt", bytes(range(256)) * 4, "binary"),
    ("big.txt", b"word " * 400, "upload limit"),
])
def test_uploads_are_checked_on_the_server(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(MemstepError, match=message):
        read_upload(path, max_bytes=1500)


def test_a_good_upload_reads_its_text(tmp_path):
    path = tmp_path / "page.html"
    path.write_text("<html><body><p>The magic number for the vault is 4242.</p><script>x()</script></body></html>")
    source = read_upload(path)
    assert source.name == "page.html" and source.passkey == "4242" and "x()" not in source.text


def test_settings_from_the_page_and_the_preview_checks():
    assert settings_from("IMDC", 512.0, 256.0, "sqrt", None, 4.0) == RunSettings("imdc", 512, 256, "sqrt",
                                                                                 "chunk-attention", 4)
    with pytest.raises(MemstepError, match="chunk size is empty"):
        settings_from("fm", None, 512, "linear", None, 4)
    with pytest.raises(MemstepError, match="smaller than the 4 sink"):
        check_settings(RunSettings("fm", 64, 2, sinks=4), 1000)
    with pytest.raises(MemstepError, match="larger than the document"):
        check_settings(RunSettings("imdc", 2000, 512), 1000)
    check_settings(RunSettings("full", 2000, 0), 1000)  # full ignores chunk and memory
    assert document_limit(4096, 8192, 24) == (4096, "the max tokens setting")
    assert document_limit(None, 2048, 24) == (2048 - 24 - 128, "the model's 2,048-token context")
    assert RunSettings("imdc", 512, 512, "sqrt", "snapkv").label() == "IMDC sqrt c512 M512 · snapkv"
