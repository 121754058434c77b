"""Documents the app runs on: bundled examples, uploads, and their tokens' character spans.

A ``DocumentSource`` is plain text plus what the app knows about it: a suggested question
and, for passkey documents, where the needle sentence sits (found by its fixed phrasing,
so an uploaded passkey document is marked too).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memstep.documents import _BOUNDARY_TOKENS as BOUNDARY_TOKENS  # the margin tokenize_prefix keeps
from memstep.documents import CHARS_PER_TOKEN_GUESS, SUPPORTED_EXTENSIONS, ReadLimits, chars_for_tokens
from memstep.errors import MemstepError
from memstep.passkey import make_haystack, question_for, random_passkey, random_thing
from ui import uploads
from ui.truths import EXAMPLE_TRUTHS, TrueAnswer, passkey_truth

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MAX_UPLOAD_BYTES = uploads.MAX_UPLOAD_BYTES  # (reads and upload files: ui/uploads.py)
# A session's document (the Run tab's state, up to what MAX_DOCUMENT_TOKENS can use) is dropped this
# long after it was last set (ui/uploads.py: uploads never read go then too).
DOCUMENT_STATE_SECONDS = uploads.DOCUMENT_STATE_SECONDS
PRIDE = ASSETS / "pride_and_prejudice_ch1-12.txt"
PERSUASION = ASSETS / "persuasion_excerpt.txt"
NOVEL = ASSETS / "pride_and_prejudice.txt"  # the whole novel: 155,850 SmolLM2 tokens
# memstep.passkey.needle_sentence's phrasing: "The magic number for the vault is 73915."
_NEEDLE = re.compile(r"The magic number for the ([A-Za-z][A-Za-z '-]*?) is (\d+)\.")


@dataclass(frozen=True)
class DocumentSource:
    name: str
    text: str
    question: str = ""
    passkey: str | None = None
    needle_chars: tuple[int, int] | None = None  # [start, end) of the needle sentence in text
    bundled: bool = False  # one of the app's examples (its full-cache answer is cached)
    example: str | None = None  # the example's name in the page's menu (bundled ones)
    truth: TrueAnswer | None = None  # the known answer to the question (examples, passkey documents)

    @functools.cached_property
    def doc_id(self) -> str:
        """The document's identity: a digest of its name and text (a run carries it; the page shows it)."""
        digest = hashlib.blake2b(digest_size=4)
        digest.update(self.name.encode("utf-8", "surrogatepass") + b"\0" + self.text.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()


def with_needle(name: str, text: str, question: str = "") -> DocumentSource:
    """A source for ``text``; when it holds a passkey sentence, its span and passkey are
    recorded and the matching question is suggested."""
    match = _NEEDLE.search(text)
    if match is None:
        return DocumentSource(name, text, question)
    return DocumentSource(name, text, question or question_for(match.group(1)), match.group(2),
                          (match.start(), match.end()), truth=passkey_truth(match.group(2), match.group(0)))


UPLOAD_REFUSED = ("the document file must be uploaded through the page or with gradio_client's handle_file "
                  "(.txt, .md, .pdf or .html)")


def upload_folders() -> list[Path]:
    """Where Gradio keeps uploads (GRADIO_TEMP_DIR or <tmp>/gradio); the bundled examples too."""
    from gradio.utils import get_upload_folder

    return [Path(get_upload_folder()).resolve(), ASSETS.resolve()]


def uploaded_path(file) -> Path:
    """The path of an uploaded file, accepted only inside Gradio's upload folder (or the bundled
    examples): a request naming any other server file gets one generic message, the same
    whether the file exists or not."""
    path = file.get("path") if isinstance(file, dict) else getattr(file, "path", file)
    if not isinstance(path, (str, Path)) or not str(path) or len(str(path)) > 4096 or "\0" in str(path):
        raise MemstepError(UPLOAD_REFUSED)
    try:
        resolved = Path(path).resolve()  # symlinks and ".." resolved before the containment check
    except (OSError, RuntimeError, ValueError):
        raise MemstepError(UPLOAD_REFUSED) from None
    if not any(resolved != folder and resolved.is_relative_to(folder) for folder in upload_folders()):
        raise MemstepError(UPLOAD_REFUSED)
    if not resolved.is_file():
        raise MemstepError(UPLOAD_REFUSED)
    return resolved


def upload_limits() -> ReadLimits:
    """What reading one upload may cost: text up to what the longest run can use (the app's
    MAX_DOCUMENT_TOKENS), and the work memstep.read_budget allows it for that text (the same
    limits as the command line's: a document is refused at the same place in both)."""
    return ReadLimits(max_chars=chars_for_tokens(MAX_DOCUMENT_TOKENS), cpu_seconds=READ_CPU_SECONDS)


# CPU seconds any upload's read may take, whatever text it yields (memstep.read_budget.ReadLimits)
READ_CPU_SECONDS = float(os.environ.get("MEMSTEP_READ_CPU_SECONDS", str(ReadLimits.cpu_seconds)))
# A run with compact positions never puts a key past sinks + M + c, so the model's context does not
# cut its document: a whole novel (Pride and Prejudice: 156k tokens) fits under this, and the step
# cap (ui.runs.MAX_RUN_STEPS) bounds the work at a given chunk.
MAX_DOCUMENT_TOKENS = int(os.environ.get("MEMSTEP_MAX_DOCUMENT_TOKENS", str(1 << 18)))


def visitor_gone() -> bool:
    """Whether the request this thread serves was given up: its page closed, its client gone or
    its event cancelled (Gradio marks the event not alive; the worker thread keeps running)."""
    try:
        from gradio.context import LocalContext

        blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
        queue = getattr(blocks, "_queue", None)
        if queue is None or event_id is None:
            return False
        for job in list(queue.active_jobs):
            for event in list(job or []):
                if event._id == event_id:
                    return not event.alive
    except Exception:  # noqa: BLE001 - Gradio's internals moved: reading then ends at its limits only
        return False
    return False


def read_upload(path: str | Path, max_bytes: int = MAX_UPLOAD_BYTES) -> DocumentSource:
    """An uploaded file (checked on the server: type, size, empty or binary content), read in a
    child process under upload_limits(), one at a time per visitor (ui/uploads.py); a visitor who
    leaves ends the reading (visitor_gone). The file is deleted once read: its text is the state."""
    path = Path(path)
    if path.suffix.lower() not in SUPPORTED_EXTENSIONS:
        raise MemstepError(f"Unsupported file type {path.suffix or '(none)'!r} for {path.name}. "
                           f"Use one of: {', '.join(SUPPORTED_EXTENSIONS)}.")
    size = path.stat().st_size
    if size > max_bytes:  # checked before reading, like memstep.documents.read_document
        uploads.discard(path, upload_folders()[0])
        raise MemstepError(f"{path.name} is {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB "
                           "upload limit. Use a shorter excerpt of it.")
    # Reading a 20 MB upload (decoding, normalizing, checking for binary content) takes seconds of
    # CPU and a few copies of the text: only a few at a time, one per visitor, the others told to retry.
    try:
        with uploads.reading_slot():
            from memstep.reading import read_isolated

            text = read_isolated(path.read_bytes(), path.name, max_bytes=max_bytes, limits=upload_limits(),
                                 should_stop=visitor_gone)
    finally:  # read or refused, the file has served: a new try is a new upload
        uploads.discard(path, upload_folders()[0])
    return with_needle(path.name, text)


def _chapters(path: Path, first: int, last: int) -> str:
    """Chapters ``first``..``last`` of a bundled novel (its chapters start with "Chapter N")."""
    text = path.read_text(encoding="utf-8")
    starts = [m.start() for m in re.finditer(r"^Chapter \d+$", text, re.M)] + [len(text)]
    return text[starts[first - 1]:starts[last]].strip()


def _passkey_example(name: str, path: Path, tokens: int, depth: float, seed: int, tokenizer) -> DocumentSource:
    haystack = path.read_text(encoding="utf-8")
    doc = make_haystack(haystack, tokenizer, tokens, depth, random_passkey(seed), thing=random_thing(seed))
    return DocumentSource(name, doc.text, doc.question, doc.answer,
                          (doc.needle_char_start, doc.needle_char_end),
                          truth=passkey_truth(doc.answer, doc.text[doc.needle_char_start:doc.needle_char_end]))


WHOLE_BOOK_EXAMPLE = "Pride and Prejudice, the whole novel (156k tokens)"
# name -> (builder(tokenizer) -> DocumentSource, one-line description). Built lazily.
EXAMPLES = {
    "Passkey in Pride and Prejudice (4k tokens)": (
        lambda tok: _passkey_example("Passkey in Pride and Prejudice", PRIDE, 4000, 0.4, 3, tok),
        "A 5-digit passkey hidden at 40% depth in Austen's prose; does it survive the memory cuts?"),
    "Passkey in Persuasion (1.5k tokens)": (
        lambda tok: _passkey_example("Passkey in Persuasion", PERSUASION, 1500, 0.7, 11, tok),
        "A short passkey document: quick to run on a CPU."),
    "Pride and Prejudice, chapters 1-2 (2.3k tokens)": (
        lambda tok: DocumentSource("Pride and Prejudice ch. 1-2", _chapters(PRIDE, 1, 2),
                                   "Who has taken Netherfield Park?"),
        "The Bennets hear that Netherfield Park is let at last."),
    "Persuasion, chapter 1 (3.4k tokens)": (
        lambda tok: DocumentSource("Persuasion ch. 1", _chapters(PERSUASION, 1, 1),
                                   "Which book does Sir Walter Elliot like to read?"),
        "Sir Walter Elliot, of Kellynch Hall, and his favourite book."),
    "Pride and Prejudice, chapters 1-12 (23k tokens)": (
        lambda tok: DocumentSource("Pride and Prejudice ch. 1-12", PRIDE.read_text(encoding="utf-8").strip(),
                                   "Who is Mr. Darcy's friend?"),
        "A long document: cut to the max tokens setting (with a notice) unless you raise it."),
    WHOLE_BOOK_EXAMPLE: (
        lambda tok: DocumentSource("Pride and Prejudice (the whole novel)", NOVEL.read_text(encoding="utf-8").strip(),
                                   "Whom does Elizabeth Bennet marry?"),
        "The whole novel at the paper's lengths: chunk and memory 1,024 (153 steps), compact positions."),
}
# Settings an example sets when picked (the whole novel needs chunks that keep the steps under the cap,
# and no max tokens: compact positions let it run past the model's context).
EXAMPLE_SETTINGS = {WHOLE_BOOK_EXAMPLE: {"chunk": 1024, "memory": 1024, "max_tokens": None, "rope": "compact"}}
# The short passkey document: a first run takes seconds, not minutes, on a CPU.
DEFAULT_EXAMPLE = "Passkey in Persuasion (1.5k tokens)"
TOKENIZER_FREE_EXAMPLE = "Pride and Prejudice, chapters 1-2 (2.3k tokens)"  # built without a tokenizer


@functools.lru_cache(maxsize=None)
def example(name: str, tokenizer) -> DocumentSource:
    """A bundled example, built on first use (the passkey ones need the tokenizer)."""
    if name not in EXAMPLES:
        raise MemstepError(f"unknown example '{name}': choose one of {', '.join(EXAMPLES)}")
    source = EXAMPLES[name][0](tokenizer)
    return dataclasses.replace(source, bundled=True, example=name, truth=source.truth or EXAMPLE_TRUTHS[name])


def token_spans(text: str, tokenizer, ids: list[int]) -> np.ndarray:
    """Character [start, end) of each of ``ids`` (the tokens of a prefix of ``text``), as an
    (n, 2) integer array (a whole novel's 156k spans: 2.5 MB, not 156k Python tuples). Like
    memstep.documents.tokenize_prefix, only a prefix of the text is tokenized, grown 4x until
    its tokens cover ``ids`` and a margin: a 14 MB text cut to 16 tokens costs what its first
    few hundred characters cost, never offsets for the whole text."""
    return np.asarray(_token_spans(text, tokenizer, ids), dtype=np.int64).reshape(-1, 2)


def _token_spans(text: str, tokenizer, ids: list[int]):
    if getattr(tokenizer, "is_fast", False):
        chars = len(ids) * CHARS_PER_TOKEN_GUESS + 256
        while True:
            encoding = tokenizer(text[:chars], add_special_tokens=False, verbose=False, return_offsets_mapping=True)
            if chars >= len(text) or len(encoding["input_ids"]) > len(ids) + BOUNDARY_TOKENS:
                break
            chars *= 4
        if encoding["input_ids"][: len(ids)] == list(ids):
            return encoding["offset_mapping"][: len(ids)]
    # Slow tokenizers: find each token's text in order (spaces and unknown bytes may be skipped),
    # looking a short way ahead only.
    spans, cursor = [], 0
    for token in ids:
        piece = tokenizer.decode([token]).strip()
        at = text.find(piece, cursor, cursor + 64 + len(piece)) if piece else -1
        if at < 0:
            spans.append((cursor, cursor))
            continue
        spans.append((at, at + len(piece)))
        cursor = at + len(piece)
    return spans


def needle_tokens(spans, needle_chars: tuple[int, int] | None) -> tuple[int, int] | None:
    """Document token [start, end) overlapping the needle's characters; None when the
    needle is absent or was cut off by truncation."""
    if needle_chars is None or len(spans) == 0 or spans[-1][1] < needle_chars[1]:
        return None
    from ui.outcome import token_range

    return token_range(spans, needle_chars)


def describe(source: DocumentSource, tokens: int | None = None, exact: bool = True) -> str:
    """A one-line Markdown description of a document."""
    size = f"{'' if exact else '≈'}{tokens:,} tokens" if tokens is not None else f"{len(source.text):,} characters"
    needle = (f" · passkey **{source.passkey}** hidden at {source.needle_chars[0] / max(len(source.text), 1):.0%} "
              "of the text") if source.needle_chars else ""
    return f"**{source.name}** · {size}{needle}"
