"""memstep.passkey: needle placement (length, depth, token span), passkeys and scoring."""

from __future__ import annotations

import re

import pytest

from memstep.errors import MemstepError
from memstep.passkey import (THINGS, PasskeyDoc, answer_contains_passkey, make_haystack,
                             needle_sentence, question_for, random_passkey, random_thing)

try:
    from fixtures_documents import ASSETS, tokenizer  # noqa: F401 (a pytest fixture)
except ImportError:  # tests/ imported as a package
    from tests.fixtures_documents import ASSETS, tokenizer  # noqa: F401


@pytest.fixture(scope="module")
def prose():
    return (ASSETS / "pride_and_prejudice_ch1-12.txt").read_text(encoding="utf-8")


def sentence_tokens(tokenizer, text: str) -> int:
    """Tokens of the longest sentence in `text`: the tolerance "within one sentence"."""
    sentences = re.split(r"(?<=[.!?])\s+|\n\s*\n", text)
    return max(len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in sentences)


def check_doc(doc: PasskeyDoc, tokenizer, length_tokens: int, depth: float, slack: int):
    ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
    assert doc.length_tokens == len(ids)
    # Length: never over, and short by less than one sentence.
    assert length_tokens - slack <= doc.length_tokens <= length_tokens
    # Needle characters and tokens.
    assert doc.text[doc.needle_char_start:doc.needle_char_end] == doc.needle
    assert doc.text.count(doc.needle) == 1
    needle_ids = ids[doc.needle_token_start:doc.needle_token_end]
    assert tokenizer.decode(needle_ids).strip() == doc.needle
    assert doc.answer in tokenizer.decode(needle_ids)
    # Depth: 0.0 = first token, 1.0 = last tokens; within one sentence otherwise.
    needle_len = doc.needle_token_end - doc.needle_token_start
    haystack_tokens = doc.length_tokens - needle_len
    assert abs(doc.needle_token_start - depth * haystack_tokens) <= slack
    if depth == 0.0:
        assert doc.needle_token_start == 0 and doc.text.startswith(doc.needle)
    if depth == 1.0:
        assert doc.needle_token_end == doc.length_tokens and doc.text.endswith(doc.needle)


@pytest.mark.parametrize("length_tokens", [120, 1000, 4096])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.77, 1.0])
def test_length_and_depth_within_one_sentence(tokenizer, prose, length_tokens, depth):
    passkey = random_passkey(length_tokens)
    doc = make_haystack(prose, tokenizer, length_tokens, depth, passkey)
    check_doc(doc, tokenizer, length_tokens, depth, sentence_tokens(tokenizer, prose))
    assert doc.answer == str(passkey) and doc.depth == depth
    assert doc.needle == f"The magic number for the vault is {passkey}."
    assert doc.question == "What is the magic number for the vault?"
    assert doc.text.startswith(("Pride and Prejudice", doc.needle))  # taken from the start


def test_short_haystack_is_repeated(tokenizer):
    text = "The cat sat on the mat. It was a sunny day! Was the dog there? No."
    doc = make_haystack(text, tokenizer, 500, 0.3, 4242, thing="garden")
    check_doc(doc, tokenizer, 500, 0.3, sentence_tokens(tokenizer, text) + 2)
    assert doc.text.count("The cat sat on the mat.") > 10
    assert doc.question == "What is the magic number for the garden?"


def test_needle_never_splits_abbreviations(tokenizer):
    text = "Mr. Bennet spoke to Mrs. Long at St. James. J. Smith agreed. " * 20
    for depth in (0.2, 0.5, 0.9):
        doc = make_haystack(text, tokenizer, 300, depth, 11111)
        before = doc.text[:doc.needle_char_start].rstrip()
        assert before.endswith(("James.", "agreed.")), before[-30:]


def test_string_passkey_and_different_things(tokenizer, prose):
    doc = make_haystack(prose, tokenizer, 600, 0.5, "007", thing="lighthouse")
    assert doc.answer == "007"
    assert doc.needle == needle_sentence("007", "lighthouse")
    assert doc.question == question_for("lighthouse")


def test_random_passkey_and_thing_are_deterministic():
    keys = [random_passkey(seed) for seed in range(50)]
    assert keys == [random_passkey(seed) for seed in range(50)]
    assert all(10000 <= key <= 99999 for key in keys)
    assert len(set(keys)) > 45
    assert random_thing(3) == random_thing(3) and random_thing(3) in THINGS
    assert len({random_thing(seed) for seed in range(50)}) > 3


@pytest.mark.parametrize("answer, passkey, found", [
    ("The magic number for the vault is 7391.", 7391, True),
    ("7391", "7391", True),
    ("It is 7391!", 7391, True),
    ("The number is 73910.", 7391, False),
    ("The number is 17391.", 7391, False),
    ("The number is 7,391.", 7391, False),  # exact digit runs only, by design
    ("The number is 7.391", 7391, False),
    ("I do not know.", 7391, False),
    ("Numbers: 12 and 7391 and 5.", 7391, True),
    ("", 7391, False),
])
def test_answer_contains_passkey(answer, passkey, found):
    assert answer_contains_passkey(answer, passkey) is found


@pytest.mark.parametrize("kwargs, words", [
    (dict(depth=-0.1), "depth"),
    (dict(depth=1.5), "depth"),
    (dict(depth=float("nan")), "depth"),
    (dict(depth="half"), "depth"),
    (dict(length_tokens=10), "cannot hold the needle"),
    (dict(length_tokens=0), "cannot hold the needle"),
    (dict(length_tokens=500.5), "whole number"),
    (dict(passkey=-5), "passkey"),
    (dict(passkey="12ab"), "passkey"),
    (dict(passkey=""), "passkey"),
    (dict(thing=""), "thing"),
    (dict(thing="vault\nIgnore this"), "thing"),
    (dict(haystack_text="   "), "empty"),
    (dict(haystack_text="no sentence end here " * 300), "sentence"),
])
def test_bad_inputs(tokenizer, prose, kwargs, words):
    args = dict(haystack_text=prose, tokenizer=tokenizer, length_tokens=500, depth=0.5,
                passkey=12345) | kwargs
    with pytest.raises(MemstepError, match=words):
        make_haystack(**args)


def test_slow_tokenizer_is_refused(prose):
    class SlowTokenizer:
        is_fast = False

    with pytest.raises(MemstepError, match="fast tokenizer"):
        make_haystack(prose, SlowTokenizer(), 500, 0.5, 12345)
