"""Plotly figures of a run: pure functions of a schedule and step records.

No Gradio, no torch: the app, the screenshot script and the tests call these with plain
data. Steps are shown 1-based (step 1 is the first chunk); records keep 0-based ``step``.
"""

from __future__ import annotations

import html
import math
import textwrap
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

from memstep.memory import PART_LABELS, PARTS, format_bytes
from memstep.records import StepRecord
from memstep.schedules import Schedule

from ui import legend
from ui.theme import AXIS_LINE, FONT, GRID, INK_SOFT, chart_template

MAX_COLUMNS = 2000  # retained-token map columns: long documents are binned to this many
MAX_CELLS = 400_000  # and runs with many steps to fewer, so one streamed update stays small
MAX_BARS = 60  # per-step charts: beyond this many steps, consecutive steps share one bar (a whole book: 153)
MAP_ROWS = 80  # retained-token map rows: a run with more steps shows a sample of them (every k-th and the latest)
MIB = 1024 ** 2
COLORS = {
    "memory": "#3b82f6",
    "chunk": legend.CHUNK_OUTLINE,
    "kept": "#1e3a8a",
    "budget": "#64748b",
    "peak": "#dc2626",
    "current": "rgba(250, 204, 21, 0.22)",
    "sinks": legend.SINKS_MARK,
    "passkey": legend.PASSKEY_MARK,
    "answer": legend.ANSWER_MARK,
    "measured": "#111827",
    "seconds": "#0d9488",
    "window": "#94a3b8",  # hybrid models: sliding layers (their window, not the schedule)
    "window_line": "#0f766e",
}
PART_COLORS = {
    "weights": "#cbd5e1",
    "kv_memory": "#3b82f6",
    "kv_chunk": "#f59e0b",
    "attention": "#8b5cf6",
    "activations": "#14b8a6",
}
SHORT_LABELS = {"weights": "weights", "kv_memory": "KV memory", "kv_chunk": "KV chunk",
                "attention": "attention + scorer", "activations": "activations"}
SERIES = ("#2563eb", "#ea580c", "#059669", "#9333ea", "#db2777")  # one colour per compared run
# Retained-token map: colours and their words live in ui/legend.py (one source for the map,
# its colour bar and legend, the text view, the help and the README).
EVICTED = legend.EVICTED_MAP
RETAINED_SCALE = legend.map_colorscale()
UNREAD = legend.UNREAD_FILL
UNREAD_HATCH = legend.UNREAD_HATCH


def _two_lines(text: str, limit: int) -> str:
    """A long title broken into lines (after a colon, at each " · ", else before a bracket),
    so narrow screens (phones) do not cut it off."""
    if len(text) <= limit or "<br>" in text:
        return text
    if ": " in text and not text.startswith("step"):
        head, rest = text.split(": ", 1)
        return f"{head}:<br>{rest}"
    if " · " in text:
        return text.replace(" · ", "<br>")
    head, sep, rest = text.partition(" (")
    if sep:
        return f"{head}<br>({rest}"
    head, sep, rest = text.partition(", ")
    return f"{head},<br>{rest}" if sep else text


# Extra height for a chart with a legend: the legend sits at the foot of the figure and wraps to
# several rows on a phone (390 px), and the plot area must stay readable there.
LEGEND_ROOM = 70


def _style(fig: go.Figure, title: str, height: int, xtitle: str, ytitle: str) -> go.Figure:
    title = _two_lines(title, 40)
    xtitle = _two_lines(xtitle, 30)
    fig.update_layout(
        template=chart_template(), height=height, font=FONT, hovermode="closest",
        # from the figure's left edge, not the plot's: a phone has no width to spare
        title=dict(text=title, x=0.0, xanchor="left", xref="container", y=1.0, yref="container", yanchor="top",
                   pad=dict(t=16, l=12),
                   font=dict(size=14)),
        margin=dict(l=64, r=24, t=76, b=56),
        # below the x-axis title, at the foot of the figure: a legend that wraps to several
        # rows on a phone then grows downwards (the margin makes room), never into the title
        legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", xref="container", x=0.0,
                    xanchor="left",
                    font=dict(size=11), bgcolor="rgba(255,255,255,0)"),
        paper_bgcolor="white", plot_bgcolor="white",
    )
    fig.update_xaxes(title=dict(text=xtitle, standoff=6), showline=True, linecolor=AXIS_LINE)
    fig.update_yaxes(title=dict(text=ytitle, standoff=6), showline=True, linecolor=AXIS_LINE,
                     gridcolor=GRID, zeroline=False)
    return fig


