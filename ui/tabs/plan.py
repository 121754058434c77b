"""The Plan tab: predicted peak memory and time of schedules for real models and GPUs.

Figures and the table are pure functions of planner.Plan objects (tested without a
browser); ``build_tab`` wires them into Gradio inside an open ``gr.Tab("Plan")``.
Planning is arithmetic (memstep.planner), so every change replans at once.
"""

from __future__ import annotations

import math

import gradio as gr
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from memstep import planner
from memstep.errors import MemstepError
from memstep.memory import ATTENTIONS, PART_LABELS, PARTS
from memstep.presets import ROPE_MODES
from memstep.schedules import GROWTHS, MAX_SIZE_TOKENS

from ui.inputs import whole_number
from ui.theme import AXIS_LINE, FONT, GRID, INK_FAINT, chart_template

GIB = 1 << 30
MAX_BARS = 300  # more steps than this are drawn as stacked areas over sampled steps
MAX_POINTS = 1200  # sampled steps per schedule for long schedules (each bin keeps its peak step)
SHARED_SCALE_RATIO = 4.0  # side-by-side panels share a y axis unless one peak dwarfs another
LIMIT_SHOWN_ABOVE = 2.0  # the GPU limit line is drawn when it is at most this far above the bars
NOTE_SHIFT_PX = -56  # notes under the plots, below the x-axis titles (pixels: any height)
NOTE_LEFT_PX = -52  # from near the figure's left edge, not the plot's: a phone has no width to spare
NOTE_WIDTH = 46  # characters per line of a note: a phone's width
TITLE_ROOM = 136  # the figure's title and the panels' three-line titles above the plots
FOOT_ROOM = 196  # x-axis titles, the note (up to three lines) and the legend (wrapping on a phone) below
PART_COLORS = {"weights": "#cbd5e1", "kv_memory": "#3b82f6", "kv_chunk": "#f59e0b", "attention": "#8b5cf6",
               "activations": "#14b8a6"}
TIME_COLORS = {"linear": "#0d9488", "attention": "#8b5cf6", "scorer": "#ec4899", "overhead": "#94a3b8"}
LIMIT_COLOR = "#dc2626"
PLAN_CONCURRENCY = 2  # plans computed at once (each is bounded by memstep.schedules.MAX_STEPS)
SCHEDULE_LABELS = {"fm": "FM", "im": "IM", "imdc": "IMDC", "full": "full"}
TABLE_HEADERS = ["schedule", "steps", "peak", "KV peak", "fits", "time", "TFLOP", "peak vs FM", "time vs FM",
                 "peak vs full", "time vs full", "longest context that fits"]
TABLE_WIDTHS = ["11%", "5%", "9%", "9%", "5%", "7%", "7%", "7%", "7%", "7%", "7%", "19%"]
DEFAULTS = dict(model="llama-2-7b", gpu="a100-80gb", dtype="bf16", tokens=32768, chunk=1024, memory=1024,
                growth="linear", attention="sdpa", sinks=4, schedules=["fm", "imdc", "full"], weights="dtype")
WEIGHT_CHOICES = [("as dtype", "dtype"), ("int8", "int8"), ("int4", "int4")]
WEIGHTS_INFO = ("int8/int4: the weights' bytes only (1 or ½ byte per parameter, scales not counted); the KV cache, "
                "activations and time stay at the dtype")


# ---- pure figure and table builders ----------------------------------------------------------
def sampled_steps(plan: planner.Plan, max_points: int = MAX_POINTS) -> list[int]:
    """Indices of the steps to draw: all of them, or per bin the step with the largest peak."""
    n = len(plan.steps)
    if n <= max_points:
        return list(range(n))
    width = math.ceil(n / max_points)
    return [max(range(start, min(start + width, n)), key=lambda i: plan.steps[i].peak_bytes)
            for start in range(0, n, width)]


def scale_groups(peaks: list[float], ratio: float = SHARED_SCALE_RATIO) -> list[int]:
    """For each panel, the index of the panel whose y axis it shares: panels whose peaks lie
    within ``ratio`` of each other share one scale, so a full prefill with a peak many times
    larger gets its own instead of flattening the compressed schedules."""
    order = sorted(range(len(peaks)), key=lambda i: peaks[i])
    group = [0] * len(peaks)
    lead = None
    for i in order:
        if lead is None or peaks[i] > ratio * max(peaks[lead], 1e-12):
            lead = i
        group[i] = lead
    return group


