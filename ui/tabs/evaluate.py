"""The Evaluate tab: the latest `memstep eval` results (heatmaps, the quality vs peak
memory vs seconds trade-off with peers marked, the table and the goals).

Pure functions (which results are latest, table rows, headline, figures from
``memstep.evaluation.plots``) are tested without a browser; ``build_tab`` wires them into
Gradio inside an open ``gr.Tab("Evaluate")``. Nothing runs here: evaluations take
minutes to hours and run from the command line (`memstep eval`, `make bench`).
"""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from memstep.evaluation.plots import heatmap_figure, intervals_figure, tradeoff_figure
from memstep.evaluation.report import accuracy_text, contrasts_text, goals_text, plus_minus, retention_text
from memstep.evaluation.store import SUMMARY, load_summary

ROOT = Path(__file__).resolve().parent.parent
# `memstep eval`'s default output, then the committed `make bench` results.
RESULT_FOLDERS = (ROOT / "results" / "local", ROOT / "results")
TABLE_HEADERS = ["length", "configuration", "kind", "passkey accuracy (95% CI)", "passkey kept", "NLL gap (95% CI)",
                 "seconds", "peak MiB", "peak - baseline MiB"]


def result_folders() -> list[Path]:
    """Where to look: $MEMSTEP_RESULTS first when set, then the defaults."""
    extra = os.environ.get("MEMSTEP_RESULTS")
    return ([Path(extra)] if extra else []) + list(RESULT_FOLDERS)


def latest_results(folders) -> tuple[Path, dict] | None:
    """The folder whose summary was written last, with its summary; None when none has one."""
    found = [Path(f) for f in folders if (Path(f) / SUMMARY).is_file()]
    if not found:
        return None
    folder = max(found, key=lambda f: (f / SUMMARY).stat().st_mtime)
    return folder, load_summary(folder)


def lengths(summary: dict) -> list[int]:
    return sorted({r["length"] for r in summary["rows"]})


def table_rows(summary: dict) -> list[list]:
    def num(value, scale=1.0, digits=0):
        return None if value is None else round(value * scale, digits)

    return [[r["length"], r["label"], r["config"]["kind"], accuracy_text(r), retention_text(r),
             plus_minus(r["nll_gap"], r.get("nll_gap_low"), r.get("nll_gap_high")), num(r["seconds"], 1, 1),
             num(r["peak_rss_bytes"], 2**-20), num(r["working_rss_bytes"], 2**-20)] for r in summary["rows"]]


def headline(found: tuple[Path, dict] | None) -> str:
    if found is None:
        return ("**No evaluation results yet.** Run `memstep eval` (results in `results/local/`) or "
                "`make bench` (the default grid, committed in `results/`), then press Reload.")
    folder, summary = found
    run = summary.get("run", {})
    settings = run.get("settings", {})
    configs = len({r["label"] for r in summary["rows"]})
    haystacks = sorted({h for r in summary["rows"] for h in r.get("haystacks", [])})
    return (f"Results from `{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}`: "
            f"{configs} configurations at {', '.join(map(str, lengths(summary)))} tokens, model "
            f"{settings.get('model', '?')}, chunk {settings.get('chunk', '?')}"
            f"{', haystacks ' + ', '.join(haystacks) if haystacks else ''}. Accuracy is k/n passkeys with its 95% "
            "Wilson interval; the NLL gap is the mean per-case difference to memstep's full cache with its 95% "
            "t interval; compact/document in a label = memstep's RoPE positions. Peak memory is the peak "
            "resident memory of a fresh worker process per configuration and length (the baseline is the "
            "worker right after loading the model); peers are kvpress presses and the plain HF full cache.")


def show(length=None):
    """Everything the tab shows, for the latest results (and the trade-off at ``length``)."""
    found = latest_results(result_folders())
    if found is None:
        empty = {"rows": [], "heatmaps": {}, "goals": {"imdc_vs_fm_accuracy": [], "imdc_vs_kvpress_memory": []},
                 "dominated": []}
        return (headline(None), heatmap_figure(empty), tradeoff_figure(empty), [], "",
                gr.update(choices=[], value=None), intervals_figure(empty))
    _, summary = found
    choices = lengths(summary)
    length = int(length) if length in choices else (choices[-1] if choices else None)
    return (headline(found), heatmap_figure(summary), tradeoff_figure(summary, length), table_rows(summary),
            contrasts_text(summary) + "\n\n" + goals_text(summary), gr.update(choices=choices, value=length),
            intervals_figure(summary))


def build_tab() -> dict:
    """The Evaluate tab's outputs, built inside an open ``with gr.Tab("Evaluate"):``."""
    first = show()
    status = gr.Markdown(first[0], elem_id="eval-status")
    with gr.Row():
        length = gr.Dropdown(first[5]["choices"], value=first[5]["value"], label="trade-off at length (tokens)")
        reload = gr.Button("Reload", variant="secondary")
    tradeoff = gr.Plot(first[2], show_label=False, elem_id="eval-tradeoff")
    table = gr.Dataframe(first[3], headers=TABLE_HEADERS, interactive=False, wrap=True, elem_id="eval-table")
    intervals = gr.Plot(first[6], show_label=False, elem_id="eval-intervals")
    heatmaps = gr.Plot(first[1], show_label=False, elem_id="eval-heatmaps")
    goals = gr.Markdown(first[4], elem_id="eval-goals")
    outputs = [status, heatmaps, tradeoff, table, goals, length, intervals]
    reload.click(show, [length], outputs, api_visibility="private")
    length.input(show, [length], outputs, api_visibility="private", show_progress="hidden")
    return {"status": status, "heatmaps": heatmaps, "tradeoff": tradeoff, "table": table, "goals": goals,
            "intervals": intervals}
