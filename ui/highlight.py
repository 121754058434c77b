"""The document text with the memory's retained tokens highlighted (an HTML fragment).

Pure: takes the text, each document token's character span and the fraction of
(layer, KV head) slots that keep it; no Gradio, no tokenizer.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from ui import legend

LEVELS = 8  # shades of highlight; a token kept by no slot has none
_RGB = (29, 78, 216)  # the kept shade at full strength (blue)
# Colour-blind-safe roles (ui/legend.py): kept is blue (darker = more slots), evicted is orange
# with a pale orange background, not read yet is grey italic; every text colour passes WCAG AA.
EVICTED_BACKGROUND = legend.EVICTED_TEXT
UNREAD_TEXT = "#6b7280"  # 4.8:1 on white
DARK_TEXT, LIGHT_TEXT = "#111827", "#ffffff"


def _level(fraction: float) -> int:
    """0 = evicted everywhere, 1..LEVELS = shades, -1 = not read yet (NaN)."""
    if fraction != fraction:  # NaN
        return -1
    if fraction <= 0:
        return 0
    return max(1, min(LEVELS, round(fraction * LEVELS)))


_OUTLINE = "outline-offset:2px;border-radius:2px;scroll-margin-top:14px"
NEEDLE_STYLE = f"outline:2px solid {legend.PASSKEY_MARK};{_OUTLINE}"
POINTED_STYLE = f"outline:3px dotted var(--body-text-color);{_OUTLINE}"  # as .memstep-pointed (ui/layout.py)
MARK_STYLES = {  # kind -> style of the wrapper around a marked stretch of text
    "needle": NEEDLE_STYLE,
    "answer": f"outline:2px dashed {legend.ANSWER_MARK};{_OUTLINE}",
    "match": f"outline:2px solid {legend.MATCH_MARK};box-shadow:0 3px 0 {legend.MATCH_MARK};{_OUTLINE}",
}


@dataclass(frozen=True)
class Mark:
    """A stretch of the text to outline: [start, end) in characters, its kind (needle, answer,
    match) and its anchor (the id a link can jump to)."""

    start: int
    end: int
    kind: str
    anchor: str


def _luminance(rgb: tuple[float, float, float]) -> float:
    """WCAG relative luminance of an sRGB colour (0-255 channels)."""
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def shade(level: int) -> tuple[tuple[float, float, float], str]:
    """(background over white, text colour) of a kept level: the text colour with the better
    contrast, which is at least 4.5:1 for any background."""
    alpha = 0.12 + 0.78 * level / LEVELS
    while True:  # mid blues give neither text colour 4.5:1: darken those shades a little
        background = tuple(255 - alpha * (255 - c) for c in _RGB)
        text = max((DARK_TEXT, LIGHT_TEXT), key=lambda t: contrast(background, _hex(t)))
        if contrast(background, _hex(text)) >= 4.5 or alpha >= 1:
            return background, text
        alpha = min(1.0, alpha + 0.02)


def _hex(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


def _style(level: int) -> str:
    if level < 0:
        return f"color:{UNREAD_TEXT};font-style:italic"
    if level == 0:
        return f"background:{EVICTED_BACKGROUND};color:{DARK_TEXT}"  # dark text on any page theme
    background, text = shade(level)
    r, g, b = (round(c) for c in background)
    return f"background:rgb({r},{g},{b});color:{text}"


def legend_html() -> str:
    """The text view's legend, in the words of ui/legend.py."""
    swatches = "".join(
        f'<span style="display:inline-block;width:18px;height:12px;{_style(level)}"></span>'
        for level in range(2, LEVELS + 1, 2))
    unread, evicted, kept = legend.TEXT_ENTRIES
    return (
        '<div class="memstep-legend" style="font-size:12px;line-height:2;margin-bottom:6px;display:flex;gap:14px;'
        'align-items:center;flex-wrap:wrap">'
        f'<span style="{_style(-1)}">{unread.meaning}</span>'
        f'<span style="{_style(0)};padding:0 3px">{evicted.meaning}</span>'
        f'<span>{kept.meaning} <span style="display:inline-flex">{swatches}</span></span>'
        f'<span><span style="{NEEDLE_STYLE};padding:0 3px;white-space:nowrap">passkey</span>, '
        f'<span style="{MARK_STYLES["answer"]};padding:0 3px;white-space:nowrap">answer</span> and '
        f'<span style="{MARK_STYLES["match"]};padding:0 3px;white-space:nowrap">search matches</span> outlined; '
        f'<span style="{POINTED_STYLE};padding:0 3px;white-space:nowrap">a clicked token</span> dotted</span>'
        "</div>")


