"""The document text with the memory's retained tokens highlighted (an HTML fragment).

Pure: takes the text, each document token's character span and the fraction of
(layer, KV head) slots that keep it; no Gradio, no tokenizer.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

LEVELS = 8  # shades of highlight; a token kept by no slot has none
_RGB = "29, 78, 216"


def _level(fraction: float) -> int:
    """0 = evicted everywhere, 1..LEVELS = shades, -1 = not read yet (NaN)."""
    if fraction != fraction:  # NaN
        return -1
    if fraction <= 0:
        return 0
    return max(1, min(LEVELS, round(fraction * LEVELS)))


def _style(level: int, needle: bool) -> str:
    parts = []
    if level < 0:
        parts.append("color:#9ca3af")
    elif level:
        alpha = 0.12 + 0.78 * level / LEVELS
        parts.append(f"background:rgba({_RGB},{alpha:.2f})")
        if alpha > 0.55:
            parts.append("color:#fff")
    if needle:
        parts.append("outline:2px solid #dc2626;outline-offset:1px")
    return ";".join(parts)


def legend_html() -> str:
    swatches = "".join(
        f'<span style="display:inline-block;width:18px;height:12px;{_style(level, False)}"></span>'
        for level in range(0, LEVELS + 1, 2))
    return (
        '<div style="font-size:12px;color:#4b5563;margin-bottom:6px;display:flex;gap:14px;'
        'align-items:center;flex-wrap:wrap">'
        f'<span>evicted everywhere <span style="border:1px solid #d1d5db;display:inline-flex">{swatches}'
        '</span> kept by every layer-head</span>'
        '<span><span style="outline:2px solid #dc2626;padding:0 3px">passkey</span> outlined when present</span>'
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
    out: list[str] = []
    cursor = 0
    group_start, group_end, group_key = 0, 0, None
    anchored = False

    def flush():
        nonlocal anchored
        if group_key is not None and group_end > group_start:
            piece = html.escape(text[group_start:group_end])
            style = _style(*group_key)
            anchor = ""
            if group_key[1] and not anchored:  # the needle's first piece: a link target
                anchor, anchored = ' id="memstep-needle"', True
            out.append(f'<span{anchor} style="{style}">{piece}</span>' if style else piece)

    for (start, end), fraction in zip(spans, fractions):
        start, end = max(start, cursor), max(end, cursor)  # overlapping offsets: never repeat text
        needle = needle_chars is not None and start < needle_chars[1] and end > needle_chars[0]
        key = (_level(float(fraction)), needle)
        if key != group_key or start != group_end:
            flush()
            if start > cursor:  # characters no token covers (e.g. trimmed spaces)
                out.append(html.escape(text[cursor:start]))
            group_start, group_key = start, key
        group_end = end
        cursor = end
    flush()
    jump = ' <a href="#memstep-needle">Show the passkey.</a>' if anchored else ""
    cap = (f'<div style="font-size:12px;color:#4b5563;margin-bottom:4px">{html.escape(caption)}{jump}</div>'
           if caption or jump else "")
    return (f'<div class="memstep-retained">{cap}{legend_html()}'
            f'<div style="white-space:pre-wrap;font-family:Georgia,serif;font-size:14px;line-height:1.65;'
            f'max-height:{max_height}px;overflow-y:auto;padding:10px 12px;border:1px solid #e5e7eb;'
            f'border-radius:8px;background:#fff;color:#111827">{"".join(out)}</div></div>')
