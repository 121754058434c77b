"""memstep.documents: every format reads back its text; every user error is a MemstepError."""

from __future__ import annotations

import io

import pytest

from memstep.documents import SUPPORTED_EXTENSIONS, normalize_text, read_document_bytes, tokenize_document
from memstep.errors import MemstepError
from memstep.reading import read_document

try:
    from fixtures_documents import ASSETS, tokenizer  # noqa: F401 (a pytest fixture)
except ImportError:  # tests/ imported as a package
    from tests.fixtures_documents import ASSETS, tokenizer  # noqa: F401


def make_pdf(lines: list[str]) -> bytes:
    """A one-page PDF whose page shows `lines` in Helvetica (no lines: a page with no text,
    like a scanned image)."""
    text_ops = "".join(f"({line}) Tj 0 -16 Td " for line in lines)
    content = f"BT /F1 12 Tf 72 720 Td {text_ops}ET" if lines else "0 0 100 100 re f"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        "/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += (f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\n"
            f"startxref\n{xref}\n%%EOF\n").encode()
    return out


# ---- formats ---------------------------------------------------------------------------

def test_txt_and_md_round_trip(tmp_path):
    for name in ("notes.txt", "README.md", "UPPER.TXT"):
        path = tmp_path / name
        path.write_text("# Title\n\nSome *text* here.\n", encoding="utf-8")
        assert read_document(path) == "# Title\n\nSome *text* here."
        assert read_document(str(path)) == "# Title\n\nSome *text* here."


def test_pdf_text_is_extracted(tmp_path):
    path = tmp_path / "paper.pdf"
    path.write_bytes(make_pdf(["Hello from a PDF.", "Second line of it."]))
    text = read_document(path)
    assert "Hello from a PDF." in text and "Second line of it." in text


def test_html_keeps_visible_text_only():
    html = """<!DOCTYPE html><html><head><title>Page title</title>
    <style>p { color: red; }</style><script>var secret = "script text";</script></head>
    <body><!-- a comment --><h1>Heading</h1><p>First
    paragraph with <b>bold</b> words &amp; an entity.</p><p>Second paragraph.</p>
    <noscript>enable js</noscript></body></html>"""
    for name in ("page.html", "page.htm"):
        text = read_document_bytes(html.encode("utf-8"), name)
        assert "First paragraph with bold words & an entity." in text
        assert "Heading" in text and "Second paragraph." in text
        for hidden in ("color: red", "script text", "a comment", "enable js"):
            assert hidden not in text
        assert "First paragraph" in text.split("\n\n")[2]  # paragraphs stay separate


def test_supported_extensions():
    assert SUPPORTED_EXTENSIONS == (".txt", ".md", ".pdf", ".html", ".htm")


def test_bundled_assets_read_cleanly():
    for path in sorted(ASSETS.glob("*.txt")):
        text = read_document(path)
        assert len(text) > 30_000
        assert text.splitlines()[0].startswith(("Pride and Prejudice", "Persuasion"))


# ---- normalization and encodings -------------------------------------------------------

def test_nfkc_newlines_and_blank_lines():
    raw = "\ufeffThe \ufb01rst of\ufb02ow.  \r\nline two\t\rline three\n\n\n\n\n\nend\n\n"
    assert read_document_bytes(raw.encode("utf-8"), "a.txt") == (
        "The first offlow.\nline two\nline three\n\n\nend")
    assert normalize_text("a\n\n\nb") == "a\n\n\nb"  # two blank lines are kept


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252", "utf-16", "utf-8-sig"])
def test_encodings_are_detected(encoding):
    text = ("Café crème brûlée, naïve façade. Über große Straßen zu gehen ist schön.\n"
            "Les élèves étaient très fâchés.")
    assert read_document_bytes(text.encode(encoding), "a.txt") == text


def test_stdin_dash_reads_bytes_or_text():
    assert read_document("-", stdin=io.BytesIO("Piped \ufb01le.\n".encode())) == "Piped file."
    assert read_document("-", stdin=io.StringIO("Piped text.")) == "Piped text."
    with pytest.raises(MemstepError, match="no text"):
        read_document("-", stdin=io.BytesIO(b"  \n"))


# ---- tokenization ----------------------------------------------------------------------

def test_tokenize_truncates_with_notice(tokenizer):
    text = "The quick brown fox jumps over the lazy dog. " * 300
    ids, notice = tokenize_document(text, tokenizer, None)
    assert notice is None and len(ids) > 1000
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]  # no BOS/EOS
    cut, notice = tokenize_document(text, tokenizer, 1000)
    assert cut == ids[:1000]
    assert notice.startswith("Document truncated to 1,000 tokens (--max-tokens): about the first ")
    same, notice = tokenize_document(text, tokenizer, len(ids))
    assert same == ids and notice is None


def test_tokenize_errors(tokenizer):
    with pytest.raises(MemstepError, match="at least 1"):
        tokenize_document("Some text.", tokenizer, 0)
    with pytest.raises(MemstepError, match="no tokens"):
        tokenize_document("", tokenizer, 10)


# ---- errors a user can cause -----------------------------------------------------------

def check_error(call, *words):
    with pytest.raises(MemstepError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_missing_file_and_directory(tmp_path):
    check_error(lambda: read_document(tmp_path / "nope.txt"), "not found", "nope.txt")
    check_error(lambda: read_document(tmp_path), "not a file")


def test_unsupported_extension_lists_supported(tmp_path):
    path = tmp_path / "sheet.docx"
    path.write_bytes(b"PK\x03\x04")
    check_error(lambda: read_document(path), "'.docx'", ".txt, .md, .pdf, .html, .htm")
    check_error(lambda: read_document_bytes(b"text", "noext"), "(none)")


def test_empty_and_whitespace_documents(tmp_path):
    for content in (b"", b"   \n\t\n  \r\n"):
        path = tmp_path / "empty.txt"
        path.write_bytes(content)
        check_error(lambda: read_document(path), "no text")
    check_error(lambda: read_document_bytes(b"<html><script>x()</script></html>", "a.html"),
                "no text")


@pytest.mark.parametrize("data", [
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00",  # NUL bytes
    bytes(range(256)) * 8,  # undecodable / control characters
    b"\x01\x02\x03\x04\x05\x06\x07\x08 hello \x0e\x0f\x10\x11\x12\x13\x14",  # non-printable
])
def test_binary_files_are_refused(data):
    check_error(lambda: read_document_bytes(data, "image.txt"), "binary", "image.txt")


def test_corrupt_pdf(capfd):
    check_error(lambda: read_document_bytes(b"just text, not a PDF", "a.pdf"), "not a PDF")
    check_error(lambda: read_document_bytes(b"%PDF-1.4\ngarbage", "a.pdf"), "corrupt")
    broken = make_pdf(["Hello"]).replace(b"startxref", b"startxrex").replace(b"obj", b"ojb")
    check_error(lambda: read_document_bytes(broken, "a.pdf"), "corrupt")
    assert capfd.readouterr().err == ""  # pypdf's own warnings are not printed


def test_pdf_without_text_may_be_scanned():
    check_error(lambda: read_document_bytes(make_pdf([]), "scan.pdf"), "scanned", "OCR")


def test_size_limit(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"word " * 1000)
    assert read_document(path, max_bytes=5000).startswith("word")
    check_error(lambda: read_document(path, max_bytes=4999), "limit", "big.txt")
    check_error(lambda: read_document_bytes(b"word " * 1000, "big.md", max_bytes=100), "limit")
    check_error(lambda: read_document("-", stdin=io.BytesIO(b"x" * 101), max_bytes=100),
                "limit")