def _panels(plans: dict[str, planner.Plan], peaks: list[float], titles: list[str], ytitle: str, title: str,
            height: int) -> tuple[go.Figure, list[int]]:
    groups = scale_groups(peaks)
    fig = make_subplots(rows=1, cols=len(plans), horizontal_spacing=0.06, subplot_titles=titles)
    for col, lead in enumerate(groups, start=1):
        if lead + 1 != col:
            fig.update_yaxes(matches=f"y{'' if lead == 0 else lead + 1}", row=1, col=col)
    own = [SCHEDULE_LABELS.get(name, name) for i, name in enumerate(plans) if groups.count(groups[i]) == 1]
    scale = f" ({', '.join(own)} on {'its' if len(own) == 1 else 'their'} own scale)" if len(set(groups)) > 1 else ""
    fig.update_layout(template=chart_template(), height=height, font=FONT, barmode="stack", bargap=0.15,
                      # the title at the top; the legend at the foot, under the note, where it may wrap to
                      # several rows on a phone without covering the panels' titles
                      title=dict(text=title + ("<br>" + scale.strip() if scale else ""), x=0.0, xanchor="left", xref="container",
                                 y=1.0, yanchor="top", yref="container", pad=dict(t=12, l=12), font=dict(size=14)),
                      margin=dict(l=64, r=24, t=TITLE_ROOM, b=FOOT_ROOM), hovermode="closest",
                      legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.0, xref="container",
                                  xanchor="left", x=0.0, font=dict(size=11)))
    fig.update_xaxes(title_text="step", showline=True, linecolor=AXIS_LINE)
    fig.update_yaxes(showline=True, linecolor=AXIS_LINE, gridcolor=GRID, zeroline=False, rangemode="tozero")
    fig.update_yaxes(title_text=ytitle, row=1, col=1)
    # the panels' titles clear of the top y tick labels, which a phone's narrow panels bring close
    fig.update_annotations(font=dict(size=12), yshift=10)
    return fig, groups


def _wrap(text: str, width: int) -> str:
    """Plain text broken into lines of about ``width`` characters (<br>): the chart is built
    without knowing the screen, and a phone has 390 px."""
    import textwrap

    return "<br>".join(textwrap.wrap(text, width, break_long_words=False)) or text


def _note(fig: go.Figure, text: str, color: str = INK_FAINT) -> None:
    """A note under the panels, below the x-axis titles."""
    fig.add_annotation(text=_wrap(text, NOTE_WIDTH), x=0, y=0, xref="paper", yref="paper", xanchor="left",
                       yanchor="top", yshift=NOTE_SHIFT_PX, xshift=NOTE_LEFT_PX, align="left", showarrow=False,
                       font=dict(size=11, color=color))


def _title(name: str, plan: planner.Plan, detail: str) -> str:
    growth = f" ({plan.schedule.growth})" if plan.schedule.growth else ""
    steps = plan.schedule.steps
    # one fact per line: side-by-side panels on a phone are ~100 px wide
    return f"<b>{SCHEDULE_LABELS.get(name, name)}{growth}</b><br>{steps:,} step{'s' * (steps != 1)}<br>{detail}"


def _add_stack(fig: go.Figure, col: int, x: list[int], series: dict[str, list[float]], labels: dict[str, str],
               colors: dict[str, str], unit: str, bars: bool, first: bool) -> None:
    for part, values in series.items():
        common = dict(name=labels[part], legendgroup=part, showlegend=first, marker_color=colors[part],
                      hovertemplate=f"step %{{x:,}}<br>{labels[part]}: %{{y:,.3f}} {unit}<extra></extra>")
        if bars:
            fig.add_trace(go.Bar(x=x, y=values, **common), row=1, col=col)
        else:
            fig.add_trace(go.Scatter(x=x, y=values, mode="lines", stackgroup=f"panel{col}",
                                     line=dict(width=0.5, color=colors[part], shape="hv"), **common),
                          row=1, col=col)


