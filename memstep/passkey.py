"""Needle-in-a-haystack documents: a passkey sentence hidden at a chosen depth in prose.

The needle is a plain statement about a named thing, asked back by that name:
    "The magic number for the vault is 73915."  /  "What is the magic number for the vault?"
A 135M model answers this phrasing reliably with the full cache; "The pass key is N.
Remember it." and free-text needles mostly fail, so keep it.
"""

from __future__ import annotations

import bisect
import math
import operator
import random
import re
from dataclasses import dataclass

from memstep.errors import MemstepError

THINGS = ("vault", "lighthouse", "garden", "library", "harbour", "orchard", "observatory",
          "castle", "bakery", "museum")

# A sentence ends after . ! or ? (plus closing quotes/brackets) and whitespace, or at a
# blank line (chapter headings have no full stop).
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*\s+|\n\s*\n")
# "Mr. Bennet" is not two sentences.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "esq", "jr", "sr", "prof", "rev", "col",
                  "capt", "gen", "lt", "mt", "vs", "e.g", "i.e"}


@dataclass
class PasskeyDoc:
    """A haystack with one needle. Token indices refer to
    `tokenizer(text, add_special_tokens=False)`; `needle_*_end` are exclusive."""

    text: str
    question: str
    answer: str  # the passkey, as written in the needle
    needle: str
    needle_char_start: int
    needle_char_end: int
    needle_token_start: int
    needle_token_end: int
    length_tokens: int  # actual length of `text` in tokens
    depth: float  # requested depth: 0.0 = needle first, 1.0 = needle last


def random_passkey(seed) -> int:
    """A 5-digit passkey, the same for the same seed."""
    return random.Random(f"passkey-{seed}").randint(10000, 99999)


def random_thing(seed) -> str:
    """The named thing of the needle ("vault", "lighthouse", ...), the same for the same seed."""
    return random.Random(f"thing-{seed}").choice(THINGS)


def needle_sentence(passkey: int | str, thing: str = "vault") -> str:
    return f"The magic number for the {thing} is {passkey}."


def question_for(thing: str = "vault") -> str:
    return f"What is the magic number for the {thing}?"


def answer_contains_passkey(answer: str, passkey: int | str) -> bool:
    """True when the passkey appears in the answer as a whole run of digits.

    Exact match only: "7391" counts in "The magic number is 7391." but not in "73910",
    "17391" or "7,391" (a model that reformats the number did not retrieve it verbatim)."""
    return re.search(rf"(?<![0-9]){re.escape(str(passkey))}(?![0-9])", answer) is not None


def make_haystack(haystack_text: str, tokenizer, length_tokens: int, depth: float,
                  passkey: int | str, *, thing: str = "vault") -> PasskeyDoc:
    """Prose from the start of `haystack_text` (repeated if too short), cut at a sentence
    boundary, with the needle inserted at the sentence boundary nearest to `depth`.

    The result has at most `length_tokens` tokens and misses it by less than one sentence;
    the needle's token start is within one sentence of `depth` x (tokens of haystack).
    `tokenizer` must be a Hugging Face fast tokenizer (the placement uses its offsets)."""
    if not getattr(tokenizer, "is_fast", False):
        raise MemstepError("Passkey documents need a fast tokenizer (with offsets); "
                           "load it with AutoTokenizer.from_pretrained(..., use_fast=True).")
    length_tokens, depth, answer = _check_inputs(haystack_text, length_tokens, depth, passkey,
                                                 thing)
    doc = place_needle(haystack_text, tokenizer, length_tokens, depth, needle_sentence(answer, thing))
    doc.question, doc.answer = question_for(thing), answer
    return doc


def place_needle(haystack_text: str, tokenizer, length_tokens: int, depth: float, needle: str) -> PasskeyDoc:
    """Any needle sentence hidden in prose as ``make_haystack`` hides the passkey (its
    ``question`` and ``answer`` left empty for the caller); inputs already checked."""
    if not getattr(tokenizer, "is_fast", False):
        raise MemstepError("Needle documents need a fast tokenizer (with offsets); "
                           "load it with AutoTokenizer.from_pretrained(..., use_fast=True).")
    needle_tokens = _count(tokenizer, " " + needle)
    if length_tokens <= needle_tokens:
        raise MemstepError(f"length_tokens={length_tokens} cannot hold the needle "
                           f"({needle_tokens} tokens); use a few hundred tokens or more.")

    source, offsets = _enough_text(haystack_text, tokenizer, length_tokens)
    starts = [start for start, _ in offsets]
    # Sentences as (start, end) character spans; tokens_before[i] = tokens before sentence i,
    # counted up to the end of sentence i-1 (the space before a word belongs to its token).
    spans = _sentence_spans(source)
    boundaries = [spans[0][0] if spans else 0] + [end for _, end in spans]
    tokens_before = [bisect.bisect_left(starts, b) for b in boundaries]
    # Most sentences that leave room for the needle (exact count checked below).
    n = max((i for i, before in enumerate(tokens_before)
             if before + needle_tokens <= length_tokens), default=0)
    while n > 0:
        doc = _assemble(source, spans[:n], tokens_before, needle, depth, tokenizer)
        if doc.length_tokens <= length_tokens:  # merges at the joins can add a token or two
            return doc
        n -= 1
    raise MemstepError("The haystack text has no sentence short enough to fit in "
                       f"{length_tokens} tokens; use prose with full stops, or more tokens.")


