"""Read uploaded documents (txt, md, pdf, html) into normalized text, and tokenize them.

Every problem a user can cause (missing file, wrong format, binary or empty file, a PDF
without text, a file over the size limit) raises MemstepError with a one-line fix.

Reading is bounded by work, not only by bytes (``ReadLimits``, memstep.read_budget): extraction
stops once the text holds what a run can use, and the parsers' work (memstep.pdf_text,
memstep.html_text) follows the text they yield. memstep.reading.read_document reads a file in a
child process with a CPU and memory limit, since pypdf's parsing cannot be interrupted from outside.
"""

from __future__ import annotations

import bisect
import codecs
import re
import unicodedata
from pathlib import Path

from memstep.errors import MemstepError
from memstep.read_budget import OverBudget, ReadLimits, Watchdog, WorkBudget, refusal  # noqa: F401 (ReadLimits: here as before)

SUPPORTED_EXTENSIONS = (".txt", ".md", ".pdf", ".html", ".htm")
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
_TEXT_EXTENSIONS = (".txt", ".md")
_HTML_EXTENSIONS = (".html", ".htm")
# A token of real text rarely spans more characters than this (SmolLM2: 4.5 on prose; long runs of
# spaces or '=' are the exception): the text a run of N tokens can use is at most N times this.
SAFE_CHARS_PER_TOKEN = 16


def _budget(filename: str, limits: ReadLimits, watchdog: Watchdog | None, what: str) -> WorkBudget:
    budget = WorkBudget(filename, limits, what)
    if watchdog is not None:
        watchdog.budget = budget
    return budget


def chars_for_tokens(tokens: int | None) -> int | None:
    """The characters a run of ``tokens`` tokens can use at most (None: all of them)."""
    return None if tokens is None else tokens * SAFE_CHARS_PER_TOKEN + 1024


def read_document_bytes(data: bytes, filename: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                        limits: ReadLimits | None = None, watchdog: Watchdog | None = None) -> str:
    """Text of an uploaded file's bytes, in this process (memstep.reading.read_isolated runs it in
    a child with a CPU limit); the format comes from the file name's extension. Its work follows
    the text it yields (memstep.read_budget); ``watchdog`` (the reading process's) watches its CPU."""
    ext = check_extension(filename)
    limits = limits or ReadLimits()
    if len(data) > max_bytes:
        raise MemstepError(too_big(filename, len(data), max_bytes))
    try:
        if ext == ".pdf":
            from memstep.pdf_text import pdf_text

            budget = _budget(filename, limits, watchdog, "parsing steps (content-stream operators and operands, "
                                                          "XObject draws and their bytes)")
            text = pdf_text(data, filename, limits, budget)
        elif ext in _HTML_EXTENSIONS:
            from memstep.html_text import WHAT, html_text

            budget = _budget(filename, limits, watchdog, WHAT)
            text = html_text(_decode_text(data, filename), filename, limits, budget)
        else:
            budget = _budget(filename, limits, watchdog, "steps")
            text = _decode_text(_text_prefix(data, limits.max_chars), filename)
            budget.add_text(len(text))
        text = normalize_text(text)
    except OverBudget as err:
        raise refusal(err) from None
    except KeyboardInterrupt:
        if watchdog is not None and watchdog.fired:  # the reading process's CPU watch interrupted it
            raise MemstepError(watchdog.fired) from None
        raise
    if not text.strip():
        raise MemstepError(f"{filename} contains no text. Pick a document with some text in it.")
    return text


def normalize_text(text: str) -> str:
    """NFKC (ligatures such as "ﬁ" become "fi"), "\\n" newlines, no trailing spaces,
    at most two blank lines in a row, no blank lines at the start or end."""
    text = unicodedata.normalize("NFKC", text).replace("\ufeff", "")
    lines = [line.rstrip() for line in text.splitlines()]  # splitlines knows \r\n, \r, \f...
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{4,}", "\n\n\n", text)


def tokenize_document(text: str, tokenizer, max_tokens: int | None) -> tuple[list[int], str | None]:
    """Token ids (no special tokens) cut to `max_tokens`, and a notice when it cut. Only as
    much text is tokenized as the limit can need (a 19 MB text is never tokenized whole)."""
    if max_tokens is not None and max_tokens < 1:
        raise MemstepError(f"max_tokens must be at least 1 (got {max_tokens}).")
    ids, cut = tokenize_prefix(text, tokenizer, max_tokens)
    if not ids:
        raise MemstepError("The document has no tokens. Pick a document with some text in it.")
    return ids, truncation_notice(text, tokenizer, ids, "--max-tokens") if cut else None


