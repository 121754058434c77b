"""First-run experience without a browser (issue 12): the passkey's story, contrast of the
text view, the retained map's encodings, the charts' text alternative, the progress bar's
role, wrapped chart errors, the Evaluate plots' colours and labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ui import figures
from ui.highlight import LEVELS, UNREAD_TEXT, _hex, contrast, highlight_html, shade
from ui.summary import stat_cards


@pytest.mark.parametrize("level", range(1, LEVELS + 1))
def test_text_view_shades_pass_wcag_aa(level):
    background, text = shade(level)
    assert contrast(background, _hex(text)) >= 4.5


def test_unread_and_evicted_text_pass_wcag_aa():
    assert contrast((255, 255, 255), _hex(UNREAD_TEXT)) >= 4.5
    out = highlight_html("one two three", [(0, 3), (3, 7), (7, 13)], [0.0, 1.0, float("nan")])
    assert "font-style:italic" in out and "background:#fde4cc" in out  # unread and evicted look different


def test_retained_map_encodings_are_distinct():
    colours = dict((pos, c) for pos, c in figures.RETAINED_SCALE)
    evicted, first_kept = colours[0.0], figures.RETAINED_SCALE[2][1]
    assert evicted != figures.UNREAD and evicted != "#ffffff"
    assert contrast(_hex(evicted), _hex(first_kept)) > 1.0 and evicted.lower() != first_kept.lower()
    # hue: evicted is orange (red channel dominant), kept is blue (blue channel dominant)
    assert _hex(evicted)[0] > _hex(evicted)[2] and _hex(first_kept)[2] > _hex(first_kept)[0]


def test_unread_positions_are_hatched():
    from test_figures import fake_records

    from memstep.schedules import make_schedule

    schedule = make_schedule("imdc", 2048, 512, 512)
    records = fake_records(schedule)[:2]
    fig = figures.retained_map_figure(records, 2048, schedule.steps)
    hatch = [t for t in fig.data if getattr(t, "fillpattern", None) is not None and t.fillpattern.shape == "/"]
    assert len(hatch) == 1
    xs = list(hatch[0].x)
    assert xs[1] == records[0].tokens_seen - 0.5 and xs[3] == records[1].tokens_seen - 0.5 and xs[5] == -0.5


def test_chart_errors_wrap_instead_of_running_off():
    message = "memory size 2 is smaller than the 4 sink tokens: use a memory of at least 4 " * 2 + "<path>"
    fig = figures.placeholder_figure(message)
    text = fig.layout.annotations[0].text
    assert "<br>" in text and all(len(line) <= 48 for line in text.split("<br>")) and "&lt;path&gt;" in text


def test_progress_bar_role_and_text_alternative():
    out = stat_cards([("state", "run", "running")], 0.5, summary="IMDC, after step 1 of 2: chunks read 512")
    assert 'role="progressbar"' in out and 'aria-valuenow="50"' in out
    assert 'aria-live="polite"' in out and "chunks read 512" in out


def test_evaluate_plots_are_colour_blind_safe_and_labelled():
    from memstep.evaluation import plots

    summary = {"rows": [{"length": 1024, "peak_rss_bytes": 2**30, "accuracy": 0.5, "seconds": 3.0, "nll_gap": 0.1,
                         "label": "IMDC c512", "config": {"kind": "memstep"}}],
               "heatmaps": {"IMDC c512": {"accuracy": [[1.0]], "lengths": [1024], "depths": [0.5]}}}
    trade = plots.tradeoff_figure(summary)
    # named on hover (labels on the points printed over each other where configurations cost the same)
    assert list(trade.data[0].text) == ["IMDC c512"] and "%{text}" in trade.data[0].hovertemplate
    heat = plots.heatmap_figure(summary)
    scale = [c for _, c in heat.data[0].colorscale]
    assert not any(c.lower() in ("#a50026", "#006837", "rgb(165,0,38)", "rgb(0,104,55)") for c in scale)
