"""The document text with the memory's retained tokens highlighted (an HTML fragment).

Pure: takes the text, each document token's character span and the fraction of
(layer, KV head) slots that keep it; no Gradio, no tokenizer.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

LEVELS = 8  # shades of highlight; a token kept by no slot has none
_RGB = (29, 78, 216)  # the kept shade at full strength (blue)
# Colour-blind-safe roles: kept is blue (darker = more slots), evicted is orange with a
# pale orange background, not read yet is grey italic; every text colour passes WCAG AA (4.5:1).
EVICTED_BACKGROUND = "#fde4cc"
UNREAD_TEXT = "#6b7280"  # 4.8:1 on white
DARK_TEXT, LIGHT_TEXT = "#111827", "#ffffff"


def _level(fraction: float) -> int:
    """0 = evicted everywhere, 1..LEVELS = shades, -1 = not read yet (NaN)."""
    if fraction != fraction:  # NaN
        return -1
    if fraction <= 0:
        return 0
    return max(1, min(LEVELS, round(fraction * LEVELS)))


NEEDLE_STYLE = "outline:2px solid #dc2626;outline-offset:2px;border-radius:2px;scroll-margin-top:14px"


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
        return f"background:{EVICTED_BACKGROUND}"
    background, text = shade(level)
    r, g, b = (round(c) for c in background)
    return f"background:rgb({r},{g},{b});color:{text}"


def legend_html() -> str:
    swatches = "".join(
        f'<span style="display:inline-block;width:18px;height:12px;{_style(level)}"></span>'
        for level in range(2, LEVELS + 1, 2))
    return (
        '<div style="font-size:12px;color:#4b5563;margin-bottom:6px;display:flex;gap:14px;'
        'align-items:center;flex-wrap:wrap">'
        f'<span style="{_style(-1)}">not read yet</span>'
        f'<span style="{_style(0)};padding:0 3px">evicted everywhere</span>'
        f'<span>kept by a few <span style="display:inline-flex">{swatches}</span> to every layer-head</span>'
        f'<span><span style="{NEEDLE_STYLE};padding:0 3px">passkey</span> outlined when present</span>'
        "</div>")


def highlight_html(text: str, spans: Sequence[tuple[int, int]], fractions: Sequence[float],
                   needle_chars: tuple[int, int] | None = None, caption: str = "",
                   max_height: int = 380) -> str:
    """``text`` with token i (characters ``spans[i]``) shaded by ``fractions[i]``.

    A NaN fraction marks a token not read yet (grey text). Tokens overlapping
    ``needle_chars`` are outlined. Consecutive tokens of the same shade
    share one <span>, so a long document stays a compact fragment. Text after the last
    span (cut by truncation) is left out."""
    if len(spans) != len(fractions):
        raise ValueError(f"{len(spans)} token spans but {len(fractions)} fractions")
    # Runs of tokens with the same shade become one <span>; the needle's runs sit inside
    # one outlined wrapper (the link target), so it reads as one marked sentence.
    runs: list[list] = []  # [start, end, level, needle]
    cursor = 0
    for (start, end), fraction in zip(spans, fractions):
        start, end = max(start, cursor), max(end, cursor)  # overlapping offsets: never repeat text
        needle = needle_chars is not None and start < needle_chars[1] and end > needle_chars[0]
        level = _level(float(fraction))
        if runs and runs[-1][1] == start and runs[-1][2:] == [level, needle]:
            runs[-1][1] = end
        else:
            runs.append([start, end, level, needle])
        cursor = end
    out: list[str] = []
    cursor, in_needle, anchored = 0, False, False
    for start, end, level, needle in runs:
        if needle != in_needle:
            if needle and not anchored:
                out.append(f'<span id="memstep-needle" style="{NEEDLE_STYLE}">')
                anchored = in_needle = True
            elif not needle:
                out.append("</span>")
                in_needle = False
        if start > cursor:  # characters no token covers (e.g. trimmed spaces)
            out.append(html.escape(text[cursor:start]))
        piece, style = html.escape(text[start:end]), _style(level)
        out.append(f'<span style="{style}">{piece}</span>' if style else piece)
        cursor = end
    if in_needle:
        out.append("</span>")
    jump = ' <a href="#memstep-needle">Show the passkey.</a>' if anchored else ""
    cap = (f'<div style="font-size:12px;color:#4b5563;margin-bottom:4px">{html.escape(caption)}{jump}</div>'
           if caption or jump else "")
    return (f'<div class="memstep-retained">{cap}{legend_html()}'
            f'<div style="white-space:pre-wrap;font-family:Georgia,serif;font-size:14px;line-height:1.65;'
            f'max-height:{max_height}px;overflow-y:auto;padding:10px 12px;border:1px solid #e5e7eb;'
            f'border-radius:8px;background:#fff;color:#111827">{"".join(out)}</div></div>')
