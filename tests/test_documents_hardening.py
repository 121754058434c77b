"""Documents from the wild: legacy encodings decoded right, UTF-16 without a byte order mark,
the binary-file threshold, and huge texts tokenized only as far as the limit needs (issue 12)."""

from __future__ import annotations

import os

import pytest

from memstep.documents import BINARY_CONTROL_SHARE, read_document_bytes, tokenize_document, tokenize_prefix
from memstep.errors import MemstepError
from memstep.reading import read_document

from tests.fixtures_documents import ASSETS, tokenizer  # noqa: F401

GERMAN = ("Über die Brücke ging er zur Straße, wo die Mädchen spielten. Die Größe der Bäume überraschte ihn; "
          "später aß er Käse und trank Bier.")
FRENCH = ("Où êtes-vous allé cet été ? Le garçon a mangé une crème brûlée à Noël, puis il s'est reposé près de "
          "la fenêtre. Déjà l'hiver arrivait.")
CP1252_ONLY = "Œuvre complète — “citations” – 5 € la pièce, naïve"  # (NFKC turns … into ...)


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
@pytest.mark.parametrize("text", [GERMAN, FRENCH], ids=["german", "french"])
def test_latin1_and_cp1252_are_decoded_right(tmp_path, encoding, text):
    path = tmp_path / "old.txt"
    path.write_bytes(text.encode(encoding))
    assert read_document(path) == text


@pytest.mark.parametrize("text,encoding", [(CP1252_ONLY, "cp1252"), ("Zażółć gęślą jaźń, powiedział Łukasz.", "cp1250"),
                                           ("Съешь же ещё этих мягких французских булок, да выпей чаю.", "cp1251")])
def test_other_legacy_code_pages(text, encoding):
    assert read_document_bytes(text.encode(encoding), "x.txt") == text


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("text", [GERMAN, "Съешь же ещё этих мягких французских булок.", "日本語のテキストです。"])
def test_utf16_without_bom_is_text(encoding, text):
    data = text.encode(encoding)
    assert not data.startswith((b"\xff\xfe", b"\xfe\xff"))
    assert read_document_bytes(data, "x.txt") == text


def _with_controls(share: float, length: int = 4000) -> bytes:
    controls = int(length * share)
    body = ("word " * length)[: length - controls]
    return (body + "\x01" * controls).encode("ascii")


def test_binary_threshold_between_3_and_10_percent_control_characters():
    assert BINARY_CONTROL_SHARE == 0.05
    assert read_document_bytes(_with_controls(0.03), "x.txt").startswith("word")  # ~3%: text
    with pytest.raises(MemstepError, match="binary"):
        read_document_bytes(_with_controls(0.10), "x.txt")  # ~10%: binary


def test_random_bytes_stay_binary():
    for seed in range(5):
        data = bytes(((i * 7919 + seed * 104729) ^ (i >> 3)) & 0xFF for i in range(4096)) + os.urandom(64)
        with pytest.raises(MemstepError, match="binary"):
            read_document_bytes(data, "blob.txt")


# ---- only as much text as the limit needs -------------------------------------------------------
class CountingTokenizer:
    """Wraps a tokenizer and records how many characters it was given."""

    def __init__(self, inner):
        self.inner, self.chars = inner, 0

    def __call__(self, text, **kwargs):
        self.chars += len(text)
        return self.inner(text, **kwargs)

    def decode(self, ids):
        return self.inner.decode(ids)


@pytest.mark.parametrize("text", [GERMAN * 40, "1234567890" * 400, "日本語のテキストです。" * 200,
                                  "supercalifragilistic" * 300])
@pytest.mark.parametrize("limit", [1, 17, 300])
def test_prefix_tokens_equal_the_whole_texts(tokenizer, text, limit):  # noqa: F811
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids, cut = tokenize_prefix(text, tokenizer, limit)
    assert ids == whole[:limit] and cut == (len(whole) > limit)


def test_huge_text_is_tokenized_only_as_far_as_needed(tokenizer):  # noqa: F811
    huge = FRENCH * 100_000  # ~13 MB of text
    counting = CountingTokenizer(tokenizer)
    ids, notice = tokenize_document(huge, counting, 300)
    assert len(ids) == 300 and notice.startswith("Document truncated to 300 tokens")
    assert counting.chars < 20_000  # not 13 MB


class PieceCounting:
    """A fast tokenizer that records the length of every text it is handed."""

    is_fast = True

    def __init__(self, inner, shift_starts: bool = False):
        self.inner, self.calls, self.shift_starts = inner, [], shift_starts

    def __call__(self, text, **kwargs):
        self.calls.append(len(text))
        out = self.inner(text, **kwargs)
        if self.shift_starts and len(self.calls) > 1:  # like a tokenizer that marks where each text begins
            out = dict(out, input_ids=[0] + list(out["input_ids"]))
            if "offset_mapping" in out:
                out["offset_mapping"] = [(0, 0)] + list(out["offset_mapping"])
        return out


def test_a_whole_novel_is_tokenized_in_pieces_into_the_whole_texts_tokens(tokenizer):  # noqa: F811
    from memstep.documents import _OVERLAP_CHARS, PIECE_CHARS

    text = read_document(ASSETS / "pride_and_prejudice.txt")
    whole = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    counting = PieceCounting(tokenizer)
    ids, cut = tokenize_prefix(text, counting, None)
    assert ids == whole and not cut
    assert max(counting.calls) == PIECE_CHARS  # never the whole 680k characters at once
    assert len(text) < sum(counting.calls) <= len(text) + len(counting.calls) * _OVERLAP_CHARS  # overlaps only
    for limit in (9000, 40_000, len(whole), len(whole) + 1):
        ids, cut = tokenize_prefix(text, PieceCounting(tokenizer), limit)
        assert ids == whole[:limit] and cut == (len(whole) > limit)
    counting = PieceCounting(tokenizer)
    tokenize_prefix(text, counting, 9000)  # stops at the piece that holds enough tokens
    assert sum(counting.calls) < 3 * PIECE_CHARS


def test_pieces_that_do_not_restart_alike_fall_back_to_one_call(tokenizer):  # noqa: F811
    text = read_document(ASSETS / "pride_and_prejudice.txt")[:200_000]
    shifting = PieceCounting(tokenizer, shift_starts=True)  # the second piece would begin with a stray token
    ids, _ = tokenize_prefix(text, shifting, None)
    assert shifting.calls[-1] == len(text)  # refused the pieces, tokenized at once
    assert ids == [0] + tokenizer(text, add_special_tokens=False)["input_ids"]  # what that call gave
    spaces = " " * 150_000 + "The end."  # one token per run of spaces: no place to restart
    ids, _ = tokenize_prefix(spaces, tokenizer, None)
    assert ids == tokenizer(spaces, add_special_tokens=False)["input_ids"]
