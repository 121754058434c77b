"""The Evaluate tab's needle-test section: the public Needle-In-A-Haystack heatmap (depth x
context length, one panel per configuration) from the latest `memstep eval --benchmark niah`
results. Built by ``niah_section`` inside the open Evaluate tab (one call from ui/tabs/evaluate.py)."""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from memstep.evaluation.niah_view import niah_figure
from memstep.evaluation.store import load_summary

ROOT = Path(__file__).resolve().parents[1]
# a run of one's own first (`memstep eval`'s default output), then the committed needle-test results
NIAH_FOLDERS = (ROOT / "results" / "local", ROOT / "results" / "niah")


def niah_results(folders=None) -> tuple[Path, dict] | None:
    """The first folder (in order: $MEMSTEP_RESULTS, then NIAH_FOLDERS) whose summary has needle-test maps."""
    extra = os.environ.get("MEMSTEP_RESULTS")
    for folder in folders or ([Path(extra)] if extra else []) + list(NIAH_FOLDERS):
        summary = load_summary(folder) if Path(folder).is_dir() else None
        if summary and summary.get("niah"):
            return Path(folder), summary["niah"]
    return None


def niah_view(found=None):
    """(note, single-needle figure, multi-needle figure) for the tab."""
    found = found if found is not None else niah_results()
    if not found:
        return ("No needle-test results yet: `memstep eval --benchmark niah` writes them.",
                niah_figure({}), niah_figure({}, "niah-multi"))
    folder, maps = found
    try:
        shown = folder.relative_to(ROOT)
    except ValueError:
        shown = folder.name
    note = (f"From `{shown}`. Right = the answer names both key phrases ('sandwich', 'Dolores Park'); the "
            "multi-needle variant counts each pizza ingredient named. No judge model.")
    return note, niah_figure(maps, "niah"), niah_figure(maps, "niah-multi")


def niah_section() -> dict:
    """The section's components, inside an open ``gr.Tab``."""
    note, single, multi = niah_view()
    with gr.Accordion("Needle In A Haystack (the public test): needle depth x context length", open=False):
        text = gr.Markdown(note, elem_id="eval-niah-note")
        single_plot = gr.Plot(single, show_label=False, elem_id="eval-niah")
        multi_plot = gr.Plot(multi, show_label=False, elem_id="eval-niah-multi")
    return {"niah_note": text, "niah": single_plot, "niah_multi": multi_plot}