def step_dtick(steps: int) -> int:
    """The step between labelled ticks: a round number (1, 2, 5, 10, 20, 25, 50, ...) giving at
    most 16 labels, and at most 8 once they take three digits (a whole book's 153 steps on a
    third of a laptop, or a phone)."""
    most = 16 if steps < 100 else 8
    for scale in (1, 10, 100, 1000, 10_000):
        for base in (1, 2, 2.5, 5):
            tick = int(base * scale)
            if tick == base * scale and math.ceil(steps / tick) <= most:
                return tick
    return math.ceil(steps / most)


def _step_axis(fig: go.Figure, steps: int) -> None:
    """Integer step ticks 1..steps with the full range fixed, so streaming never rescales."""
    tick = step_dtick(steps)
    fig.update_xaxes(range=[0.5, steps + 0.5], tickmode="linear", tick0=1 if tick == 1 else 0, dtick=tick)


def _highlight_step(fig: go.Figure, current: int | None) -> None:
    if current is not None:
        fig.add_vrect(x0=current + 0.5, x1=current + 1.5, fillcolor=COLORS["current"],
                      line_width=0, layer="below")


def step_groups(count: int, steps: int, max_bars: int = MAX_BARS) -> list[tuple[int, int]]:
    """[first, end) indices of the consecutive steps each bar stands for: one step per bar up to
    ``max_bars`` steps, else ceil(steps / max_bars) per bar (the same groups while a run streams)."""
    width = max(1, math.ceil(steps / max_bars))
    return [(i, min(i + width, count)) for i in range(0, count, width)]


def _group_axis(groups: list[tuple[int, int]]) -> tuple[np.ndarray, list[str], float | None]:
    """Bar centres on the 1-based step axis, hover labels ("step 7" / "steps 7-9"), bar width."""
    wide = max((b - a for a, b in groups), default=1)
    if wide == 1:  # one step a bar: the plain step axis (no labels, so a short run draws as it always did)
        return np.array([a + 1 for a, _ in groups]), None, None
    centres = np.array([(a + 1 + b) / 2 for a, b in groups], dtype=float)
    labels = [f"step {a + 1}" if b - a == 1 else f"steps {a + 1}-{b}" for a, b in groups]
    return centres, labels, 0.75 * wide


def _labels(labels: list[str] | None) -> dict:
    """Bars of grouped steps carry their "steps 7-9" labels for the hover, never drawn on the bar."""
    return {"text": labels, "textposition": "none"} if labels else {}


def _per_group(values: np.ndarray, groups: list[tuple[int, int]], how=np.mean) -> np.ndarray:
    if all(b - a == 1 for a, b in groups):  # one step a bar: the values themselves
        return np.asarray(values)[[a for a, _ in groups]]
    return np.array([how(values[a:b]) for a, b in groups], dtype=float)


def placeholder_figure(message: str, title: str = "", height: int = 300, wrap: int = 40) -> go.Figure:
    """An empty figure with a centred hint (before a run, or when there is nothing to show), its lines
    at most ``wrap`` characters (narrower for a chart whose plot area leaves less room)."""
    fig = _style(go.Figure(), title, height, "", "")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    # long errors wrap instead of running off the chart; "<" in a message is text, not markup
    wrapped = "<br>".join(textwrap.wrap(html.escape(message, quote=False), wrap, break_long_words=False)) or message
    fig.add_annotation(text=wrapped, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=13, color=INK_SOFT))
    return fig


