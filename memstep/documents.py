"""Read uploaded documents (txt, md, pdf, html) into normalized text, and tokenize them.

Every problem a user can cause (missing file, wrong format, binary or empty file, a PDF
without text, a file over the size limit) raises MemstepError with a one-line fix.

Reading is bounded by work, not only by bytes (``ReadLimits``): extraction stops once the text
holds what a run can use, and a PDF's pages and decompressed content, an HTML page's tags are
capped. memstep.reading.read_document reads a file in a child process with a CPU and memory
limit, since pypdf's parsing cannot be interrupted from outside.
"""

from __future__ import annotations

import bisect
import dataclasses
import io
import logging
import re
import unicodedata
from pathlib import Path
from html.parser import HTMLParser

from memstep.cancel import checkpoint
from memstep.errors import MemstepError

SUPPORTED_EXTENSIONS = (".txt", ".md", ".pdf", ".html", ".htm")
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
_TEXT_EXTENSIONS = (".txt", ".md")
_HTML_EXTENSIONS = (".html", ".htm")
# Block-level HTML elements end a line; inline ones (b, a, span...) do not.
_HTML_BLOCKS = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
                "blockquote", "section", "article", "header", "footer", "title", "dt", "dd")
_HTML_PARAGRAPHS = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "title")
_HTML_HIDDEN = ("script", "style", "noscript", "template")
# A token of real text rarely spans more characters than this (SmolLM2: 4.5 on prose; long runs of
# spaces or '=' are the exception): the text a run of N tokens can use is at most N times this.
SAFE_CHARS_PER_TOKEN = 16


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """How much work reading one document may take. ``max_chars`` (None: no cap): extraction stops
    once the text holds this many characters; the others refuse the document, naming the limit."""
    max_chars: int | None = None
    max_pages: int = 2000                    # PDF pages read before max_chars is reached
    max_page_content_bytes: int = 1 << 20     # one page's decompressed content stream(s)
    max_content_bytes: int = 64 << 20         # all pages' decompressed content together
    max_tags: int = 100_000                   # HTML start tags read before max_chars is reached
    cpu_seconds: int = 20                     # the reading process (memstep.reading) ends there
    memory_bytes: int = 2 << 30               # its address space


def chars_for_tokens(tokens: int | None) -> int | None:
    """The characters a run of ``tokens`` tokens can use at most (None: all of them)."""
    return None if tokens is None else tokens * SAFE_CHARS_PER_TOKEN + 1024


def read_document_bytes(data: bytes, filename: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                        limits: ReadLimits | None = None) -> str:
    """Text of an uploaded file's bytes, in this process (memstep.reading.read_isolated runs it in
    a child with a CPU limit); the format comes from the file name's extension."""
    ext = check_extension(filename)
    limits = limits or ReadLimits()
    if len(data) > max_bytes:
        raise MemstepError(too_big(filename, len(data), max_bytes))
    if ext == ".pdf":
        text = _pdf_text(data, filename, limits)
    elif ext in _HTML_EXTENSIONS:
        text = _html_text(_decode_text(data, filename), filename, limits)
    else:
        text = _decode_text(_text_prefix(data, limits.max_chars), filename)
    text = normalize_text(text)
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


def _text_prefix(data: bytes, max_chars: int | None) -> bytes:
    """The bytes that can hold the first ``max_chars`` characters (4 bytes each at most), cut
    before a UTF-8 sequence the cut would split: decoding and the binary check then cost what
    the run can use, not what the file holds."""
    cut = None if max_chars is None else 4 * max_chars
    if cut is None or len(data) <= cut:
        return data
    data = data[:cut]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.reason == "unexpected end of data":
            data = data[:err.start]
    return data


def _decode_text(data: bytes, filename: str) -> str:
    """Decode text bytes: UTF-8 first (the common case), then UTF-16 without a byte order
    mark, then the legacy single-byte encodings (see _decode_legacy)."""
    binary = MemstepError(f"{filename} looks like a binary file, not text. "
                          f"Upload a text document ({', '.join(SUPPORTED_EXTENSIONS)}).")
    try:
        # NUL bytes never occur in UTF-8 text; Cyrillic UTF-16 is even valid (control-character) UTF-8
        text = _decode_utf16_without_bom(data) if b"\x00" in data else None
        text = text if text is not None else data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = _decode_utf16_without_bom(data)
        if text is None:
            if b"\x00" in data and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise binary from None  # NUL bytes without a UTF-16/32 byte order mark
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