# A token rarely spans more characters than this; the first guess at the text a limit needs.
CHARS_PER_TOKEN_GUESS = 8
_BOUNDARY_TOKENS = 16  # tokens near a cut in the middle of a word may differ from the whole text's
# Long texts are tokenized a piece at a time: one call on a whole novel (680k characters) peaks
# ~90 MB above what it returns and leaves ~24 MB of the C heap pinned; 64k-character pieces
# leave ~10 MB, mostly the ids themselves. Each piece restarts at a token that began in the last _OVERLAP_CHARS of the
# one before, and must reproduce that piece's tokens from there (else: one call, as before).
PIECE_CHARS = 1 << 16
_OVERLAP_CHARS = 512


def tokenize_prefix(text: str, tokenizer, limit: int | None) -> tuple[list[int], bool]:
    """The first ``limit`` token ids of ``text`` (all of them when None) and whether there were
    more. Only as much text is tokenized as the limit needs: the tokens before a prefix's last
    few are those of the whole text."""
    def encode(piece: str, **kwargs) -> dict:
        # verbose=False: no warning about exceeding the model's length; the caller decides that.
        return tokenizer(piece, add_special_tokens=False, verbose=False, **kwargs)

    needed = len(text) if limit is None else limit * CHARS_PER_TOKEN_GUESS + 256
    if needed > PIECE_CHARS and len(text) > PIECE_CHARS and getattr(tokenizer, "is_fast", False):
        ids = _piecewise(text, encode, limit)
        if ids is not None:
            return (ids, False) if limit is None else (ids[:limit], len(ids) > limit)
    return _grown_prefix(text, lambda piece: list(encode(piece)["input_ids"]), limit)


def _grown_prefix(text: str, encode, limit: int | None) -> tuple[list[int], bool]:
    """One call on a prefix of the text, grown 4x until it holds enough tokens."""
    if limit is None:
        return encode(text), False
    chars = limit * CHARS_PER_TOKEN_GUESS + 256
    while True:
        ids = encode(text[:chars])
        if chars >= len(text):
            return ids[:limit], len(ids) > limit
        if len(ids) > limit + _BOUNDARY_TOKENS:
            return ids[:limit], True
        chars *= 4


def _piecewise(text: str, encode, limit: int | None) -> list[int] | None:
    """The text's tokens (at least ``limit`` + 1 of them, or all), a piece at a time; None when
    a piece does not restart where the one before left off (then the caller tokenizes at once)."""
    ids: list[int] = []
    start, expected = 0, []  # expected: the previous piece's tokens from the restart on
    while True:
        end = start + PIECE_CHARS
        if end >= len(text):
            rest = list(encode(text[start:])["input_ids"])
            return ids + rest if rest[:len(expected)] == expected else None
        piece = encode(text[start:end], return_offsets_mapping=True)
        got, offsets = list(piece["input_ids"]), piece["offset_mapping"]
        if got[:len(expected)] != expected:
            return None
        restart = bisect.bisect_left([a for a, _ in offsets], PIECE_CHARS - _OVERLAP_CHARS)
        if restart <= len(expected) or len(got) - restart <= 2 * _BOUNDARY_TOKENS:
            return None  # a token longer than the overlap (a run of spaces): no place to restart
        ids += got[:restart]
        if limit is not None and len(ids) > limit:
            return ids
        expected = got[restart:len(got) - _BOUNDARY_TOKENS]
        start += offsets[restart][0]


def truncation_notice(text: str, tokenizer, ids: list[int], reason: str) -> str:
    """What a cut kept: its tokens and the share of the text they cover."""
    kept = len(tokenizer.decode(ids))
    return (f"Document truncated to {len(ids):,} tokens ({reason}): about the first {kept:,} of its "
            f"{len(text):,} characters.")


def check_extension(filename: str) -> str:
    ext = Path(filename).suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise MemstepError(f"Unsupported file type {ext or '(none)'!r} for {filename}. "
                           f"Use one of: {', '.join(SUPPORTED_EXTENSIONS)}.")
    return ext


def too_big(filename: str, size: int, max_bytes: int) -> str:
    return (f"{filename} is {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB limit. "
            "Use a shorter excerpt of it.")


# Byte order marks, longest first (UTF-32's little-endian mark begins with UTF-16's)
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _bom(data: bytes) -> tuple[int, str] | None:
    """(length, codec) of the byte order mark ``data`` starts with."""
    for mark, codec in _BOMS:
        if data.startswith(mark):
            return len(mark), codec
    return None


def _text_prefix(data: bytes, max_chars: int | None) -> bytes:
    """The bytes that can hold the first ``max_chars`` characters (a byte order mark, then 4 bytes
    each at most), cut before a character the cut would split (UTF-8, UTF-16 and UTF-32 alike):
    decoding and the binary check then cost what the run can use, not what the file holds."""
    mark = _bom(data)
    cut = None if max_chars is None else (mark[0] if mark else 0) + 4 * max_chars
    if cut is None or len(data) <= cut:
        return data
    data = data[:cut]
    codec = mark[1] if mark else "utf-8"
    if codec == "utf-16":
        high = data[-2] if data.startswith(codecs.BOM_UTF16_BE) else data[-1]  # the last unit's high byte
        if 0xD8 <= high <= 0xDB:
            data = data[:-2]  # the first half of a surrogate pair
    elif codec in ("utf-8", "utf-8-sig"):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            if err.reason == "unexpected end of data":
                data = data[:err.start]
    return data