def plan_memory_figure(plans: dict[str, planner.Plan], include_weights: bool = False, height: int = 560) -> go.Figure:
    """Per-step modeled peak memory stacked by component, one panel per schedule, with the
    GPU's usable memory (less the weights when they are not drawn) as a red line when it is
    near the bars. The weights are the same for every schedule and usually dwarf the rest,
    so by default they are left out."""
    if not plans:
        return go.Figure().update_layout(title="choose at least one schedule", height=height)
    parts = [p for p in PARTS if include_weights or p != "weights"]
    weights = next(iter(plans.values())).steps[0].parts["weights"]
    shift = 0 if include_weights else weights
    peaks = [(p.peak_bytes - shift) / GIB for p in plans.values()]
    ytitle = "GiB" if include_weights else "GiB above the weights"
    titles = [_title(n, p, f"{p.peak_bytes / GIB:,.2f} GiB" + ("" if p.fits else
              f"<br><span style='color:{LIMIT_COLOR}'>does not fit</span>")) for n, p in plans.items()]
    fig, groups = _panels(plans, peaks, titles, ytitle, "Peak memory per step (modeled)", height)
    gpu = next(iter(plans.values())).gpu
    limit = (gpu.usable_bytes - shift) / GIB
    drawn = False
    for col, (name, plan) in enumerate(plans.items(), start=1):
        idx = sampled_steps(plan)
        x = [i + 1 for i in idx]
        series = {part: [plan.steps[i].parts[part] / GIB for i in idx] for part in parts}
        _add_stack(fig, col, x, series, PART_LABELS, PART_COLORS, "GiB", len(idx) <= MAX_BARS and
                   len(idx) == len(plan.steps), col == 1)
        top = max(peaks[i] for i in range(len(peaks)) if groups[i] == groups[col - 1])
        if 0 < limit <= LIMIT_SHOWN_ABOVE * top:  # a limit far above the bars would flatten them
            fig.add_hline(y=limit, line=dict(color=LIMIT_COLOR, width=1.5, dash="dash"), row=1, col=col)
            drawn = True
    note = f"{gpu.name}: {gpu.usable_bytes / GIB:,.1f} GiB usable"
    if weights > gpu.usable_bytes:  # never a negative limit: say what it takes instead
        first = next(iter(plans.values()))
        _note(fig, f"The weights alone ({weights / GIB:,.1f} GiB) exceed the {gpu.usable_bytes / GIB:,.1f} GiB "
                   f"usable on one {gpu.name}: at least {first.gpus_needed} GPUs needed", LIMIT_COLOR)
        return fig
    if not include_weights:
        note += f", {limit:,.1f} GiB of it left after the weights ({weights / GIB:,.2f} GiB, not drawn)"
    note += ": the dashed red line" if drawn else ("; far above the bars, so not drawn" if limit > 0 else "")
    _note(fig, note)
    return fig


def plan_time_figure(plans: dict[str, planner.Plan], height: int = 540) -> go.Figure:
    """Per-step roofline milliseconds stacked by component, one panel per schedule."""
    if not plans:
        return go.Figure().update_layout(title="choose at least one schedule", height=height)
    peaks = [max(s.seconds for s in p.steps) * 1e3 for p in plans.values()]
    titles = [_title(n, p, f"{p.seconds:,.2f} s total") for n, p in plans.items()]
    fig, _ = _panels(plans, peaks, titles, "ms per step", "Time per step (roofline)", height)
    for col, (name, plan) in enumerate(plans.items(), start=1):
        idx = sampled_steps(plan)
        x = [i + 1 for i in idx]
        series = {part: [plan.steps[i].seconds_parts[part] * 1e3 for i in idx] for part in planner.TIME_PARTS}
        _add_stack(fig, col, x, series, planner.TIME_LABELS, TIME_COLORS, "ms",
                   len(idx) <= MAX_BARS and len(idx) == len(plan.steps), col == 1)
    first = next(iter(plans.values()))
    _note(fig, f"{first.gpu.name}, {first.dtype}: {first.efficiency:g} of peak FLOP/s and "
               f"{first.bandwidth_efficiency:g} of bandwidth; each component is the slower of compute and memory")
    return fig


def _ratio(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.3f}x" if 0.01 <= value < 1000 else f"{value:.2g}x"