def _pdf_text(data: bytes, filename: str, limits: ReadLimits) -> str:
    """The text of a PDF's pages, read one page at a time until the text holds ``max_chars``.
    Each page's content is decompressed and measured before pypdf parses it: parsing costs about
    10 CPU seconds per MB of content operators, and pages may share one huge stream."""
    import pypdf

    if not data.lstrip()[:5] == b"%PDF-":
        raise MemstepError(f"{filename} is not a PDF file (no %PDF header). "
                           "Check the file, or rename it to its real type.")
    pypdf_log = logging.getLogger("pypdf")
    level = pypdf_log.level
    pypdf_log.setLevel(logging.ERROR)  # we report problems ourselves; keep stderr clean
    pages, chars, content = [], 0, 0
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise MemstepError(f"{filename} is password-protected. Remove the password first.")
        for number, page in enumerate(reader.pages, start=1):
            checkpoint()
            if limits.max_chars is not None and chars >= limits.max_chars:
                break  # the run cannot use more
            if number > limits.max_pages:
                raise MemstepError(f"{filename}: over {limits.max_pages:,} pages before its text ends (the page "
                                   "limit per document): upload an excerpt or a .txt version")
            stream = page.get_contents()
            size = len(stream.get_data()) if stream is not None else 0
            if size > limits.max_page_content_bytes:
                raise MemstepError(f"{filename}: page {number}'s content decompresses to {size / 1e6:.1f} MB, over "
                                   f"the {limits.max_page_content_bytes / 1e6:.1f} MB a page may hold (the "
                                   "decompressed-content limit): convert it to .txt")
            content += size
            if content > limits.max_content_bytes:
                raise MemstepError(f"{filename}: its pages' content decompresses to over "
                                   f"{limits.max_content_bytes / 1e6:.1f} MB (the decompressed-content limit "
                                   "per document): upload an excerpt or a .txt version")
            page_text = page.extract_text() or ""
            pages.append(page_text)
            chars += len(page_text) + 2
    except MemstepError:
        raise
    except Exception as err:  # pypdf raises many types (PdfReadError, KeyError...) on bad files
        raise MemstepError(f"Cannot read the PDF {filename}: it may be corrupt ({err}). "
                           "Re-export it or convert it to .txt.") from None
    finally:
        pypdf_log.setLevel(level)
    text = "\n\n".join(pages)
    if not text.strip():
        raise MemstepError(f"{filename} has no extractable text; it may be a scanned image. "
                           "Run OCR on it or upload a .txt version.")
    return text


class _VisibleText(HTMLParser):
    """An HTML page's visible text, as its tags stream past (no tree is built, so neither
    nesting depth nor tag count costs more than one pass): scripts and styles dropped, the text
    of each string with its whitespace collapsed (except inside <pre>), a line break after each
    block element and a blank line after each paragraph."""

    def __init__(self, max_tags: int):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.chars = self.tags = self.hidden = self.pre = 0
        self.max_tags = max_tags
        self._pending: list[str] = []  # one string's pieces (a feed may split it)

    def _flush(self) -> None:
        if self._pending:
            piece = "".join(self._pending)
            self._pending = []
            self._add(piece if self.pre else re.sub(r"\s+", " ", piece))

    def _add(self, piece: str) -> None:
        self.parts.append(piece)
        self.chars += len(piece)

    def _count_tag(self) -> None:
        self._flush()
        self.tags += 1
        if self.tags > self.max_tags:
            raise _TooManyTags

    def handle_starttag(self, tag, attrs):
        self._count_tag()
        if tag in _HTML_HIDDEN:
            self.hidden += 1  # (script and style: the parser reads their raw text up to the end tag)
        elif tag == "pre":
            self.pre += 1
        elif tag == "br":  # a void element: its line break comes now
            self._add("\n")

    def handle_startendtag(self, tag, attrs):
        self._count_tag()
        if tag in _HTML_BLOCKS:
            self._add("\n\n" if tag in _HTML_PARAGRAPHS else "\n")

    def handle_endtag(self, tag):
        if tag in _HTML_HIDDEN:
            self._pending = []
            self.hidden = max(0, self.hidden - 1)
            return
        self._flush()
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in _HTML_BLOCKS and tag != "br":
            self._add("\n\n" if tag in _HTML_PARAGRAPHS else "\n")

    def handle_data(self, data):
        if not self.hidden:
            self._pending.append(data)

    def text(self) -> str:
        self._flush()
        return "".join(self.parts)


class _TooManyTags(Exception):
    pass


_HTML_FEED_CHARS = 1 << 16


def _html_text(html: str, filename: str = "page.html", limits: ReadLimits | None = None) -> str:
    """Visible text of an HTML page (see _VisibleText), read a piece at a time until the text
    holds ``max_chars``; refused past ``max_tags`` start tags."""
    limits = limits or ReadLimits()
    parser = _VisibleText(limits.max_tags)
    try:
        for start in range(0, len(html), _HTML_FEED_CHARS):
            checkpoint()
            parser.feed(html[start:start + _HTML_FEED_CHARS])
            if limits.max_chars is not None and parser.chars >= limits.max_chars:
                break  # the run cannot use more
        else:
            parser.close()
    except _TooManyTags:
        raise MemstepError(f"{filename}: over {limits.max_tags:,} HTML tags before its text ends (the tag limit "
                           "per document): upload an excerpt or a .txt version") from None
    return "\n".join(line.strip() for line in parser.text().splitlines())
