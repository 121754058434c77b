"""The page's ink: the few neutral colours every chart and note is drawn with, in light
mode, and what each becomes in dark mode.

Charts are drawn on the server in the light colours. In dark mode the page's CSS repaints
exactly these colours (Plotly writes them inline as ``fill: rgb(r, g, b)``), so every chart
of every tab follows the theme without knowing it, and a chart saved as PNG (drawn again
from its layout) stays light, ready for a paper or a slide. Coloured marks (blue, orange,
red) keep their colours in both modes.
"""

from __future__ import annotations

from functools import lru_cache

FONT_FAMILY = "Inter, 'Segoe UI', system-ui, sans-serif"
INK = "#1f2937"  # chart text
INK_SOFT = "#4b5563"  # notes, axis notes
INK_FAINT = "#6b7280"  # captions
GRID = "#eef0f3"
AXIS_LINE = "#9ca3af"
PAPER = "#ffffff"
PLOTLY_TEMPLATE_INK = "#2a3f5f"  # plotly_white's own text colour (charts that set none)
PLOTLY_TEMPLATE_GRID = "#ebf0f8"
FONT = dict(family=FONT_FAMILY, size=12, color=INK)

# light colour -> its dark-mode counterpart (text fills, strokes, backgrounds)
DARK = {
    INK: "#e5e7eb",
    INK_SOFT: "#cbd5e1",
    INK_FAINT: "#a3aab5",
    "#111827": "#f3f4f6",
    "#374151": "#d1d5db",
    PLOTLY_TEMPLATE_INK: "#e5e7eb",
    "#000000": "#e5e7eb",
    # coloured words on a chart (the peak's note, the marks' names): lighter shades of their colours
    "#dc2626": "#f87171",
    "#c2410c": "#fb923c",
    "#059669": "#34d399",
}
DARK_STROKES = {GRID: "#334155", PLOTLY_TEMPLATE_GRID: "#334155", AXIS_LINE: "#64748b", "#e5e7eb": "#475569"}
# dark lines and markers (the kept-memory line, the measured peak) become light ones
DARK_MARKS = {"#1e3a8a": "#93c5fd", "#111827": "#e5e7eb"}
DARK_BACKGROUND = "#0b0f19"  # Gradio's dark body background


# The trace types the app draws: the chart template keeps plotly_white's defaults for these only
CHART_TRACES = ("bar", "scatter", "heatmap")
UNUSED_SUBPLOTS = ("polar", "ternary", "scene", "geo", "mapbox", "map")


@lru_cache(maxsize=1)
def chart_template():
    """plotly_white cut to what the app's charts draw (cartesian axes; bars, lines, heatmaps):
    the same look, a third of its size. Plotly checks a template each time a figure takes it,
    so every streamed update paid for plotly_white's polar, 3-D and map defaults, and sent them
    to the browser."""
    import plotly.graph_objects as go
    import plotly.io as pio

    white = pio.templates["plotly_white"]
    layout = {k: v for k, v in white.layout.to_plotly_json().items() if k not in UNUSED_SUBPLOTS}
    data = {k: v for k, v in white.data.to_plotly_json().items() if k in CHART_TRACES}
    return go.layout.Template(layout=layout, data=data)


def _rgb(color: str) -> str:
    """'#1f2937' as Plotly writes it inline: 'rgb(31, 41, 55)'."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def dark_css() -> str:
    """CSS that repaints the charts' ink in dark mode (Gradio sets the class ``dark``)."""
    plot = ".dark .js-plotly-plot"
    rules = [f"{plot} .main-svg {{ background: transparent !important; }}",
             # the paper and plot backgrounds, legend and annotation boxes drawn white
             f"{plot} rect[style*='fill: {_rgb(PAPER)}'] {{ fill: transparent !important; }}",
             f"{plot} .bg[style*='fill: rgba(255, 255, 255'] {{ fill: transparent !important; }}",
             f"{plot} .hovertext rect {{ fill: #1f2937 !important; }}",
             f"{plot} .hovertext text {{ fill: #f3f4f6 !important; }}",
             # Plotly's toolbar: no white bar over the chart, light icons
             f"{plot} .modebar, {plot} .modebar-group {{ background: transparent !important; }}",
             f"{plot} .modebar-btn path {{ fill: #cbd5e1 !important; }}",
             # the document's text view: a dark page; its shades carry their own text colours
             ".dark .memstep-paper { background: #111827 !important; color: #e5e7eb !important; "
             "border-color: #374151 !important; }",
             ".dark .memstep-retained [style*='color:#6b7280'] { color: #a3aab5 !important; }"]
    for light, dark in DARK.items():
        rules.append(f"{plot} text[style*='fill: {_rgb(light)}'], {plot} tspan[style*='fill: {_rgb(light)}'] "
                     f"{{ fill: {dark} !important; }}")
    for light, dark in DARK_STROKES.items():
        rules.append(f"{plot} path[style*='stroke: {_rgb(light)}'] {{ stroke: {dark} !important; }}")
    for light, dark in DARK_MARKS.items():
        rules.append(f"{plot} path[style*='stroke: {_rgb(light)}'] {{ stroke: {dark} !important; }}")
        rules.append(f"{plot} path.point[style*='fill: {_rgb(light)}'], {plot} .legendpoints path[style*='fill: "
                     f"{_rgb(light)}'] {{ fill: {dark} !important; }}")
    return "\n".join(rules) + "\n"