def _check_inputs(haystack_text, length_tokens, depth, passkey, thing):
    """Validated (length_tokens, depth, passkey as a string)."""
    try:
        depth_value = float(depth)
    except (TypeError, ValueError):
        depth_value = math.nan
    if isinstance(depth, bool) or not 0.0 <= depth_value <= 1.0:  # also rejects NaN
        raise MemstepError(f"depth must be between 0.0 (start) and 1.0 (end), got {depth!r}.")
    try:
        if isinstance(length_tokens, bool):
            raise TypeError
        length = operator.index(length_tokens)  # ints and numpy ints, not 8.5
    except TypeError:
        raise MemstepError(
            f"length_tokens must be a whole number, got {length_tokens!r}.") from None
    answer = str(passkey)
    if isinstance(passkey, bool) or not answer.isascii() or not answer.isdigit():
        raise MemstepError(f"The passkey must be a non-negative whole number, got {passkey!r}.")
    if not isinstance(thing, str) or not re.fullmatch(r"[A-Za-z][A-Za-z '-]*", thing):
        raise MemstepError(f"thing must be a plain name such as 'vault', got {thing!r}.")
    if not isinstance(haystack_text, str) or not haystack_text.strip():
        raise MemstepError("The haystack text is empty; pass some prose (e.g. a novel).")
    return length, depth_value, answer


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _enough_text(text: str, tokenizer, length_tokens: int) -> tuple[str, list[tuple[int, int]]]:
    """A prefix of `text` (repeated, copies joined by a blank line) with more than
    `length_tokens` tokens, and its token offsets. Tokenizes only about what is needed."""
    text = text.strip()
    chars = 6 * length_tokens + 200  # English prose is about 4-5 characters per token
    while True:
        copies = -(-chars // (len(text) + 2))
        source = "\n\n".join([text] * copies)[:chars]
        encoding = tokenizer(source, add_special_tokens=False, verbose=False,
                             return_offsets_mapping=True)
        # A margin, because the sentence cut at the end of the prefix is dropped.
        if len(encoding["input_ids"]) > length_tokens + length_tokens // 8 + 64:
            return source, [tuple(o) for o in encoding["offset_mapping"]]
        chars *= 2


def _sentence_spans(source: str) -> list[tuple[int, int]]:
    """(start, end) of each complete sentence, without the whitespace that follows it.
    The text after the last sentence end is dropped (the prefix may cut a sentence)."""
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(source):
        word = re.search(r"([\w.]*)[.]$", source[start:match.start() + 1])
        if match.group()[0] == "." and word and (word.group(1).lower() in _ABBREVIATIONS
                                                 or re.fullmatch(r"[A-Z]", word.group(1))):
            continue  # "Mr. Bennet", "J. Smith": not a sentence end
        end = match.start() + len(match.group().rstrip())
        if source[start:end].strip():
            spans.append((start, end))
        start = match.end()
    return spans


def _assemble(source, spans, tokens_before, needle, depth, tokenizer) -> PasskeyDoc:
    """Join the sentences with the needle placed at the boundary nearest to `depth`."""
    n = len(spans)
    haystack_tokens = tokens_before[n]
    at = min(range(n + 1), key=lambda i: abs(tokens_before[i] - depth * haystack_tokens))
    before = source[spans[0][0]:spans[at - 1][1]] if at > 0 else ""
    after = source[spans[at][0]:spans[n - 1][1]] if at < n else ""
    # Keep the original whitespace (e.g. a paragraph break) before the needle.
    gap = source[spans[at - 1][1]:spans[at][0]] if 0 < at < n else " "
    text = before + (gap if before else "") + needle + (" " if after else "") + after
    char_start = len(before) + (len(gap) if before else 0)
    char_end = char_start + len(needle)

    offsets = tokenizer(text, add_special_tokens=False, verbose=False,
                        return_offsets_mapping=True)["offset_mapping"]
    # Tokens that overlap the needle's characters (a token may carry the space before it).
    overlapping = [i for i, (s, e) in enumerate(offsets) if s < char_end and e > char_start]
    return PasskeyDoc(text=text, question="", answer="", needle=needle,  # caller fills in
                      needle_char_start=char_start, needle_char_end=char_end,
                      needle_token_start=overlapping[0], needle_token_end=overlapping[-1] + 1,
                      length_tokens=len(offsets), depth=depth)
