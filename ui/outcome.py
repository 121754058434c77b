"""Why a run answered what it did: where the full cache's answer sits in the document, which
step read it and which step evicted it, and the matches of a search with their retention.

Pure functions of text, token spans and step records (no Gradio): the Run tab's answer box,
its map and its text view call them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memstep.records import StepRecord

MAX_MATCHES = 50  # matches a search outlines (and the answer's occurrences we follow)
MAX_QUERY_CHARS = 200
STOP_WORDS = frozenset("""a an the and or but of to in on at by for with from as is are was were be been being it its
this that these those he she they them his her their him i you we our your my me not no yes do does did has have had
so than then there here what which who whom whose when where why how all any some one very just also into out up
about over after before again more most such only own same too can will would should could may might must shall
""".split())


@dataclass(frozen=True)
class History:
    """What happened to a stretch of tokens: the step that read its last token (1-based), the
    step after which no layer-head slot kept any of it (None: it stayed), and the share of
    slots keeping it after the last step given."""

    read: int | None
    left: int | None
    kept: float | None


def history(records: Sequence[StepRecord], start: int, end: int) -> History:
    """The History of input positions [start, end) over ``records``."""
    read = left = None
    kept = None
    for record in records:
        if record.tokens_seen < end:
            continue
        kept = float(np.mean(record.global_kept_fraction()[start:end]))
        if read is None:
            read = record.step + 1
        if left is None and kept == 0:
            left = record.step + 1
    return History(read, left, kept)


def _words(text: str) -> list[str]:
    return re.findall(r"[\w][\w'’-]*", text.lower())


def _normalized(answer: str | None) -> str:
    return " ".join(_words(answer or ""))


def answers_differ(compressed: str | None, full: str | None) -> bool:
    """Whether two answers say different things (case, spacing and punctuation aside)."""
    return _normalized(compressed) != _normalized(full)


def _find(pattern: str, text: str, limit: int) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m, _ in zip(re.finditer(pattern, text, re.I), range(limit))]


def answer_spans(answer: str | None, question: str | None, text: str, limit: int = MAX_MATCHES) -> list[tuple[int, int]]:
    """Character spans of ``text`` where the answer's substance appears: its numbers first (the
    passkey story, generalized), else the longest run of its words that holds a word the
    question does not (names, places), found in the text, the rarest of runs as long (so the
    answer's own name, not a common word of the text). [] when nothing of it is there."""
    answer = (answer or "").strip()
    if not answer:
        return []
    asked = set(_words(question or ""))
    # standalone numbers of two digits or more ("57071", "1,760"), not digits inside a word
    numbers = [n for n in re.findall(r"(?<!\w)\d[\d,.]*\d(?!\w)", answer) if n not in asked]
    for number in sorted(numbers, key=len, reverse=True):
        spans = _find(rf"(?<![\w]){re.escape(number)}(?![\d\w])", text, limit)
        if spans:
            return spans
    words = re.findall(r"[\w][\w'’-]*", answer)
    content = [w.lower() not in STOP_WORDS and w.lower() not in asked for w in words]
    for size in range(min(len(words), 8), 0, -1):
        found = []
        for i in range(len(words) - size + 1):
            if not (content[i] and content[i + size - 1]):  # a run starts and ends on words of substance
                continue
            pattern = r"\b" + r"\W+".join(re.escape(w) for w in words[i:i + size]) + r"\b"
            spans = _find(pattern, text, limit)
            if spans:
                found.append(spans)
        if found:  # the longest run found; of runs as long, the rarest (a name, not a word on every page)
            return min(found, key=len)
    return []


def search_spans(query: str | None, text: str, limit: int = MAX_MATCHES) -> list[tuple[int, int]]:
    """Case-insensitive matches of ``query`` (spaces match any run of whitespace)."""
    query = (query or "").strip()[:MAX_QUERY_CHARS]
    if not query:
        return []
    pattern = r"\s+".join(re.escape(part) for part in query.split())
    return _find(pattern, text, limit)


def token_range(spans, chars: tuple[int, int]) -> tuple[int, int] | None:
    """Document tokens [start, end) overlapping the characters ``chars``; None when the
    characters lie beyond the tokens the run read (cut by truncation). ``spans``: (n, 2)
    character spans, an array or a list of pairs."""
    spans = np.asarray(spans).reshape(-1, 2)
    inside = np.flatnonzero((spans[:, 0] < chars[1]) & (spans[:, 1] > chars[0]))
    if not len(inside):
        return None
    return int(inside[0]), int(inside[-1]) + 1


def describe_history(h: History, steps: int) -> str:
    """'read in step 2 of 3 and left the memory in step 3' (and the like)."""
    if h.read is None:
        return "not read yet"
    where = f"read in step {h.read} of {steps}"
    if h.left is not None:
        return f"{where} and **left the memory in step {h.left}**"
    if h.kept is not None and h.kept >= 0.999:
        return f"{where} and stayed in every layer-head slot"
    return f"{where} and stayed, faintly: {h.kept:.0%} of the layer-head slots still hold it"
