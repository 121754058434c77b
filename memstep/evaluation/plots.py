"""Figures of an evaluation summary (Plotly), and writing them as HTML and PNG.

Pure functions of the summary dict (``metrics.summarize``), shared by the CLI, which
writes them beside the results, and the app's Evaluate tab, which shows them. Plotly is
imported inside the functions: the rest of memstep never needs it.
"""

from __future__ import annotations

import os
from pathlib import Path

PEER_SYMBOLS = {"memstep": "circle", "kvpress": "diamond", "hf": "star"}
KIND_COLORS = {"memstep": "#1f77b4", "kvpress": "#d62728", "hf": "#2ca02c"}


def heatmap_figure(summary: dict, labels: list[str] | None = None, columns: int = 4):
    """Needle-in-a-haystack accuracy, depth (rows) x length (columns), one panel per configuration."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    maps = summary["heatmaps"]
    labels = [label for label in (labels or _ordered_labels(summary)) if label in maps]
    if not labels:
        return _empty("no passkey results yet")
    columns = max(1, min(columns, len(labels)))
    rows = -(-len(labels) // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=labels, horizontal_spacing=0.04,
                        vertical_spacing=min(0.12, 0.5 / rows))
    for i, label in enumerate(labels):
        data = maps[label]
        z = [[None if v is None else round(100 * v) for v in row] for row in data["accuracy"]]
        fig.add_trace(go.Heatmap(
            z=z, x=[f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in data["lengths"]],
            y=[f"{round(100 * d)}%" for d in data["depths"]], zmin=0, zmax=100, colorscale="Viridis",  # not red-green
            showscale=i == 0, colorbar={"title": "accuracy %"}, texttemplate="%{text}",
            text=[["" if v is None else str(v) for v in row] for row in z],  # not run: blank
            hovertemplate=f"{label}<br>length %{{x}}<br>depth %{{y}}<br>accuracy %{{z}}%<extra></extra>"),
            row=i // columns + 1, col=i % columns + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_annotations(font_size=11)
    fig.update_layout(title="Passkey accuracy: needle depth x haystack length", height=230 * rows + 80,
                      margin={"l": 40, "r": 20, "t": 70, "b": 30})
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
    slowest = max((r["seconds"] or 0 for r in rows), default=1) or 1
    fig = go.Figure()
    for kind in ("memstep", "kvpress", "hf"):
        group = [r for r in rows if r["config"]["kind"] == kind]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[r["peak_rss_bytes"] / 2**20 for r in group], y=[100 * r["accuracy"] for r in group],
            mode="markers+text", textposition="top center", textfont={"size": 10},  # labelled markers
            name=kind if kind != "hf" else "HF full cache",
            marker={"symbol": PEER_SYMBOLS[kind], "color": KIND_COLORS[kind], "opacity": 0.75,
                    "size": [10 + 30 * (r["seconds"] or 0) / slowest for r in group],
                    "line": {"width": 1, "color": "black"}},
            text=[r["label"] for r in group],
            customdata=[[r["seconds"] or 0, r["nll_gap"] if r["nll_gap"] is not None else float("nan")] for r in group],
            hovertemplate="%{text}<br>peak %{x:.0f} MiB<br>accuracy %{y:.0f}%<br>%{customdata[0]:.1f} s"
                          "<br>NLL gap %{customdata[1]:.3f}<extra></extra>"))
    fig.update_layout(title=f"Quality vs peak memory vs seconds at {length} tokens (marker size = seconds)",
                      xaxis_title="peak resident memory of the worker (MiB)", yaxis_title="passkey accuracy (%)",
                      yaxis_range=[-5, 105], height=480, margin={"l": 60, "r": 20, "t": 60, "b": 50})
    return fig


def _ordered_labels(summary: dict) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in summary["rows"]))


def _empty(message: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, height=300)
    return fig


def write_plots(summary: dict, folder: str | Path) -> tuple[list[Path], list[str]]:
    """heatmaps.html/.png and tradeoff.html/.png; PNGs need kaleido and a Chromium (a
    notice, not an error, when they are missing)."""
    folder = Path(folder)
    written, notices = [], []
    if os.path.exists("/usr/bin/chromium"):
        os.environ.setdefault("BROWSER_PATH", "/usr/bin/chromium")  # kaleido cannot download one offline
    for name, fig, size in (("heatmaps", heatmap_figure(summary), (1100, None)),
                            ("tradeoff", tradeoff_figure(summary), (900, 480))):
        html = folder / f"{name}.html"
        fig.write_html(html, include_plotlyjs="cdn")  # small files; the page loads plotly.js
        written.append(html)
        try:
            fig.write_image(folder / f"{name}.png", width=size[0], height=size[1] or fig.layout.height)
            written.append(folder / f"{name}.png")
        except Exception as err:  # kaleido or Chromium missing: HTML is still there
            notices.append(f"{name}.png not written ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                           "install kaleido and chromium (`make chromium`) for PNGs")
    return written, notices
