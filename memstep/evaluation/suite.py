"""The evaluation suite: passkey documents generated from bundled public-domain prose.

One case = one haystack document (text x length x depth x seed) with its question, the
passkey's token span (for retention) and a held-out continuation: the prose that follows
the haystack in the source, scored as a continuation of the compressed memory. Every case
carries token ids, so memstep and a peer in another virtualenv see exactly the same tokens.

Each case reads its own window of the text: it starts at a paragraph drawn from (text,
length, depth, seed), so the cases' continuations are different prose and their NLL
differences are closer to independent samples than twelve needles in one passage would
be. The draw depends on nothing else, so widening a grid leaves existing cases (and their
finished cells) as they were.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from memstep.errors import MemstepError
from memstep.generate import prompt_parts
from memstep.evaluation.needles import KINDS, Needle, make_needle
from memstep.passkey import place_needle

ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"
DEFAULT_HAYSTACK = ASSETS / "pride_and_prejudice_ch1-12.txt"
DEFAULT_HAYSTACKS = (DEFAULT_HAYSTACK, ASSETS / "persuasion_excerpt.txt")
CHARS_PER_TOKEN = 5  # English prose is about 4.3-4.5 characters per SmolLM2 token: a margin


@dataclass
class Case:
    """One passkey document, with everything a worker needs to run it."""

    length: int  # requested haystack length in tokens
    depth: float
    seed: int
    haystack: str  # the text's file name
    start: int  # character offset of the paragraph where this case's window of the text begins
    passkey: str  # what a right answer contains (the passkey, code, word or name)
    question: str
    document_ids: list[int]  # the haystack with the needle, no prompt framing
    continuation_ids: list[int]  # held-out prose right after the haystack
    head_ids: list[int]  # chat-template tokens before the document
    question_ids: list[int]  # chat-template tokens after the document, question included
    needle_tokens: tuple[int, int]  # the needle sentence, document token span
    passkey_tokens: tuple[int, int]  # the answer's tokens (passkey digits, word, name), document token span
    kind: str = "passkey"  # the needle's kind (needles.KINDS)

    @property
    def cell(self) -> dict:
        cell = {"haystack": self.haystack, "length": self.length, "depth": self.depth, "seed": self.seed,
                "start": self.start}
        if self.kind != "passkey":  # passkey cases keep the keys they had before needle kinds
            cell["kind"] = self.kind
        return cell

    def to_dict(self) -> dict:
        return asdict(self)


def _passkey_span(doc, tokenizer) -> tuple[int, int]:
    """Token span of the passkey digits inside the document (offsets of the fast tokenizer)."""
    start = doc.needle_char_start + doc.needle.index(doc.answer)
    end = start + len(doc.answer)
    offsets = tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    hits = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
    return hits[0], hits[-1] + 1


def _continuation(doc, prose: str, tokenizer, tokens: int) -> list[int]:
    """The prose that follows the haystack in its source: the haystack without its needle
    is a prefix of the (repeated) prose, so the continuation starts where it ends."""
    if tokens <= 0:
        return []
    # make_haystack adds the needle and one space (before or after it) to the prose
    plain_end = len(doc.text) - len(doc.needle) - 1
    source = prose.strip()
    while len(source) < plain_end + 20 * tokens:
        source = source + "\n\n" + prose.strip()
    ids = tokenizer(source[plain_end:plain_end + 20 * tokens], add_special_tokens=False)["input_ids"]
    return ids[:tokens]


def paragraph_starts(prose: str) -> list[int]:
    """Character offsets where the paragraphs of ``prose`` begin (blank-line separated)."""
    text = prose.strip()
    return [0] + [m.end() for m in re.finditer(r"\n\s*\n(?=\S)", text)]


def window_start(prose: str, name: str, length: int, depth: float, seed: int) -> int:
    """The paragraph where a case's window of the text begins: drawn from the paragraphs that
    leave ``length`` tokens of text after them (any paragraph when the text is shorter)."""
    text = prose.strip()
    starts = paragraph_starts(text)
    room = [s for s in starts if s + CHARS_PER_TOKEN * length <= len(text)] or starts
    return random.Random(f"window-{name}-{length}-{depth}-{seed}").choice(room)


def rotate(prose: str, start: int) -> str:
    """The text read from ``start``, wrapping round to its beginning."""
    text = prose.strip()
    return text if start == 0 else text[start:] + "\n\n" + text[:start].strip()


def make_case(prose: str, tokenizer, length: int, depth: float, seed: int,
              continuation_tokens: int = 32, name: str = DEFAULT_HAYSTACK.name, start: int | None = None,
              kind: str = "passkey", needle: Needle | None = None) -> Case:
    """One case on ``prose`` (named ``name``) with a needle of ``kind`` (or ``needle`` itself: the
    test split's); ``start`` = None draws its window (window_start), 0 reads the text from its beginning."""
    if start is None:
        start = window_start(prose, name, length, depth, seed if kind == "passkey" else f"{seed}-{kind}")
    prose = rotate(prose, start)
    label = f"{name}-{length}-{depth}-{seed}"
    needle = needle or make_needle(kind, label)
    doc = place_needle(prose, tokenizer, length, depth, needle.sentence)
    doc.question, doc.answer = needle.question, needle.answer
    parts = prompt_parts(tokenizer, doc.question)
    return Case(
        length=length, depth=depth, seed=seed, haystack=name, start=start, passkey=doc.answer, question=doc.question,
        document_ids=tokenizer(doc.text, add_special_tokens=False)["input_ids"],
        continuation_ids=_continuation(doc, prose, tokenizer, continuation_tokens),
        head_ids=prompt_parts(tokenizer).head, question_ids=parts.tail,
        needle_tokens=(doc.needle_token_start, doc.needle_token_end),
        passkey_tokens=_passkey_span(doc, tokenizer), kind=kind)


def read_haystacks(paths=None) -> dict[str, str]:
    """{file name: text} of the haystack texts (default: the two bundled Austen texts)."""
    texts: dict[str, str] = {}
    for path in map(Path, paths or DEFAULT_HAYSTACKS):
        if not path.is_file():
            raise MemstepError(f"haystack text not found: {path} (give existing .txt files to --haystacks)")
        if path.name in texts:
            raise MemstepError(f"two haystacks are named {path.name}: cells are keyed by the file name, rename one")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise MemstepError(f"haystack {path} is not UTF-8 text: give plain prose (.txt)") from None
        if not text.strip():
            raise MemstepError(f"haystack {path} is empty: give a text with some prose")
        texts[path.name] = text
    return texts


def check_kinds(kinds) -> tuple[str, ...]:
    kinds = tuple(kinds)
    for kind in kinds:
        if kind not in KINDS:
            raise MemstepError(f"unknown needle kind '{kind}': choose from {', '.join(KINDS)}")
    if not kinds:
        raise MemstepError(f"choose at least one needle kind ({', '.join(KINDS)})")
    return kinds


def check_lengths(texts: dict[str, str], tokenizer, lengths, continuation_tokens: int) -> None:
    """Every haystack text holds the longest case and its continuation without repeating itself."""
    need = max(lengths) + continuation_tokens
    for name, text in texts.items():
        have = len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        if have < need:
            raise MemstepError(f"haystack {name} has {have} tokens: too short for {max(lengths)}-token cases "
                               f"plus a {continuation_tokens}-token continuation; give a longer text or shorter "
                               "--lengths")


def make_cases(tokenizer, lengths, depths, seeds, haystacks=None, continuation_tokens: int = 32,
               kinds=("passkey",)) -> list[Case]:
    """Every (haystack, length, needle kind, depth, seed) case; ``haystacks`` are paths
    (default both bundled texts)."""
    texts = read_haystacks(haystacks)
    kinds = check_kinds(kinds)
    check_lengths(texts, tokenizer, lengths, continuation_tokens)
    return [make_case(prose, tokenizer, length, depth, seed, continuation_tokens, name, kind=kind)
            for length in lengths for name, prose in texts.items() for kind in kinds
            for depth in depths for seed in seeds]
