"""Figures of an evaluation summary (Plotly), and writing them as HTML and PNG.

Pure functions of the summary dict (``metrics.summarize``), shared by the CLI, which
writes them beside the results, and the app's Evaluate tab, which shows them. Plotly is
imported inside the functions: the rest of memstep never needs it.
"""

from __future__ import annotations

import os
from pathlib import Path

PEER_SYMBOLS = {"memstep": "circle", "kvpress": "diamond", "hf": "star"}
# Okabe-Ito blue, vermillion, bluish green: told apart with the common colour-vision deficiencies
KIND_COLORS = {"memstep": "#0072B2", "kvpress": "#D55E00", "hf": "#009E73"}
# RoPE positions of a memstep configuration, by marker fill (not colour)
ROPE_SYMBOLS = {"compact": "circle", "document": "circle-open", "shared": "circle-dot", None: "circle"}


def _wrap(text: str, width: int) -> str:
    """A panel title broken at spaces into lines of about ``width`` characters: the figure
    is built without knowing the screen, and a phone (390 px) has no room for long titles. A
    word longer than a line (a question pool: pool=follow:15+fade:0.7@256/8+heads@256+last<256)
    breaks before its '+' suffixes."""
    import re
    import textwrap

    lines = []
    for line in textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [text]:
        part = ""
        for piece in re.split(r"(?=\+)", line) if len(line) > width else [line]:
            if part and len(part) + len(piece) > width:
                lines.append(part)
                part = ""
            part += piece
        lines.append(part)
    return "<br>".join(lines)


# Horizontal legend (or colour bar) at the foot of the figure, below the x-axis titles: it
# may wrap to several rows on a phone and then grows downwards, never into a title.
FOOT = {"orientation": "h", "xref": "container", "x": 0.0, "xanchor": "left", "yref": "container", "y": 0.0,
        "yanchor": "bottom"}


def _title(text: str) -> dict:
    """The figure's title at its top-left corner, so the panels below can count on the space."""
    return {"text": text, "xref": "container", "x": 0.0, "xanchor": "left", "yref": "container", "y": 1.0,
            "yanchor": "top", "pad": {"t": 16, "l": 12}}


def heatmap_figure(summary: dict, labels: list[str] | None = None, columns: int = 3):
    """Needle-in-a-haystack accuracy, depth (rows) x length (columns), one panel per configuration."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    maps = summary["heatmaps"]
    labels = [label for label in (labels or _ordered_labels(summary)) if label in maps]
    if not labels:
        return _empty("no passkey results yet")
    columns = max(1, min(columns, len(labels)))
    rows = -(-len(labels) // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=[_wrap(label, 14) for label in labels],
                        shared_yaxes=True, horizontal_spacing=0.03, vertical_spacing=min(0.14, 0.6 / rows))
    for i, label in enumerate(labels):
        data = maps[label]
        z = [[None if v is None else round(100 * v) for v in row] for row in data["accuracy"]]
        fig.add_trace(go.Heatmap(
            z=z, x=[f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in data["lengths"]],
            y=[f"{round(100 * d)}%" for d in data["depths"]], zmin=0, zmax=100, colorscale="Viridis",  # not red-green
            showscale=i == 0, colorbar={**FOOT, "title": {"text": "accuracy %", "side": "top"}, "thickness": 10,
                                        "len": 0.6, "x": 0.5, "xanchor": "center"}, texttemplate="%{text}",
            text=[["" if v is None else str(v) for v in row] for row in z],  # not run: blank
            hovertemplate=f"{label}<br>length %{{x}}<br>depth %{{y}}<br>accuracy %{{z}}%<extra></extra>"),
            row=i // columns + 1, col=i % columns + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_annotations(font_size=11)
    fig.update_layout(title=_title("Passkey accuracy:<br>needle depth x haystack length"), height=230 * rows + 200,
                      margin={"l": 40, "r": 20, "t": 125, "b": 30})
    return fig


def tradeoff_figure(summary: dict, length: int | None = None):
    """Accuracy vs peak resident memory at one length (the longest by default); marker area
    grows with wall seconds; peers drawn as diamonds (kvpress) and a star (HF)."""
    import plotly.graph_objects as go

    rows = summary["rows"]
    if not rows:
        return _empty("no results yet")
    length = length or max(r["length"] for r in rows)
    rows = [r for r in rows if r["length"] == length and r["peak_rss_bytes"] is not None]
    fair = any(r.get("kl") is not None for r in rows)
    if fair:  # accuracy on the cases the full cache answers
        rows = [_fair_view(r) for r in rows if r.get("counted")]
    slowest = max((r["seconds"] or 0 for r in rows), default=1) or 1
    fig = go.Figure()
    for kind in ("memstep", "kvpress", "hf"):
        group = [r for r in rows if r["config"]["kind"] == kind]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[r["peak_rss_bytes"] / 2**20 for r in group], y=[100 * r["accuracy"] for r in group],
            error_y=_wilson_bars(group),
            # no labels on the points: configurations that cost the same would print over each other
            # (hover names them; the table below lists them all)
            mode="markers",
            name=kind if kind != "hf" else "HF full cache",
            marker={"symbol": [_symbol(r) for r in group], "color": KIND_COLORS[kind], "opacity": 0.75,
                    "size": [10 + 30 * (r["seconds"] or 0) / slowest for r in group],
                    "line": {"width": 1, "color": "black"}},
            text=[r["label"] for r in group],
            customdata=[[r["seconds"] or 0, r["nll_gap"] if r["nll_gap"] is not None else float("nan")] for r in group],
            hovertemplate="%{text}<br>peak %{x:.0f} MiB<br>accuracy %{y:.0f}%<br>%{customdata[0]:.1f} s"
                          "<br>" + ("KL" if fair else "NLL gap") + " %{customdata[1]:.3f}<extra></extra>"))
    fig.update_layout(title=_title(f"Quality vs peak memory vs seconds<br>at {length} tokens<br><sup>marker size = "
                                   "seconds; bars: 95% Wilson interval;<br>memstep open = document RoPE positions,<br>dotted = shared positions; hover a point for its name</sup>"),
                      legend=FOOT,
                      xaxis_title="peak resident memory of the worker (MiB)",
                      yaxis_title="answered, of the cases<br>the full cache answers (%)" if fair else "passkey accuracy (%)",
                      yaxis_range=[-5, 105], height=560, margin={"l": 60, "r": 20, "t": 130, "b": 90})
    return fig


def _symbol(row: dict) -> str:
    """Peers by shape; memstep filled at compact RoPE positions, open at document positions,
    dotted at shared ones."""
    kind = row["config"]["kind"]
    return ROPE_SYMBOLS.get(row["config"].get("rope"), "circle") if kind == "memstep" else PEER_SYMBOLS[kind]


def _wilson_bars(rows: list[dict]) -> dict:
    """Asymmetric error bars (percent) for the accuracy's Wilson interval."""
    low = [100 * (r["accuracy"] - r["accuracy_low"]) if r.get("accuracy_low") is not None else 0 for r in rows]
    high = [100 * (r["accuracy_high"] - r["accuracy"]) if r.get("accuracy_high") is not None else 0 for r in rows]
    return {"type": "data", "symmetric": False, "array": high, "arrayminus": low, "thickness": 1.2, "width": 3}