def _decode_text(data: bytes, filename: str) -> str:
    """Decode text bytes: by their byte order mark (UTF-8, UTF-16, UTF-32) when they start with
    one, else UTF-8 first (the common case), then UTF-16 without a byte order mark, then the
    legacy single-byte encodings (see _decode_legacy)."""
    binary = MemstepError(f"{filename} looks like a binary file, not text. "
                          f"Upload a text document ({', '.join(SUPPORTED_EXTENSIONS)}).")
    mark = _bom(data)
    if mark is not None:
        try:
            text = data.decode(mark[1])
        except UnicodeDecodeError:
            raise binary from None
        if looks_binary(text):
            raise binary
        return text
    try:
        # NUL bytes never occur in UTF-8 text; Cyrillic UTF-16 is even valid (control-character) UTF-8
        text = _decode_utf16_without_bom(data) if b"\x00" in data else None
        text = text if text is not None else data.decode("utf-8")
    except UnicodeDecodeError:
        text = _decode_utf16_without_bom(data)
        if text is None:
            if b"\x00" in data:
                raise binary from None  # NUL bytes without a byte order mark, and not UTF-16
            text = _decode_legacy(data)
            if text is None:
                raise binary from None
    if looks_binary(text):
        raise binary
    return text


BINARY_CONTROL_SHARE = 0.05  # text with more control characters than this is taken for binary


def looks_binary(text: str) -> bool:
    """A decodable file can still be binary: NUL characters or mostly control characters."""
    control = sum(1 for ch in text if not ch.isprintable() and ch not in "\n\r\t\f\v")
    return "\x00" in text or control > BINARY_CONTROL_SHARE * max(len(text), 1)


def _decode_utf16_without_bom(data: bytes) -> str | None:
    """UTF-16 text saved without a byte order mark: the high byte of each character (the odd
    bytes for little-endian, the even ones for big-endian) is NUL for Latin text and takes
    only a few values for one script (0x04 and NUL for Russian), unlike binary data."""
    if len(data) < 4 or len(data) % 2:
        return None
    half = len(data) // 2
    for encoding, high in (("utf-16-le", data[1::2]), ("utf-16-be", data[0::2])):
        if high.count(0) > 0.3 * half or (0 in high and len(set(high)) <= 3):
            try:
                text = data.decode(encoding)
            except UnicodeDecodeError:
                continue
            if not looks_binary(text):
                return text
    return None


# Single-byte encodings of Latin-script text, in order of preference on a tie: cp1252 (a
# superset of Latin-1 for text) is by far the most common legacy encoding.
_LATIN_ENCODINGS = ("cp1252", "iso8859_15", "cp1250", "cp1257", "cp1254", "mac_roman")
_PUNCTUATION = set("“”‘’„‚–—…«»‹›°·•§¶€£¥©®™ª º¿¡×÷±½¼¾")


def _latin_score(text: str) -> int:
    """How plausible a decoding of Latin-script text is: non-ASCII letters inside words and
    typographic punctuation count for it; symbols inside words, controls and marks against."""
    score = 0
    for i, ch in enumerate(text):
        if ch < "\x80":
            continue
        near = text[i - 1:i] + text[i + 1:i + 2]
        if ch.isalpha():
            score += 1 if any(c.isalpha() for c in near) else -1
        elif ch in _PUNCTUATION:
            score += 1
        elif unicodedata.category(ch)[0] in "CM":
            score -= 3
        else:
            score -= 1
    return score


def _decode_legacy(data: bytes) -> str | None:
    """Non-UTF-8 text: charset-normalizer's guess where it finds a non-Latin script (Cyrillic,
    Greek, CJK, ...); for Latin-script text its guesses often tie between near-identical code
    pages (German came out as Turkish or Mac Roman), so the Latin code page whose decoding
    reads most like words wins, cp1252 on a tie."""
    import charset_normalizer

    best = charset_normalizer.from_bytes(data).best()
    if best is not None and not _is_latin(str(best)):
        return str(best)
    decoded = []
    for encoding in _LATIN_ENCODINGS:
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        decoded.append((_latin_score(text), -len(decoded), text))
    if decoded:
        return max(decoded)[2]
    return str(best) if best is not None else None


def _is_latin(text: str) -> bool:
    """Most non-ASCII letters of ``text`` are Latin letters (é, ß, ł...), not Cyrillic, Greek, CJK."""
    letters = [ch for ch in text if ch >= "\x80" and ch.isalpha()]
    latin = sum(1 for ch in letters if unicodedata.name(ch, "").startswith("LATIN"))
    return latin * 2 >= len(letters)
