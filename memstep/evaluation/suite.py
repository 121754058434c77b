"""The evaluation suite: passkey documents generated from bundled public-domain prose.

One case = one haystack (length x depth x seed) with its question, the passkey's token
span (for retention) and a held-out continuation: the prose that follows the haystack in
the source, scored as a continuation of the compressed memory. Every case carries token
ids, so memstep and a peer in another virtualenv see exactly the same tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from memstep.errors import MemstepError
from memstep.generate import prompt_parts
from memstep.passkey import make_haystack, random_passkey, random_thing

ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"
DEFAULT_HAYSTACK = ASSETS / "pride_and_prejudice_ch1-12.txt"


@dataclass
class Case:
    """One passkey document, with everything a worker needs to run it."""

    length: int  # requested haystack length in tokens
    depth: float
    seed: int
    passkey: str
    question: str
    document_ids: list[int]  # the haystack with the needle, no prompt framing
    continuation_ids: list[int]  # held-out prose right after the haystack
    head_ids: list[int]  # chat-template tokens before the document
    question_ids: list[int]  # chat-template tokens after the document, question included
    needle_tokens: tuple[int, int]  # the needle sentence, document token span
    passkey_tokens: tuple[int, int]  # the passkey's digits, document token span

    @property
    def cell(self) -> dict:
        return {"length": self.length, "depth": self.depth, "seed": self.seed}

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


def make_case(prose: str, tokenizer, length: int, depth: float, seed: int,
              continuation_tokens: int = 32) -> Case:
    passkey = random_passkey(f"{length}-{depth}-{seed}")
    doc = make_haystack(prose, tokenizer, length, depth, passkey, thing=random_thing(seed))
    parts = prompt_parts(tokenizer, doc.question)
    return Case(
        length=length, depth=depth, seed=seed, passkey=doc.answer, question=doc.question,
        document_ids=tokenizer(doc.text, add_special_tokens=False)["input_ids"],
        continuation_ids=_continuation(doc, prose, tokenizer, continuation_tokens),
        head_ids=prompt_parts(tokenizer).head, question_ids=parts.tail,
        needle_tokens=(doc.needle_token_start, doc.needle_token_end),
        passkey_tokens=_passkey_span(doc, tokenizer))


def make_cases(tokenizer, lengths, depths, seeds, haystack: str | Path | None = None,
               continuation_tokens: int = 32) -> list[Case]:
    path = Path(haystack) if haystack else DEFAULT_HAYSTACK
    if not path.is_file():
        raise MemstepError(f"haystack text not found: {path}")
    prose = path.read_text(encoding="utf-8")
    return [make_case(prose, tokenizer, length, depth, seed, continuation_tokens)
            for length in lengths for depth in depths for seed in seeds]