def intervals_figure(summary: dict, lengths: list[int] | None = None):
    """Per configuration, one row of panels per length: passkey accuracy with its 95%
    Wilson interval (left) and the NLL gap to the full cache with its 95% t interval
    (right). Colour = kind (memstep, kvpress, HF); memstep markers are filled at compact
    RoPE positions and open at document positions."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = summary["rows"]
    # results with a KL against the full cache: accuracy on the cases the full cache answers, and the KL
    fair = any(r.get("kl") is not None for r in rows)
    if fair:
        rows = [_fair_view(r) for r in rows if r.get("counted")]
    lengths = [n for n in (lengths or sorted({r["length"] for r in rows})) if any(r["length"] == n for r in rows)]
    if not lengths:
        return _empty("no results yet")
    counts = [sum(1 for r in rows if r["length"] == n) for n in lengths]
    # three short lines each: side by side they must fit a phone's narrow panels
    titles = [t for n in lengths for t in (
        (f"{n} tokens:<br>answered %<br>(Wilson)", f"{n} tokens:<br>KL to the full<br>cache (95% t)")
        if fair else (f"{n} tokens:<br>accuracy %<br>(95% Wilson)", f"{n} tokens:<br>NLL gap<br>(95% t)"))]
    # 36 px a row: two-line names at 10 px stay apart even when a phone's wrapped legend takes more
    # of the figure's height; between lengths, room for the next row's three-line titles
    # (a name that wraps to three lines, e.g. with its pool, gets 13 px a line)
    lines = max(_wrap(r["label"], 28).count("<br>") + 1 for r in rows)
    height = 260 + max(36, 13 * lines + 10) * sum(counts) + 90 * len(lengths)
    fig = make_subplots(rows=len(lengths), cols=2, shared_yaxes=True, horizontal_spacing=0.08,
                        vertical_spacing=min(0.3, 120 / height) if len(lengths) > 1 else 0.0,
                        row_heights=counts, subplot_titles=titles)
    shown = set()
    for i, length in enumerate(lengths, start=1):
        at = [r for r in rows if r["length"] == length]
        for kind in ("memstep", "kvpress", "hf"):
            group = [r for r in at if r["config"]["kind"] == kind]
            if not group:
                continue
            _interval_traces(fig, go, group, kind, i, kind not in shown)
            shown.add(kind)
        # long configuration names on two lines: on one they would take a phone's width
        fig.update_yaxes(categoryorder="array", categoryarray=[r["label"] for r in at][::-1], automargin=True,
                         tickfont_size=10, tickmode="array", tickvals=[r["label"] for r in at],
                         ticktext=[_wrap(r["label"], 28) for r in at], row=i, col=1)
        # ticks at 0, 50 and 100 only: a phone leaves a few pixels between "100" and the KL panel's "0"
        fig.update_xaxes(range=[-5, 105], tickvals=[0, 50, 100], row=i, col=1)
        fig.add_vline(x=0, line={"color": "grey", "width": 1, "dash": "dot"}, row=i, col=2)
    fig.update_annotations(font_size=10)
    subtitle = ("answers counted on the cases the full cache answers;<br>KL of the next-token distributions, nats/token"
                if fair else "passkey accuracy; NLL gap to the full cache;<br>filled = compact RoPE positions, open = document")
    fig.update_layout(title=_title(f"Quality with 95% intervals<br><sup>{subtitle}</sup>"),
                      height=height, margin={"l": 20, "r": 20, "t": 150, "b": 70},
                      legend=FOOT)
    return fig


def _fair_view(row: dict) -> dict:
    """A row as the two interval panels read it: the counted accuracy and the KL in the places
    of the accuracy and the NLL gap."""
    return {**row, "accuracy": row["counted_accuracy"], "accuracy_low": row["counted_low"],
            "accuracy_high": row["counted_high"], "correct": row["counted_correct"], "cells": row["counted"],
            "nll_gap": row.get("kl"), "nll_gap_low": row.get("kl_low"), "nll_gap_high": row.get("kl_high"),
            "nll_gap_cases": row.get("kl_cases"), "gap_name": "KL"}


def _interval_traces(fig, go, group: list[dict], kind: str, row: int, legend: bool) -> None:
    name = kind if kind != "hf" else "HF full cache"
    symbols = [_symbol(r) for r in group]
    marker = {"color": KIND_COLORS[kind], "size": 9, "line": {"width": 1.5, "color": KIND_COLORS[kind]}}
    fig.add_trace(go.Scatter(
        x=[100 * r["accuracy"] for r in group], y=[r["label"] for r in group], error_x=_wilson_bars(group),
        mode="markers", marker={**marker, "symbol": symbols}, name=name, legendgroup=kind, showlegend=legend,
        text=[f"{r.get('correct', '?')}/{r['cells']}" for r in group],
        hovertemplate="%{y}<br>%{text} passkeys: %{x:.0f}%<extra></extra>"), row=row, col=1)
    gaps = [(r, s) for r, s in zip(group, symbols) if r.get("nll_gap") is not None]
    if gaps:
        fig.add_trace(go.Scatter(
            x=[r["nll_gap"] for r, _ in gaps], y=[r["label"] for r, _ in gaps],
            error_x={"type": "data", "thickness": 1.2, "width": 3,
                     "array": [r["nll_gap_high"] - r["nll_gap"] if r.get("nll_gap_high") is not None else 0
                               for r, _ in gaps]},
            mode="markers", marker={**marker, "symbol": [s for _, s in gaps]}, name=name, legendgroup=kind,
            showlegend=False, text=[f"{r.get('nll_gap_cases', 0)} cases" for r, _ in gaps],
            hovertemplate="%{y}<br>" + group[0].get("gap_name", "NLL gap") + " %{x:.3f} (%{text})<extra></extra>"),
            row=row, col=2)


def _ordered_labels(summary: dict) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in summary["rows"]))


def _empty(message: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, height=300)
    return fig


def write_plots(summary: dict, folder: str | Path) -> tuple[list[Path], list[str]]:
    """intervals, heatmaps and tradeoff as .html and .png; PNGs need kaleido and a Chromium (a
    notice, not an error, when they are missing)."""
    import plotly.io as pio

    folder = Path(folder)
    written, notices = [], []
    if os.path.exists("/usr/bin/chromium"):
        os.environ.setdefault("BROWSER_PATH", "/usr/bin/chromium")  # kaleido cannot download one offline
    plots = (("intervals", intervals_figure(summary), (1100, None)),
             ("heatmaps", heatmap_figure(summary), (1100, None)),
             ("tradeoff", tradeoff_figure(summary), (900, 480)))
    for name, fig, _ in plots:
        html = folder / f"{name}.html"
        fig.write_html(html, include_plotlyjs="cdn")  # small files; the page loads plotly.js
        written.append(html)
    pngs = [folder / f"{name}.png" for name, _, _ in plots]
    try:  # one Chromium for the three (kaleido starts one per write_image call)
        pio.write_images([fig for _, fig, _ in plots], pngs, width=[size[0] for _, _, size in plots],
                         height=[size[1] or fig.layout.height for _, fig, size in plots])
        written.extend(pngs)
    except Exception as err:  # kaleido or Chromium missing: HTML is still there
        notices.append(f"{', '.join(p.name for p in pngs)} not written ({type(err).__name__}: "
                       f"{str(err).splitlines()[0][:120]}); install kaleido and chromium (`make chromium`) for PNGs")
    return written, notices