def summary_table(plans: dict[str, planner.Plan], longest: dict[str, planner.Longest] | None = None) -> list[list]:
    """Rows for TABLE_HEADERS: peaks, totals, fit, ratios against FM and full, longest context."""
    rows = []
    for name, row in zip(plans, planner.summary_rows(plans, longest)):
        reach = _longest(longest[name]) if longest and name in longest else row.get("longest_context", "")
        rows.append([row["schedule"], f"{row['steps']:,}", f"{row['peak_gib']:,.2f} GiB",
                     f"{row['kv_peak_gib']:,.3f} GiB", "yes" if row["fits"] else "NO", f"{row['seconds']:,.2f} s",
                     f"{row['tflops']:,.1f}", _ratio(row["peak_vs_fm"]), _ratio(row["seconds_vs_fm"]),
                     _ratio(row["peak_vs_full"]), _ratio(row["seconds_vs_full"]), reach])
    return rows


def headline(plans: dict[str, planner.Plan]) -> str:
    """One Markdown line per compressed schedule against FM, and the notices."""
    lines = []
    fm = plans.get("fm")
    for name, p in plans.items():
        if fm is not None and name not in ("fm", "full"):
            saved = 1 - p.peak_bytes / fm.peak_bytes
            change = f"{saved:.1%} saved" if saved >= 0 else f"{-saved:.1%} more"
            lines.append(f"**{SCHEDULE_LABELS[name]}** vs FM: {p.peak_bytes / fm.peak_bytes:.3f}x peak memory "
                         f"({change}), {fm.seconds / p.seconds:.2f}x speed.")
    # each schedule's own notices, named (a notice repeated word for word is shown once)
    notices = dict.fromkeys(f"{SCHEDULE_LABELS.get(name, name)}: {n}" if not n.startswith(name.upper()) else n
                            for name, p in plans.items() for n in p.notices)
    lines += [f"⚠ {n}" for n in notices]
    return "\n\n".join(lines)


def _longest(longest: planner.Longest) -> str:
    """A longest context in words: a schedule whose peak stops growing has no limit (the search
    checked it up to its cap), else the tokens, else nothing."""
    if longest.unlimited:
        return f"any length (checked up to {longest.cap:,} tokens)"
    return f"{longest.tokens:,} tokens" if longest.tokens else "nothing fits"


def what_it_takes(needs: list[planner.Need], gpu: planner.Gpu, dtype: str, tokens: int) -> str:
    """The answer panel, a small table: per schedule and weight format, the fewest GPUs of the
    chosen kind that hold the plan and the longest context one of them holds (and, where one
    is not enough, what the GPUs needed hold together)."""
    if not needs:
        return ""
    labels = {"dtype": dtype, "int8": "int8", "int4": "int4"}
    lines = [f"**What it takes** on {gpu.name} ({gpu.usable_bytes / GIB:,.1f} GiB usable) for {tokens:,} tokens "
             "(int8, int4: the weights' bytes only):", "",
             "| schedule | weights | GPUs needed | longest context on one GPU |", "|---|---|---:|---|"]
    for need in needs:
        longest = _longest(need.longest)
        if need.longest_split is not None and need.gpus > 1:
            longest += f"; on {need.gpus}: {_longest(need.longest_split)}"
        lines.append(f"| {SCHEDULE_LABELS.get(need.schedule, need.schedule)} | {labels.get(need.weights, need.weights)}"
                     f" | {need.gpus} | {longest} |")
    return "\n".join(lines)


# ---- the handler ---------------------------------------------------------------------------------
def _whole(value, label: str, minimum: int) -> int:
    return whole_number(value, label, minimum)


def compute(model: str, config_file, gpu: str, dtype: str, tokens, chunk, memory, growth: str, attention: str,
            schedules: list[str], sinks=4, keep_maps: bool = False, tflops=None, bandwidth=None,
            gpu_memory=None, rope: str = "compact", weights: str = "dtype"
            ) -> tuple[dict[str, planner.Plan], dict[str, planner.Longest], list[planner.Need]]:
    """Plans, longest contexts and what it takes for the tab's settings (MemstepError on bad input)."""
    if not schedules:
        raise MemstepError("choose at least one schedule to plan")
    if model == "config":
        if not config_file:
            raise MemstepError("upload a config.json, or choose a model preset")
        model = config_file if isinstance(config_file, str) else getattr(config_file, "name", str(config_file))
    tokens = _whole(tokens, "tokens", 1)
    settings = dict(tokens=tokens, chunk=_whole(chunk, "chunk", 1), memory=_whole(memory, "memory", 1),
                    growth=growth, attention=attention, dtype=dtype, sinks=_whole(sinks, "sinks", 0),
                    keep_maps=bool(keep_maps) and attention == "padded", rope=rope)
    device = planner.resolve_gpu(gpu, tflops or None, bandwidth or None, gpu_memory or None)
    base = planner.resolve_model(model, dtype)
    shape = planner.with_weights(base, weights)
    order = [s for s in planner.PLAN_SCHEDULES if s in schedules]
    plans = planner.compare(shape, device, schedules=order, **settings)
    rest = {k: v for k, v in settings.items() if k != "tokens"}
    longest = {name: planner.longest_context(shape, device, name, **rest) for name in plans}
    needs = planner.what_it_takes(base, device, order, settings)
    return plans, longest, needs


