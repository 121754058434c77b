"""Documents built to cost work, not bytes (the tests and benchmarks/hostile_app.py share them):

- a PDF of ~12 KB whose pages all show one deflated content stream of ~4.6 MB of text operators
  (pypdf parses each page's copy: ~45 CPU seconds a page before reading was bounded);
- 1 MB of ``<p>x</p>`` (131,072 paragraphs) and 1 MB of nested ``<b>`` (150,000 levels deep).
"""

from __future__ import annotations

import zlib

CONTENT_OPERATORS = b"BT /F1 12 Tf 72 700 Td (x) Tj ET\n"


def shared_stream_pdf(pages: int = 1, content_bytes: int = 4_600_000) -> bytes:
    """A PDF whose ``pages`` pages all name one FlateDecode content stream that inflates to about
    ``content_bytes`` of text-showing operators."""
    content = CONTENT_OPERATORS * (content_bytes // len(CONTENT_OPERATORS))
    packed = zlib.compress(content, 9)
    kids = " ".join(f"{5 + i} 0 R" for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Length {len(packed)} /Filter /FlateDecode >>\nstream\n".encode() + packed + b"\nendstream",
    ] + [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
         b"/Contents 4 0 R >>"] * pages
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def slow_pdf() -> bytes:
    """A PDF under every cap that takes a minute of CPU to read: 30 pages sharing one 0.9 MB stream
    (each page under the 1 MB a page may hold, 27 MB in all)."""
    return shared_stream_pdf(30, content_bytes=900_000)


def paragraphs_html(size: int = 1 << 20) -> bytes:
    """``size`` bytes of ``<p>x</p>``."""
    return b"<p>x</p>" * (size // 8)


def nested_html(size: int = 1 << 20) -> bytes:
    """About ``size`` bytes of ``<b>`` nested ever deeper around one word."""
    depth = size // 7
    return b"<b>" * depth + b"x" + b"</b>" * depth