def _utf16(text: str) -> int:
    """Length in UTF-16 code units: how the page's script counts characters."""
    return len(text) if text.isascii() else len(text.encode("utf-16-le")) // 2


def _offsets(text: str, start: int, starts: Sequence[int]) -> str:
    """' data-o="0 4 9"': where each token of a piece starts in it (UTF-16 units), so the map can
    outline one token of a piece that holds several; nothing for a one-token piece."""
    if len(starts) < 2:
        return ""
    offsets, at, previous = [], 0, start
    for token in starts:  # summed token by token: a long piece's slices are never recounted
        at += _utf16(text[previous:token])
        offsets.append(str(at))
        previous = token
    return ' data-o="' + " ".join(offsets) + '"'


def _token_marks(start: int, end: int, marks: Sequence[Mark]) -> tuple[int, ...]:
    return tuple(i for i, m in enumerate(marks) if start < m.end and end > m.start)


def highlight_html(text: str, spans: Sequence[tuple[int, int]], fractions: Sequence[float],
                   needle_chars: tuple[int, int] | None = None, caption: str = "",
                   max_height: int = 380, marks: Sequence[Mark] = (), links: str = "", first_token: int = 0) -> str:
    """``text`` with token i (characters ``spans[i]``) shaded by ``fractions[i]``.

    A NaN fraction marks a token not read yet (grey text). Tokens overlapping a mark (or
    ``needle_chars``, the passkey) sit inside an outlined wrapper whose first piece carries
    the mark's anchor id. Consecutive tokens of the same shade and marks share one <span>,
    so a long document stays a compact fragment. Text after the last span (cut by
    truncation) is left out. ``links`` (HTML) follows the caption. Each piece carries the
    document index of its first token (data-t, counted from ``first_token``) and where each of
    its tokens starts (data-o), so the map can point at a token in the text."""
    if len(spans) != len(fractions):
        raise ValueError(f"{len(spans)} token spans but {len(fractions)} fractions")
    marks = list(marks)
    if needle_chars is not None:
        marks.insert(0, Mark(needle_chars[0], needle_chars[1], "needle", "memstep-needle"))
    runs: list[list] = []  # [start, end, level, marks, first token, its tokens' starts]
    cursor = 0
    for index, ((start, end), fraction) in enumerate(zip(spans, fractions), start=first_token):
        start, end = max(start, cursor), max(end, cursor)  # overlapping offsets: never repeat text
        inside = _token_marks(start, end, marks) if marks else ()
        level = _level(float(fraction))
        if runs and runs[-1][1] == start and runs[-1][2:4] == [level, inside]:
            runs[-1][1] = end
            runs[-1][5].append(start)
        else:
            runs.append([start, end, level, inside, index, [start]])
        cursor = end
    out: list[str] = []
    cursor, open_marks, anchored = 0, [], set()
    for start, end, level, inside, index, starts in runs:
        # close the wrappers the run leaves (and any opened after them), then open the new ones
        keep = 0
        while keep < len(open_marks) and open_marks[keep] in inside:
            keep += 1
        out.append("</span>" * (len(open_marks) - keep))
        open_marks = open_marks[:keep]
        if start > cursor:  # characters no token covers (e.g. trimmed spaces)
            out.append(html.escape(text[cursor:start]))
        for i in inside:
            if i not in open_marks:
                mark = marks[i]
                anchor = f' id="{mark.anchor}"' if mark.anchor not in anchored else ""
                anchored.add(mark.anchor)
                out.append(f'<span{anchor} data-mark="{mark.kind}" style="{MARK_STYLES[mark.kind]}">')
                open_marks.append(i)
        piece, style = html.escape(text[start:end]), _style(level)
        out.append(f'<span data-t="{index}"{_offsets(text, start, starts)} style="{style}">{piece}</span>')
        cursor = end
    out.append("</span>" * len(open_marks))
    jump = ' <a href="#memstep-needle">Show the passkey.</a>' if "memstep-needle" in anchored else ""
    cap = (f'<div class="memstep-caption" style="font-size:12px;margin-bottom:4px">{html.escape(caption)}{jump}'
           f'{links}</div>' if caption or jump or links else "")
    return (f'<div class="memstep-retained">{cap}{legend_html()}'
            f'<div class="memstep-paper" style="white-space:pre-wrap;font-family:Georgia,serif;font-size:14px;'
            f'line-height:1.65;max-height:{max_height}px;overflow-y:auto;padding:10px 12px;border:1px solid #e5e7eb;'
            f'border-radius:8px;background:#fff;color:#111827">{"".join(out)}</div></div>')