def on_plan(model, config_file, gpu, dtype, tokens, chunk, memory, growth, attention, schedules, sinks,
            keep_maps, include_weights, tflops, bandwidth, gpu_memory, rope="compact", weights="dtype"):
    """Gradio handler: headline, what it takes, figures and table; bad input shows a toast and
    keeps the page."""
    try:
        plans, longest, needs = compute(model, config_file, gpu, dtype, tokens, chunk, memory, growth, attention,
                                        schedules, sinks, keep_maps, tflops, bandwidth, gpu_memory, rope, weights)
    except MemstepError as err:
        raise gr.Error(str(err), print_exception=False) from None
    first = next(iter(plans.values()))
    return (headline(plans), what_it_takes(needs, first.gpu, first.dtype, first.schedule.tokens),
            plan_memory_figure(plans, include_weights), plan_time_figure(plans), summary_table(plans, longest))


# Every chart of the tab saved as PNG in the browser (Plotly's own export: nothing on the server).
CHARTS_PNG_JS = """() => {
  for (const id of ["plan-memory", "plan-time"]) {
    const chart = document.querySelector(`#${id} .js-plotly-plot`);
    if (chart && window.Plotly) window.Plotly.downloadImage(chart, {format: "png", filename: `memstep-${id}`, scale: 2});
  }
}"""