def schedule_figure(schedule: Schedule, sinks: int, done: int | None = None, current: int | None = None,
                    title: str | None = None, height: int = 320 + LEGEND_ROOM) -> go.Figure:
    """Chunk size and memory per step, from the schedule math alone.

    Bars stack the memory held before the step and the chunk read in it (together: what the
    step's attention holds); lines show the memory kept after the step and the budget. The
    peak of memory + chunk is marked. ``done`` steps are solid and later ones faded (None: a
    preview, all solid); ``current`` (0-based) is highlighted."""
    n = schedule.steps
    cache = schedule.cache_lengths(sinks)
    groups = step_groups(n, n)  # many steps: one bar per group of steps, each the group's mean
    x, labels, width = _group_axis(groups)
    whole_before = np.array([b for b, _ in cache])
    whole_chunks = np.array(schedule.chunk_sizes)
    held = whole_before + whole_chunks
    before, chunks = _per_group(whole_before, groups), _per_group(whole_chunks, groups)
    after = _per_group(np.array([a for _, a in cache]), groups)
    budgets = _per_group(np.array(schedule.memory_sizes) + sinks, groups)
    opacity = (np.ones(len(groups)) if done is None
               else np.array([1.0 if b <= done else 0.28 for _, b in groups]))
    custom = np.stack([before, chunks, before + chunks, after], axis=1).round().astype(int)
    mean = " (mean per step)" if width else ""
    step = "%{text}" if width else "step %{x}"
    hover = (f"<b>{step}</b>{mean}<br>memory before: %{{customdata[0]:,}}<br>chunk: %{{customdata[1]:,}}"
             "<br>memory + chunk: %{customdata[2]:,}<br>kept after: %{customdata[3]:,}<extra></extra>")

    fig = go.Figure()
    _highlight_step(fig, current)
    fig.add_bar(x=x, y=before, name="memory before the step", marker=dict(color=COLORS["memory"], opacity=opacity),
                customdata=custom, hovertemplate=hover, width=width, **_labels(labels))
    fig.add_bar(x=x, y=chunks, name="chunk", marker=dict(color=COLORS["chunk"], opacity=opacity),
                customdata=custom, hovertemplate=hover, width=width, **_labels(labels))
    fig.add_scatter(x=x, y=after, name="kept after the step", mode="lines+markers",
                    line=dict(color=COLORS["kept"], width=2), marker=dict(size=6 if not width else 4, opacity=opacity),
                    customdata=custom, hovertemplate=hover, **({"text": labels} if labels else {}))
    if schedule.name != "full":
        fig.add_scatter(x=x, y=budgets, name="budget + sinks", mode="lines",
                        line=dict(color=COLORS["budget"], width=1.5, dash="dot", shape="hvh"),
                        hoverinfo="skip")
    peak = int(np.argmax(held))
    right = peak + 1 > (n + 1) / 2 and n > 1  # keep the label inside the plot
    # two short lines: on a phone one long line ran off the right edge
    fig.add_annotation(x=peak + 1, y=held[peak], text=f"peak memory<br>+ chunk: {held[peak]:,}",
                       showarrow=True, arrowhead=2, arrowcolor=COLORS["peak"], ax=-30 if right else 30, ay=-24,
                       xanchor="right" if right else "left",
                       font=dict(color=COLORS["peak"], size=11), bgcolor="rgba(255,255,255,0.85)")
    growth = f", {schedule.growth} growth" if schedule.growth else ""
    title = title or f"Chunk and memory per step: {schedule.name.upper()}{growth}, {schedule.tokens:,} tokens"
    _style(fig, title, height, "step" + (f" (one bar: the mean of {groups[0][1]} steps)" if width else ""),
           "tokens (cache entries per layer)")
    fig.update_layout(barmode="stack", bargap=0.25)
    fig.update_yaxes(range=[0, held.max() * 1.18])
    _step_axis(fig, n)
    return fig


