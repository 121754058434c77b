"""Documents built to cost work, not bytes (the tests and benchmarks/hostile_app.py share them):

- a PDF of ~12 KB whose pages all show one deflated content stream of ~4.6 MB of text operators
  (pypdf parses each page's copy: ~45 CPU seconds a page before reading was bounded);
- a PDF of 200 pages, each its own deflated stream of ~1 MB of empty text objects (``BT () Tj ET``:
  operators that yield no text; 18-20 CPU seconds before this round's work budget);
- a PDF of ~1.3 KB whose one page draws a form 100 times that draws a form 100 times that holds
  500 empty text objects (pypdf alone: about a minute of CPU, its 5,000-draw cap included);
- 1 MB of ``<p>x</p>`` (131,072 paragraphs: a page that yields text as fast as its tags cost),
  1 MB of nested ``<b>`` (150,000 levels deep), one tag with 500,000 attributes, 5 MB of ``<``
  and 5 MB of ``&amp;``.
"""

from __future__ import annotations

import zlib

CONTENT_OPERATORS = b"BT /F1 12 Tf 72 700 Td (x) Tj ET\n"


def pdf_file(objects: list[bytes]) -> bytes:
    """A PDF of these objects (1: the catalog), with its cross-reference table."""
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def deflated(content: bytes, entries: str = "") -> bytes:
    packed = zlib.compress(content, 9)
    return f"<< {entries} /Length {len(packed)} /Filter /FlateDecode >>\nstream\n".encode() + packed + b"\nendstream"


def shared_stream_pdf(pages: int = 1, content_bytes: int = 4_600_000) -> bytes:
    """A PDF whose ``pages`` pages all name one FlateDecode content stream that inflates to about
    ``content_bytes`` of text-showing operators."""
    content = CONTENT_OPERATORS * (content_bytes // len(CONTENT_OPERATORS))
    kids = " ".join(f"{5 + i} 0 R" for i in range(pages))
    return pdf_file([b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
                     b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", deflated(content)]
                    + [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                       b"/Contents 4 0 R >>"] * pages)


PAGE = "/Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]"
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def pages_pdf(contents: list[bytes]) -> bytes:
    """A PDF with one page per content (each its own deflated stream), all in Helvetica."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", FONT]
    kids = []
    for content in contents:
        objects.append(deflated(content))
        objects.append(f"<< {PAGE} /Resources << /Font << /F1 3 0 R >> >> /Contents {len(objects)} 0 R >>".encode())
        kids.append(len(objects))
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>".encode()
    return pdf_file(objects)


def empty_text_pdf(pages: int = 200, content_bytes: int = 1_000_000) -> bytes:
    """``pages`` pages of text objects that show nothing: ``BT () Tj ET`` over ~``content_bytes`` each."""
    unit = b"BT () Tj ET\n"
    return pages_pdf([unit * (content_bytes // len(unit))] * pages)


def text_pdf(lines: list[str], per_page: int = 45) -> bytes:
    """An ordinary text PDF: ``per_page`` lines a page, one Tj each."""
    def shown(line: str) -> bytes:
        return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1", "replace")

    return pages_pdf([b"BT /F1 11 Tf 14 TL 72 740 Td " + b"".join(b"(" + shown(line) + b") Tj T* "
                                                                    for line in lines[i:i + per_page]) + b"ET"
                      for i in range(0, len(lines), per_page)])


def nested_forms_pdf(levels: int = 3, fanout: int = 100, leaf_objects: int = 500) -> bytes:
    """One page that draws a form ``fanout`` times, which draws the next form ``fanout`` times, ...
    ``levels`` deep; the innermost holds ``leaf_objects`` empty text objects."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", FONT,
               deflated(b"BT /F1 12 Tf () Tj ET\n" * leaf_objects,
                        "/Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >>")]
    for _ in range(1, levels):
        objects.append(deflated(b"/X Do\n" * fanout, f"/Type /XObject /Subtype /Form /BBox [0 0 612 792] "
                                                       f"/Resources << /XObject << /X {len(objects)} 0 R >> >>"))
    top = len(objects)
    objects.append(deflated(b"/X Do\n" * fanout))
    objects.append(f"<< {PAGE} /Resources << /XObject << /X {top} 0 R >> >> /Contents {len(objects)} 0 R >>".encode())
    objects[1] = f"<< /Type /Pages /Kids [{len(objects)} 0 R] /Count 1 >>".encode()
    return pdf_file(objects)


def long_pdf(chars: int = 4_500_000) -> bytes:
    """An ordinary text PDF of about ``chars`` characters (Persuasion's lines, repeated): the slowest
    read a document that yields text as it goes may take (the app reads 4.2 M characters of it,
    seconds of CPU); one page stream shared by every page keeps the file small."""
    from pathlib import Path

    lines = [line for line in (Path(__file__).resolve().parent.parent / "assets" / "persuasion_excerpt.txt")
             .read_text().splitlines() if line.strip()][:45]
    page = ("BT /F1 11 Tf 14 TL 72 740 Td " + "".join(f"({line[:90]}) Tj T* " for line in lines) + "ET").encode(
        "latin-1", "replace")
    text_per_page = sum(len(line[:90]) + 1 for line in lines)
    pages = chars // text_per_page + 1
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", FONT, deflated(page)]
    kids = []
    for _ in range(pages):
        objects.append(f"<< {PAGE} /Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>".encode())
        kids.append(len(objects))
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>".encode()
    return pdf_file(objects)


def slow_pdf() -> bytes:
    """A PDF under the byte caps that takes a minute of CPU to read: 30 pages sharing one 0.9 MB stream
    (each page under the 1 MB a page may hold, 27 MB in all; over the work budget at its first page)."""
    return shared_stream_pdf(30, content_bytes=900_000)


def paragraphs_html(size: int = 1 << 20) -> bytes:
    """``size`` bytes of ``<p>x</p>``."""
    return b"<p>x</p>" * (size // 8)


def nested_html(size: int = 1 << 20) -> bytes:
    """About ``size`` bytes of ``<b>`` nested ever deeper around one word."""
    depth = size // 7
    return b"<b>" * depth + b"x" + b"</b>" * depth


def attributes_html(count: int = 500_000) -> bytes:
    """One tag with ``count`` attributes."""
    return b"<p " + b"a " * count + b">x</p>"


def angles_html(size: int = 5_000_000) -> bytes:
    """``size`` bytes of ``<``: the parser hands each over as text, one at a time."""
    return b"<" * size


def entities_html(size: int = 5_000_000) -> bytes:
    """About ``size`` bytes of ``&amp;``."""
    return b"&amp;" * (size // 5)