def build_tab() -> dict:
    """The Plan tab's controls and outputs, built inside an open ``with gr.Tab("Plan"):``."""
    model_choices = [(planner.MODEL_NAMES[k], k) for k in planner.MODEL_PRESETS] + [("config.json (upload)", "config")]
    gpu_choices = [(g.name, k) for k, g in planner.GPU_PRESETS.items()] + [("custom", "custom")]
    gr.Markdown("Predict every step's peak memory and time for a real model on a GPU, up to millions of "
                "tokens: no model is loaded, the numbers come from `memstep.planner` (the same memory "
                "formula the engine reports per step). Every change replans at once.", elem_classes="memstep-note")
    with gr.Row():
        model = gr.Dropdown(model_choices, value=DEFAULTS["model"], label="model", elem_id="plan-model",
                            min_width=150)
        gpu = gr.Dropdown(gpu_choices, value=DEFAULTS["gpu"], label="GPU", elem_id="plan-gpu", min_width=150)
        dtype = gr.Radio(list(planner.DTYPES), value=DEFAULTS["dtype"], label="dtype", elem_id="plan-dtype",
                         min_width=150)
        weights = gr.Radio(WEIGHT_CHOICES, value=DEFAULTS["weights"], label="weights", info=WEIGHTS_INFO,
                           elem_id="plan-weights", min_width=200)
    with gr.Row():
        tokens = gr.Number(DEFAULTS["tokens"], label="context (tokens)", precision=0, minimum=1,
                           maximum=MAX_SIZE_TOKENS, elem_id="plan-tokens", min_width=110)
        chunk = gr.Number(DEFAULTS["chunk"], label="chunk (tokens)", precision=0, minimum=1,
                          maximum=MAX_SIZE_TOKENS, elem_id="plan-chunk", min_width=110)
        memory = gr.Number(DEFAULTS["memory"], label="memory M (tokens)", precision=0, minimum=1,
                           maximum=MAX_SIZE_TOKENS, elem_id="plan-memory-size", min_width=110)
        sinks = gr.Number(DEFAULTS["sinks"], label="sinks", precision=0, minimum=0, maximum=1024, min_width=110)
        growth = gr.Dropdown(list(GROWTHS), value=DEFAULTS["growth"], label="growth (IM, IMDC)", min_width=150)
    with gr.Row():
        schedules = gr.CheckboxGroup([(SCHEDULE_LABELS[s], s) for s in planner.PLAN_SCHEDULES],
                                     value=DEFAULTS["schedules"], label="schedules side by side",
                                     elem_id="plan-schedules", min_width=200)
        attention = gr.Radio(list(ATTENTIONS), value=DEFAULTS["attention"], label="attention",
                             info="padded = the seed paper's reference code: (memory + chunk)² maps", min_width=200)
        rope = gr.Radio(list(ROPE_MODES), value="compact", label="RoPE positions", min_width=200,
                        info="compact: contiguous, at most sinks + M + c (the reference); document: true positions; "
                             "shared: one position per kept token in every head, at most layers × KV heads × "
                             "(sinks + M) + c")
    with gr.Row():
        include_weights = gr.Checkbox(False, label="draw the weights", elem_id="plan-include-weights",
                                      min_width=200)
        keep_maps = gr.Checkbox(False, label="padded: count every layer's maps (the reference code as written)",
                                elem_id="plan-keep-maps", min_width=200)
    with gr.Accordion("your own config.json or GPU", open=False):
        with gr.Row():
            config_file = gr.File(label="config.json (choose model 'config.json (upload)')", file_types=[".json"],
                                  type="filepath")
            with gr.Column():
                tflops = gr.Number(None, label="peak TFLOP/s (dense, 16-bit; empty: the preset's)", minimum=0,
                                   maximum=planner.MAX_GPU_FIGURE)
                bandwidth = gr.Number(None, label="memory bandwidth in GB/s (empty: the preset's)", minimum=0,
                                      maximum=planner.MAX_GPU_FIGURE)
                gpu_memory = gr.Number(None, label="GPU memory in GiB (empty: the preset's)", minimum=0,
                                       maximum=planner.MAX_GPU_FIGURE)

    inputs = [model, config_file, gpu, dtype, tokens, chunk, memory, growth, attention, schedules, sinks,
              keep_maps, include_weights, tflops, bandwidth, gpu_memory, rope, weights]
    try:  # the defaults are known to plan; show them before the first change
        first = on_plan(DEFAULTS["model"], None, DEFAULTS["gpu"], DEFAULTS["dtype"], DEFAULTS["tokens"],
                        DEFAULTS["chunk"], DEFAULTS["memory"], DEFAULTS["growth"], DEFAULTS["attention"],
                        DEFAULTS["schedules"], DEFAULTS["sinks"], False, False, None, None, None)
    except gr.Error:
        first = ("", "", None, None, [])
    summary = gr.Markdown(first[0], elem_id="plan-headline")
    needs = gr.Markdown(first[1], elem_id="plan-needs", container=True)
    memory_plot = gr.Plot(first[2], show_label=False, elem_id="plan-memory")
    time_plot = gr.Plot(first[3], show_label=False, elem_id="plan-time")
    charts_png = gr.Button("Charts as PNG", elem_id="plan-png", variant="secondary", size="sm")
    table = gr.Dataframe(first[4], headers=TABLE_HEADERS, label="peaks, totals and ratios", interactive=False,
                         wrap=True, elem_id="plan-table", column_widths=TABLE_WIDTHS)
    outputs = [summary, needs, memory_plot, time_plot, table]
    # planning is arithmetic (a fraction of a second): every change replans, in place and without
    # greying the results; only the latest change matters, and a shared limit keeps bursts from
    # taking every worker (bounded by memstep.schedules.MAX_STEPS)
    quick = dict(api_visibility="private", concurrency_id="plan", concurrency_limit=PLAN_CONCURRENCY,
                 trigger_mode="always_last", show_progress="hidden")
    triggers = [c.change for c in (model, config_file, gpu, dtype, growth, attention, schedules, keep_maps,
                                   include_weights, rope, weights)]
    triggers += [n.submit for n in (tokens, chunk, memory, sinks, tflops, bandwidth, gpu_memory)]
    triggers += [n.blur for n in (tokens, chunk, memory, sinks, tflops, bandwidth, gpu_memory)]
    gr.on(triggers, on_plan, inputs, outputs, **quick)
    charts_png.click(None, None, None, js=CHARTS_PNG_JS)
    return dict(zip(["model", "config_file", "gpu", "dtype", "tokens", "chunk", "memory", "growth", "attention",
                     "schedules", "sinks", "keep_maps", "include_weights", "tflops", "bandwidth", "gpu_memory", "rope",
                     "weights"], inputs)) | {"summary": summary, "needs": needs, "memory_plot": memory_plot,
                                             "time_plot": time_plot, "table": table}