def bin_width(tokens: int, max_columns: int = MAX_COLUMNS, steps: int = 1) -> int:
    """Tokens per column of the retained-token map."""
    columns = max(200, min(max_columns, MAX_CELLS // max(steps, 1)))
    return max(1, math.ceil(tokens / columns))


def map_rows(steps: int, latest: int | None = None, current: int | None = None, most: int = MAP_ROWS) -> list[int]:
    """The steps (0-based) the retained-token map draws: all of them up to ``most``, else every
    k-th step, with the last step, the ``latest`` step run and the ``current`` one always among them."""
    if steps <= most:
        return list(range(steps))
    every = math.ceil(steps / most)
    rows = set(range(every - 1, steps, every)) | {s for s in (latest, current, steps - 1)
                                                   if s is not None and 0 <= s < steps}
    return sorted(rows)


def retained_matrix(records: Sequence[StepRecord], tokens: int, steps: int,
                    max_columns: int = MAX_COLUMNS, rows: Sequence[int] | None = None) -> tuple[np.ndarray, int]:
    """(steps, columns) fraction of layer-head slots keeping each position after each step,
    averaged over the positions of a column; NaN where nothing of the column was read yet.
    ``rows``: only these steps, in this order (a sample of a long run). Returns the matrix and
    the column width in tokens."""
    rows = list(range(steps)) if rows is None else list(rows)
    width = bin_width(tokens, max_columns, len(rows))
    columns = math.ceil(tokens / width)
    z = np.full((len(rows), columns), np.nan, dtype=np.float32)
    where = {step: i for i, step in enumerate(rows)}
    for record in records:
        if record.step not in where:
            continue
        row = np.full(columns * width, np.nan, dtype=np.float32)
        kept = record.global_kept_fraction()  # hybrid models: what the schedule kept (global layers)
        row[: len(kept)] = kept
        with warnings.catch_warnings():  # columns not read yet average to NaN on purpose
            warnings.simplefilter("ignore", category=RuntimeWarning)
            z[where[record.step]] = np.nanmean(row.reshape(columns, width), axis=1)
    return z, width


def _nth(k: int) -> str:
    return {1: "", 2: "second", 3: "third"}.get(k, f"{k}th")


def _row_edges(y: np.ndarray) -> np.ndarray:
    """Cell edges of heatmap rows centred on ``y`` (as Plotly draws them: halfway between centres)."""
    if len(y) == 1:
        return np.array([y[0] - 0.5, y[0] + 0.5])
    mids = (y[1:] + y[:-1]) / 2
    return np.concatenate([[y[0] - (mids[0] - y[0])], mids, [y[-1] + (y[-1] - mids[-1])]])


def _hatch_unread(fig: go.Figure, records: Sequence[StepRecord], tokens: int, rows: Sequence[int]) -> None:
    """The positions not read yet after each drawn step, as one hatched staircase polygon."""
    seen = {r.step: r.tokens_seen for r in records}
    edges = _row_edges(np.asarray(rows, dtype=float) + 1)
    xs, ys = [tokens - 0.5], [float(edges[0])]
    for i, row in enumerate(rows):
        edge = seen.get(row, 0) - 0.5
        xs += [edge, edge]
        ys += [float(edges[i]), float(edges[i + 1])]
    xs += [tokens - 0.5]
    ys += [float(edges[-1])]
    fig.add_trace(go.Scatter(x=xs, y=ys, fill="toself", mode="lines", line=dict(width=0), hoverinfo="skip",
                             fillcolor=UNREAD, showlegend=True, name=legend.LEGEND_NAMES["unread"],
                             fillpattern=dict(shape="/", fgcolor=UNREAD_HATCH, bgcolor=UNREAD, size=6, solidity=0.25)))


MARK_ROW_PX = 18  # one row of labels above the retained-token map


def _mark_rows(mids: list[float], span: float, gap: float = 0.2) -> list[int]:
    """A row for each label above the map (0 = nearest the map): labels closer than ``gap``
    of the axis to one already placed in a row go one row up, so no two labels overlap."""
    rows: list[list[float]] = []
    out = []
    for mid in mids:
        row = next((i for i, placed in enumerate(rows) if all(abs(mid - m) >= gap * span for m in placed)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append(mid)
        out.append(row)
    return out


def retained_map_figure(records: Sequence[StepRecord], tokens: int, steps: int, *, prefix_tokens: int = 0,
                        sinks: int = 0, needle: tuple[int, int] | None = None, current: int | None = None,
                        max_columns: int = MAX_COLUMNS, height: int = 340 + LEGEND_ROOM,
                        answers: Sequence[tuple[int, int]] = (), stopped_of: int | None = None,
                        words: Callable[[int, int], list[str]] | None = None, document: str = "document") -> go.Figure:
    """Which positions are in memory after each step: rows are steps (top to bottom), columns
    token positions (prompt head + document), colour the fraction of (layer, KV head) slots
    that keep the position. ``needle`` is the passkey's [start, end) in the same positions,
    ``answers`` where the full cache's answer appears. ``words(width, columns)`` gives each column's
    text (the page shows it under the pointer: layout.meta, read by the page's script).
    ``stopped_of``: the run was stopped after ``steps`` of this many steps, and ``tokens`` are
    the positions it read (the title says so). ``document``: the run's document, as the axis names
    it. Colours and words: ui/legend.py."""
    rows = map_rows(steps, records[-1].step if records else None, current)
    z, width = retained_matrix(records, tokens, steps, max_columns, rows)
    hybrid = bool(records and records[-1].layer_types)
    heads = "global layer-heads (sliding layers keep their window)" if hybrid else "layer-heads"
    x = np.arange(z.shape[1]) * width + (width - 1) / 2
    y = np.array(rows) + 1
    ticks, labels = zip(*legend.COLORBAR_TICKS)
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=y, zmin=0.0, zmax=1.0, colorscale=RETAINED_SCALE, hoverongaps=False, showlegend=False,
        colorbar=dict(title=dict(text=legend.COLORBAR_TITLE, side="top", font=dict(size=11)),
                      tickvals=list(ticks), ticktext=list(labels), thickness=12, len=0.9, x=1.0, xpad=6,
                      y=0.5, yref="paper", outlinewidth=1, outlinecolor=AXIS_LINE),  # (its navy end on a dark card)
        hovertemplate=("position %{x:,.0f}<br>after step %{y}<br>kept by %{z:.0%} of " + heads +
                       "<extra></extra>"),
    ))
    column = f"<br>one column = {width} tokens" if width > 1 else ""  # its own line: a phone is narrow
    sampled = len(rows) < steps
    what = "every " + _nth(math.ceil(steps / MAP_ROWS)) + " step" if sampled else "each step"
    stopped = f" · stopped at step {steps} of {stopped_of}" if stopped_of else ""
    _style(fig, f"Retained tokens: what memory holds after {what}" + (" (global layers)" if hybrid else "") + stopped,
           height, f"token position (prompt head + {document}){column}", "after step")  # the title says when sampled
    _hatch_unread(fig, records, tokens, rows)
    # the two states the colour bar cannot show, in the legend at the foot
    fig.add_scatter(x=[None], y=[None], mode="markers", name=legend.LEGEND_NAMES["evicted"], hoverinfo="skip",
                    marker=dict(symbol="square", size=12, color=EVICTED, line=dict(width=0)))
    edges = _row_edges(y.astype(float))  # the first step at the top, no row past the last step
    fig.update_yaxes(range=[float(edges[-1]), float(edges[0])], tickmode="linear", tick0=1,
                     dtick=max(1, math.ceil(steps / 12)), showgrid=False)
    fig.update_xaxes(range=[-0.5, tokens - 0.5], showgrid=False)
    if current is not None and current < len(records):
        record = next(r for r in records if r.step == current)
        fig.add_shape(type="rect", x0=record.chunk_start - 0.5, x1=record.tokens_seen - 0.5,
                      y0=current + 0.5, y1=current + 1.5, line=dict(color=COLORS["chunk"], width=2))
    # Marks in a strip above the map, at least a few pixels wide however long the document;
    # their labels take another row where they would meet.
    least = tokens * 0.004
    marks = [("sinks", 0, sinks, COLORS["sinks"])] if sinks else []
    if needle is not None:
        marks.append(("passkey", needle[0], needle[1], COLORS["passkey"]))
    for start, end in answers:
        if needle is None or not (start < needle[1] and end > needle[0]):  # the passkey's tick says it already
            marks.append(("answer", start, end, COLORS["answer"]))
    mids = [max((start + end) / 2, least * 3) if label == "sinks" else (start + end) / 2
            for label, start, end, _ in marks]
    rows = _mark_rows(mids, tokens)
    for (label, start, end, color), mid, row in zip(marks, mids, rows):
        centre = (start + end) / 2
        x0, x1 = min(start - 0.5, centre - least / 2), max(end - 0.5, centre + least / 2)
        fig.add_shape(type="rect", x0=x0, x1=x1, xref="x", yref="paper", ysizemode="pixel", yanchor=1.0,
                      y0=1, y1=7, fillcolor=color, line_width=0)
        fig.add_annotation(x=mid, y=1.0, xref="x", yref="paper", text=label, showarrow=False, yanchor="bottom",
                           yshift=8 + MARK_ROW_PX * row, font=dict(size=11, color=color))
        if label in ("passkey", "answer"):
            fig.add_vline(x=centre, line=dict(color=color, width=1, dash="dot"))
    rows_used = max(rows, default=-1) + 1
    fig.update_layout(plot_bgcolor=UNREAD, margin=dict(r=12, t=100 + MARK_ROW_PX * max(0, rows_used - 1)))
    if words is not None:
        fig.update_layout(meta=dict(words=words(width, z.shape[1]), width=width, prefix=prefix_tokens))
    return fig


def memory_figure(records: Sequence[StepRecord], steps: int, include_weights: bool = False,
                  height: int = 300 + LEGEND_ROOM) -> go.Figure:
    """Peak bytes per step: modeled always (stacked by component), measured where the
    device can measure it (a line). Without ``include_weights`` the constant weights are
    left out of the bars and subtracted from the measured peak, so the parts that change
    with the schedule stay readable."""
    if not records:
        return placeholder_figure("Run to see memory per step", "Memory per step", height)
    weights = records[0].bytes_modeled_parts.get("weights", 0)
    groups = step_groups(len(records), steps)
    x, labels, width = _group_axis(groups)
    # a bar per group of steps: the step of the group with the highest modeled peak, stacked by part
    records = [max(records[a:b], key=lambda r: r.bytes_modeled) for a, b in groups]
    fig = go.Figure()
    _highlight_step(fig, records[-1].step if groups[-1][1] < steps else None)
    for part in PARTS:
        if part == "weights" and not include_weights:
            continue
        values = [r.bytes_modeled_parts.get(part, 0) / MIB for r in records]
        fig.add_bar(x=x, y=values, name=SHORT_LABELS[part], marker_color=PART_COLORS[part], width=width,
                    hovertemplate=f"{'%{text} (the highest)' if width else 'step %{x}'}<br>"
                                  f"{PART_LABELS[part]} (modeled): %{{y:,.1f}} MiB<extra></extra>", **_labels(labels))
    measured = [r.bytes_measured for r in records]
    shift = 0 if include_weights else weights
    measured_any = any(m is not None for m in measured)
    if measured_any:
        fig.add_scatter(x=x, y=[None if m is None else (m - shift) / MIB for m in measured],
                        name="measured" + ("" if include_weights else " − weights"),
                        mode="lines+markers", line=dict(color=COLORS["measured"], width=2),
                        marker=dict(symbol="diamond", size=7),
                        hovertemplate="step %{x}<br>measured device peak: %{y:,.1f} MiB<extra></extra>")
    note = ["step" + (f" (one bar: the highest of {groups[0][1]} steps)" if width else ""),
            "bars modeled, line measured" if measured_any else "modeled (measured: n/a, no CPU counter)"]
    if not include_weights:
        note.append(f"weights ({format_bytes(weights)}) not drawn")
    _style(fig, "Memory per step (peak during the step)", height, " · ".join(note),
           "MiB" if include_weights else "MiB above the weights")
    fig.update_layout(barmode="stack", bargap=0.25, margin=dict(t=84))
    fig.update_xaxes(title=dict(font=dict(size=11, color=INK_SOFT)))
    fig.update_layout(margin=dict(b=84))  # three lines of axis notes
    _step_axis(fig, steps)
    return fig


def seconds_figure(records: Sequence[StepRecord], steps: int, height: int = 300 + LEGEND_ROOM,
                   cpu: Sequence[float] | None = None, note: str | None = None) -> go.Figure:
    """Wall-clock seconds of each step's forward pass (and its eviction), and where measured the
    CPU seconds this process spent on it; ``note`` (a shared machine's load) under the axis."""
    if not records:
        return placeholder_figure("Run to see seconds per step", "Seconds per step", height)
    seconds = [r.seconds for r in records]
    groups = step_groups(len(records), steps)
    x, labels, width = _group_axis(groups)
    # a bar per group of steps: the mean seconds per step of the group
    chunk = _per_group(np.array([r.chunk_size for r in records]), groups)
    memory = _per_group(np.array([r.memory_before for r in records]), groups)
    wall = _per_group(np.array(seconds), groups)
    speed = np.where(wall > 0, chunk / np.maximum(wall, 1e-12), 0.0)
    fig = go.Figure()
    _highlight_step(fig, records[-1].step if len(records) < steps else None)
    per = " per step (mean)" if width else ""
    fig.add_bar(x=x, y=wall, marker_color=COLORS["seconds"], name="wall seconds", width=width, **_labels(labels),
                customdata=np.stack([chunk.round(), memory.round(), speed], axis=1),
                hovertemplate=(f"{'%{text}' if width else 'step %{x}'}: %{{y:.2f}} s wall{per}<br>chunk %{{customdata[0]:,}} tokens with memory "
                               "%{customdata[1]:,}<br>%{customdata[2]:,.0f} tokens/s<extra></extra>"))
    total = f"{sum(seconds):.1f} s wall"
    if cpu:
        cpu_groups = step_groups(len(cpu), steps)
        fig.add_scatter(x=x[: len(cpu_groups)], y=_per_group(np.array(cpu, dtype=float), cpu_groups), mode="markers",
                        name="CPU seconds (this process)", **({"text": labels[: len(cpu_groups)]} if labels else {}),
                        marker=dict(symbol="diamond", size=9 if not width else 6, color=COLORS["measured"]),
                        hovertemplate=f"{'%{text}' if width else 'step %{x}'}: %{{y:.2f}} CPU s{per}<extra></extra>")
        total += f", {sum(cpu):.1f} s CPU"
    # the note wraps: the chart is a third of a laptop's width and all of a phone's
    xtitle = ("step" + (f" (one bar: the mean of {groups[0][1]} steps)" if width else "")
              + ("<br>" + "<br>".join(textwrap.wrap(note, 38)) if note else ""))
    _style(fig, f"Seconds per step · {total}", height, xtitle, "seconds")
    fig.update_layout(showlegend=bool(cpu), bargap=0.25)
    if note:
        fig.update_xaxes(title=dict(font=dict(size=11, color=INK_SOFT)))
        fig.update_layout(margin=dict(b=64 + 14 * xtitle.count("<br>")), height=height + 14 * xtitle.count("<br>"))
    _step_axis(fig, steps)
    return fig


def _over_document(records: Sequence[StepRecord], values: Sequence[float | None]) -> tuple[list, list]:
    """A step function over document positions: each step's value spans its chunk."""
    xs, ys = [], []
    for record, value in zip(records, values):
        xs += [record.chunk_start, record.tokens_seen]
        ys += [value, value]
    return xs, ys


def _compare_style(fig: go.Figure, title: str, height: int, xtitle: str, ytitle: str) -> go.Figure:
    _style(fig, title, height, xtitle, ytitle)
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return fig


def compare_sizes_figure(runs: Sequence[tuple[str, Sequence[StepRecord]]],
                         height: int = 400 + LEGEND_ROOM) -> go.Figure:
    """Compared runs overlaid along the document: over each step's chunk, the memory +
    chunk the step holds (solid) and the memory kept after it (dotted), one colour per run."""
    if not any(records for _, records in runs):
        return placeholder_figure("Run a comparison to see the schedules overlaid", "Chunk and memory per step",
                                  height)
    fig = go.Figure()
    for i, (label, records) in enumerate(runs):
        color = SERIES[i % len(SERIES)]
        x, y = _over_document(records, [r.memory_before + r.chunk_size for r in records])
        fig.add_scatter(x=x, y=y, mode="lines", name=f"{label}: memory + chunk", line=dict(color=color, width=2.5),
                        hovertemplate=f"{label}<br>position %{{x:,}}<br>memory + chunk %{{y:,}}<extra></extra>")
        x, y = _over_document(records, [r.memory_after for r in records])
        fig.add_scatter(x=x, y=y, mode="lines", name=f"{label}: kept after",
                        line=dict(color=color, width=1.5, dash="dot"),
                        hovertemplate=f"{label}<br>position %{{x:,}}<br>kept after the step %{{y:,}}<extra></extra>")
    return _compare_style(fig, "Chunk and memory per step, along the document", height,
                          "document position of the step's chunk (tokens)", "tokens (cache entries per layer)")


def compare_memory_figure(runs: Sequence[tuple[str, Sequence[StepRecord]]],
                          height: int = 400 + LEGEND_ROOM) -> go.Figure:
    """Compared runs' peak bytes per step above the weights, along the document: modeled
    (solid), measured where the device can measure it (dashed)."""
    if not any(records for _, records in runs):
        return placeholder_figure("Run a comparison to see memory per step", "Memory per step", height)
    fig = go.Figure()
    measured_any = False
    for i, (label, records) in enumerate(runs):
        if not records:
            continue
        color = SERIES[i % len(SERIES)]
        weights = records[0].bytes_modeled_parts.get("weights", 0)
        x, y = _over_document(records, [(r.bytes_modeled - weights) / MIB for r in records])
        fig.add_scatter(x=x, y=y, mode="lines", name=f"{label}: modeled", line=dict(color=color, width=2.5),
                        hovertemplate=f"{label}<br>position %{{x:,}}<br>modeled %{{y:,.1f}} MiB<extra></extra>")
        if any(r.bytes_measured is not None for r in records):
            measured_any = True
            x, y = _over_document(records, [None if r.bytes_measured is None else (r.bytes_measured - weights) / MIB
                                            for r in records])
            fig.add_scatter(x=x, y=y, mode="lines", name=f"{label}: measured",
                            line=dict(color=color, width=1.5, dash="dash"),
                            hovertemplate=f"{label}<br>position %{{x:,}}<br>measured %{{y:,.1f}} MiB<extra></extra>")
    note = "solid modeled, dashed measured" if measured_any else "modeled; measured n/a on CPU"
    return _compare_style(fig, f"Memory per step above the weights ({note})", height,
                          "document position of the step's chunk (tokens)", "MiB above the weights")


KEPT_ROW_PX = 56  # one compared run's strip on the kept-token chart (its two-line title above it)
KEPT_TOP_PX = 150  # the chart's title, then its colour bar, above the first strip's title


def compare_kept_figure(runs: Sequence[tuple[str, Sequence[StepRecord], str]], tokens: int, *,
                        answer: tuple[int, int] | None = None, answer_label: str = "true answer",
                        needle: tuple[int, int] | None = None) -> go.Figure:
    """What each compared memory keeps at its end, one strip per run on one token axis: the
    fraction of (layer, KV head) slots keeping each position after the run's last step (so far,
    while it streams; the plot's grey where it has not read yet), the true answer's position (or
    the passkey's) dotted across every strip. ``runs``: (label, records, note), the note (memory
    and time) on the strip's second title line. Colours and words: ui/legend.py, as the Run tab's
    map; the colour bar lies flat under the title, so a phone keeps the strips' width."""
    from plotly.subplots import make_subplots

    title = "What each memory keeps at the end, on one token axis"
    if not runs or not any(records for _, records, _ in runs):
        return placeholder_figure("Run a comparison to see what each memory keeps", title, 300, wrap=24)
    n = len(runs)
    width = bin_width(tokens, MAX_COLUMNS, n)
    columns = math.ceil(tokens / width)
    x = np.arange(columns) * width + (width - 1) / 2
    plot_px = n * KEPT_ROW_PX + (n - 1) * 40  # the strips and the titles between them
    height = KEPT_TOP_PX + plot_px + 100
    titles = [f"<b>{html.escape(label)}</b><br>{html.escape(note)}" for label, _, note in runs]
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=40 / plot_px if n > 1 else 0.0,
                        subplot_titles=titles)
    ticks, labels = zip(*legend.COLORBAR_TICKS)
    for i, (label, records, _) in enumerate(runs, start=1):
        z = np.full((1, columns), np.nan, dtype=np.float32)
        if records:
            last = records[-1]
            kept, _ = retained_matrix([last], columns * width, 1, columns, rows=[last.step])
            z[:, : min(columns, kept.shape[1])] = kept[:, :columns]
        fig.add_heatmap(z=z, x=x, y=[label], coloraxis="coloraxis", hoverongaps=False, row=i, col=1,
                        hovertemplate=f"{html.escape(label)}<br>position %{{x:,.0f}}<br>kept by %{{z:.0%}} of the "
                                      "layer-heads<extra></extra>")
        fig.update_yaxes(showticklabels=False, ticks="", showgrid=False, row=i, col=1)
    column = f"<br>one column = {width} tokens" if width > 1 else ""
    _style(fig, title, height, "", "")
    fig.update_xaxes(title_text="", range=[-0.5, tokens - 0.5], showgrid=False)
    fig.update_xaxes(title=dict(text=f"token position (prompt head + document){column}", standoff=6), row=n, col=1)
    fig.update_layout(
        coloraxis=dict(colorscale=RETAINED_SCALE, cmin=0.0, cmax=1.0,
                       colorbar=dict(title=dict(text=legend.COLORBAR_TITLE.replace("<br>", " ") + "<br> ", side="top",
                                                font=dict(size=11)),
                                     tickvals=list(ticks), ticktext=list(labels), orientation="h", thickness=10,
                                     len=200, lenmode="pixels", x=0.0, xanchor="left", xref="container", xpad=12,
                                     y=1 - 60 / height, yref="container", yanchor="top", ypad=0,
                                     outlinewidth=1, outlinecolor=AXIS_LINE)),
        plot_bgcolor=UNREAD, margin=dict(t=KEPT_TOP_PX, r=12, l=12, b=100), showlegend=True)
    for annotation in fig.layout.annotations:  # the strips' titles: left-aligned, small, in two lines
        annotation.update(x=0.0, xanchor="left", font=dict(size=11, color=INK_SOFT), align="left")
    # orange (evicted everywhere) lies below the colour bar's "one": named in the legend, as on the map
    fig.add_scatter(x=[None], y=[None], mode="markers", name=legend.LEGEND_NAMES["evicted"], hoverinfo="skip",
                    marker=dict(symbol="square", size=12, color=EVICTED, line=dict(width=0)), row=1, col=1)
    marks = [("passkey", needle, COLORS["passkey"])] if needle is not None else []
    if answer is not None and (needle is None or not (answer[0] < needle[1] and answer[1] > needle[0])):
        marks.append((answer_label, answer, COLORS["answer"]))
    for name, (start, end), color in marks:  # a dotted line through every strip, named in the legend
        centre = (start + end - 1) / 2
        fig.add_vline(x=centre, line=dict(color=color, width=2, dash="dot"), row="all", col=1)
        fig.add_scatter(x=[None], y=[None], mode="lines", name=f"{name} (tokens {start:,}-{end - 1:,})",
                        line=dict(color=color, width=1.5, dash="dot"), hoverinfo="skip", row=1, col=1)
    return fig


def layer_memory_figure(record: StepRecord | None, sinks: int, height: int = 260) -> go.Figure:
    """Entries each layer holds after ``record``'s step, against its budget (layer-wise
    growths keep a different number of entries per layer). Hybrid models: global layers
    against budget + sinks, sliding layers apart against their window."""
    title = "Memory per layer" + (f" after step {record.step + 1}" if record is not None else "")
    if record is None:
        return placeholder_figure("Memory per layer appears after the first step", title, height)
    entries = np.array(record.layer_entries)
    layers = np.arange(1, len(entries) + 1)
    budgets = np.array(record.layer_budgets or [record.memory_budget] * len(entries)) + sinks
    kinds = np.array(record.layer_types or ["global"] * len(entries))
    if record.layer_types:  # two more legend rows
        height += 40
    fig = _style(go.Figure(), title, height, "layer", "cache entries" if record.layer_types
                 else "cache entries (sinks included)")
    glob, slide = kinds == "global", kinds == "sliding"
    fig.add_bar(x=layers[glob], y=entries[glob], name="global layers: kept after the step" if slide.any()
                else "kept after the step", marker=dict(color=COLORS["memory"]),
                hovertemplate="layer %{x} (global): %{y:,} entries<extra></extra>" if slide.any()
                else "layer %{x}: %{y:,} entries<extra></extra>")
    fig.add_scatter(x=layers[glob], y=budgets[glob], name="budget + sinks", mode="markers",
                    marker=dict(symbol="line-ew-open", size=14, color=COLORS["budget"], line=dict(width=2)),
                    hovertemplate="layer %{x}: budget %{y:,}<extra></extra>")
    if slide.any():  # a sliding layer's budget is its window: it keeps window - 1 earlier tokens
        window = int(budgets[slide][0] - sinks)
        fig.add_bar(x=layers[slide], y=entries[slide], name="sliding layers: the window's earlier tokens",
                    marker=dict(color=COLORS["window"]),
                    hovertemplate="layer %{x} (sliding): %{y:,} entries<extra></extra>")
        fig.add_scatter(x=layers[slide], y=[window] * int(slide.sum()), name=f"window ({window:,} tokens)",
                        mode="markers", marker=dict(symbol="line-ew-open", size=14, color=COLORS["window_line"],
                                                    line=dict(width=2)),
                        hovertemplate="layer %{x}: window %{y:,} tokens<extra></extra>")
    fig.update_xaxes(tickmode="linear", tick0=1, dtick=max(1, math.ceil(len(entries) / 15)))
    return fig
