"""One source of truth for what the retained-token views mean: the map's colour scale, colour
bar and legend, the text view's legend, the Run tab's help and the README's legend block are
all built from ui/legend.py, and the words name the colours actually drawn."""

from __future__ import annotations

import colorsys
from pathlib import Path

import numpy as np

from ui import figures, highlight, legend

README = Path(__file__).resolve().parent.parent / "README.md"


def _hue_name(color: str) -> str:
    """A colour's coarse name, from its hue, lightness and saturation."""
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    hue, light, saturation = colorsys.rgb_to_hls(r, g, b)
    if saturation < 0.25 or light > 0.94:
        return "grey" if light < 0.97 else "white"
    degrees = hue * 360
    for name, upper in (("red", 15), ("orange", 45), ("yellow", 70), ("green", 170), ("blue", 260),
                        ("purple", 330), ("red", 361)):
        if degrees < upper:
            return name
    return "red"


def test_the_words_name_the_colours_drawn():
    assert _hue_name(legend.EVICTED_MAP) in legend.EVICTED.look  # "orange", not "white"
    assert _hue_name(legend.EVICTED_TEXT) in legend.TEXT_ENTRIES[1].look
    assert all(_hue_name(c) == "blue" for _, c in legend.KEPT_SCALE) and "blue" in legend.KEPT.look
    assert _hue_name(legend.UNREAD_FILL) in ("grey", "white") and "grey" in legend.UNREAD.look
    assert _hue_name(legend.CHUNK_OUTLINE) in legend.CHUNK.look and _hue_name(legend.SINKS_MARK) in legend.SINKS.look
    assert _hue_name(legend.PASSKEY_MARK) in legend.PASSKEY.look and _hue_name(legend.ANSWER_MARK) in legend.ANSWER.look


def test_the_map_draws_the_legend_constants(monkeypatch):
    from test_figures import fake_records

    from memstep.schedules import make_schedule

    schedule = make_schedule("imdc", 2048, 512, 512)
    fig = figures.retained_map_figure(fake_records(schedule), 2048, schedule.steps, sinks=4, needle=(100, 104),
                                      answers=[(1500, 1502)])
    heatmap = fig.data[0]
    assert [[p, c] for p, c in heatmap.colorscale] == [[p, c] for p, c in legend.map_colorscale()]
    assert heatmap.colorbar.title.text == legend.COLORBAR_TITLE
    assert list(zip(heatmap.colorbar.tickvals, heatmap.colorbar.ticktext)) == list(legend.COLORBAR_TICKS)
    named = {t.name: t for t in fig.data if t.showlegend is not False and t.name}
    assert set(legend.LEGEND_NAMES.values()) <= set(named)
    assert named[legend.LEGEND_NAMES["evicted"]].marker.color == legend.EVICTED_MAP
    assert named[legend.LEGEND_NAMES["unread"]].fillpattern.fgcolor == legend.UNREAD_HATCH
    marks = {a.text: a.font.color for a in fig.layout.annotations}
    assert marks == {"sinks": legend.SINKS_MARK, "passkey": legend.PASSKEY_MARK, "answer": legend.ANSWER_MARK}
    # the evicted cells are drawn in the evicted colour: a fraction of exactly 0 maps to it
    assert np.nanmin(np.asarray(heatmap.z, dtype=float)) == 0.0 and legend.map_colorscale()[1][1] == legend.EVICTED_MAP


def test_the_text_view_and_the_help_say_the_same():
    from ui.tabs.run import GUIDE

    html = highlight.legend_html()
    for entry in legend.TEXT_ENTRIES:
        assert entry.meaning in html
    assert highlight.EVICTED_BACKGROUND == legend.EVICTED_TEXT
    assert legend.map_guide() in GUIDE and legend.text_guide() in GUIDE
    for entry in legend.ENTRIES:
        assert entry.sentence() in GUIDE
    assert "White" not in GUIDE  # the old help called evicted tokens white while the map drew them orange


def test_the_readme_legend_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    assert legend.readme_block() in text, "README legend is stale: python -m ui.legend --readme README.md"
