"""The needle test's standard figure: depth (rows) x context length (columns), one panel per
configuration, coloured by the share of key phrases named (single needle: both phrases = 100;
multi-needle: the recall over its needles). Written beside the results as niah.html / niah.png
and shown in the app's Evaluate tab (ui/niah_view.py). Plotly is imported inside the functions."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from statistics import mean

from memstep.evaluation.niah import BENCHMARKS
from memstep.presets import DEFAULTS


def depth_bin(depth: float) -> float:
    """The nearest tenth (half up): a grid of 48 depths still draws as the harness's 11 rows."""
    return math.floor(depth * 10 + 0.5 + 1e-9) / 10


def panel_rank(cell: dict) -> int:
    """The order of the panels: the full cache, memstep at the engine's defaults, the presses, then
    memstep's ablations (an earlier pool, spans, other positions, other schedules' settings)."""
    config = cell.get("config") or {}
    if config.get("kind") == "memstep" and config.get("schedule") == "full":
        return 0
    if config.get("kind") == "kvpress":
        return 2
    ablation = any(config.get(axis) is not None for axis in ("question_pool", "question_weight", "span", "fidelity"))
    other_positions = config.get("rope") not in (None, DEFAULTS["rope"])  # e.g. --ropes document
    return 3 if ablation or other_positions or config.get("schedule") != "fm" else 1


def niah_maps(cells: list[dict]) -> dict:
    """{benchmark: {label: {depths, lengths, score[depth][length], cases}}} from finished cells;
    depths to the nearest tenth, each row the mean over its cases; panels in ``panel_rank`` order.
    Every panel of a benchmark has the same rows (a depth one configuration did not run is empty):
    the figure shares its depth axis, and panels with rows of their own would not line up."""
    grid: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    rank: dict = {}
    family: dict = {}  # a configuration without its budget, numbered as first seen: its budgets side by side
    for cell in cells:
        if cell.get("kind") in BENCHMARKS and cell.get("recall") is not None:
            grid[cell["kind"]][cell["label"]][(depth_bin(cell["depth"]), cell["length"])].append(cell["recall"])
            if cell["label"] not in rank:
                # memstep's defaults by budget alone; the presses and ablations by configuration, then budget
                level = panel_rank(cell)
                name = family.setdefault(re.sub(r" M=\d+", "", cell["label"]), len(family))
                rank[cell["label"]] = (level, name if level > 1 else 0, (cell.get("config") or {}).get("budget") or 0)
    out: dict = {}
    for kind, labels in grid.items():
        out[kind] = {}
        depths = sorted({d for values in labels.values() for d, _ in values})
        for label, values in sorted(labels.items(), key=lambda item: rank[item[0]]):
            lengths = sorted({n for _, n in values})
            out[kind][label] = {
                "depths": depths, "lengths": lengths,
                "score": [[mean(values[(d, n)]) if (d, n) in values else None for n in lengths] for d in depths],
                "cases": [[len(values.get((d, n), ())) for n in lengths] for d in depths]}
    return out


def niah_figure(maps: dict, kind: str = "niah", columns: int = 2):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from memstep.evaluation.plots import FOOT, _empty, _title, _wrap

    panels = maps.get(kind) or {}
    if not panels:
        name = "multi-needle" if kind == "niah-multi" else "needle-test"  # each panel names its own command
        return _empty(f"no {name} results yet<br>(memstep eval --benchmark {kind})")  # two lines: fits a phone
    labels = list(panels)
    columns = max(1, min(columns, len(labels)))
    rows = -(-len(labels) // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=[_wrap(label, 18) for label in labels],
                        shared_yaxes=True, horizontal_spacing=0.04, vertical_spacing=min(0.16, 0.6 / rows))
    what = "key phrases named %" if kind == "niah" else "needles recalled %"
    for i, label in enumerate(labels):
        data = panels[label]
        z = [[None if v is None else round(100 * v) for v in row] for row in data["score"]]
        fig.add_trace(go.Heatmap(
            z=z, x=[f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in data["lengths"]],
            y=[f"{round(100 * d)}%" for d in data["depths"]], zmin=0, zmax=100, colorscale="Viridis",
            showscale=i == 0, colorbar={**FOOT, "title": {"text": what, "side": "top"}, "thickness": 10,
                                        "len": 0.6, "x": 0.5, "xanchor": "center"},
            text=[["" if v is None else str(v) for v in row] for row in z], texttemplate="%{text}",
            customdata=data["cases"],
            hovertemplate=f"{label}<br>length %{{x}}<br>depth %{{y}} (nearest tenth)<br>{what} %{{z}} "
                          f"of %{{customdata}} cases<extra></extra>"),
            row=i // columns + 1, col=i % columns + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_annotations(font_size=11)
    name = "single needle (San Francisco)" if kind == "niah" else "three needles (pizza ingredients)"
    fig.update_layout(title=_title(f"Needle In A Haystack, {name}:<br>needle depth x context length"),
                      height=240 * rows + 200, margin={"l": 40, "r": 20, "t": 125, "b": 30})
    return fig


def write_niah_plots(maps: dict, folder: str | Path) -> list[str]:
    """niah.html/.png (and niah-multi.*) in ``folder``; a notice when a PNG cannot be written."""
    notices = []
    for kind in maps:
        fig = niah_figure(maps, kind)
        fig.write_html(Path(folder) / f"{kind}.html", include_plotlyjs="cdn")
        try:
            fig.write_image(Path(folder) / f"{kind}.png", width=1100, height=fig.layout.height)
        except Exception as err:  # kaleido or Chromium missing: the HTML is there
            notices.append(f"{kind}.png not written ({type(err).__name__}: {str(err).splitlines()[0][:120]})")
    return notices
