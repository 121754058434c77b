"""The Evaluate tab's needle-test section: the public Needle-In-A-Haystack heatmap (depth x
context length, one panel per configuration) from the latest `memstep eval --benchmark niah`
results. Built by ``niah_section`` inside the open Evaluate tab (one call from ui/tabs/evaluate.py)."""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from memstep.evaluation.niah_standing import (essay_tokens, fidelities, fidelity_headline, fidelity_table,
                                              needle_headline, standing_table, standings)
from memstep.evaluation.niah_view import niah_figure
from memstep.evaluation.store import load_summary

ROOT = Path(__file__).resolve().parents[1]
# a run of one's own first (`memstep eval`'s default output), then the committed needle-test results
# (the multi-needle variant in a folder of its own: `memstep eval` keeps one test per folder)
NIAH_FOLDERS = (ROOT / "results" / "local", ROOT / "results" / "niah", ROOT / "results" / "niah-multi")
# the committed run with --metrics kl (KL and top-1 over the essay that follows), in a folder of its own
FIDELITY_FOLDERS = (ROOT / "results" / "niah-kl",)


def niah_results(folders=None, kind: str = "niah") -> tuple[Path, dict] | None:
    """The first folder (in order: $MEMSTEP_RESULTS, then NIAH_FOLDERS) whose summary has maps of
    ``kind`` (the single-needle test, or its multi-needle variant)."""
    extra = os.environ.get("MEMSTEP_RESULTS")
    for folder in folders or ([Path(extra)] if extra else []) + list(NIAH_FOLDERS):
        summary = load_summary(folder) if Path(folder).is_dir() else None
        if summary and (summary.get("niah") or {}).get(kind):
            return Path(folder), summary["niah"]
    return None


def needle_sentence(found=None) -> str:
    """Where memstep stands against each press over the needle test's rows, in one sentence
    (needle_headline); '' without needle-test results."""
    found = found if found is not None else niah_results()
    return needle_headline(standings(load_summary(found[0]) or {})) if found else ""


def _shown(folder: Path) -> str:
    try:
        return str(folder.relative_to(ROOT))
    except ValueError:
        return folder.name


def fidelity_note(folders) -> str:
    """The needle test's fidelity beyond the needle (fidelity_headline and fidelity_table) from the first
    of ``folders`` whose summary measured KL; '' where none did. A folder may come as (folder, summary)
    with its summary already loaded."""
    for item in folders:
        folder, summary = item if isinstance(item, tuple) else (Path(item), None)
        if summary is None:
            summary = load_summary(folder) if Path(folder).is_dir() else None
        found = fidelities(summary or {})
        if found:
            return (f"\n\n{fidelity_headline(found)} From `{_shown(Path(folder))}`: KL (nats per token) · top-1 "
                    f"agreement over {essay_tokens(summary)} after each document; memstep minus each press, paired "
                    f"95% t interval (a negative KL difference: memstep is closer):\n\n{fidelity_table(found)}")
    return ""


def niah_view(found=None, found_multi=None):
    """(note, single-needle figure, multi-needle figure) for the tab."""
    found = found if found is not None else niah_results()
    if found_multi is None:  # the single-needle folder's own multi-needle maps first
        found_multi = found if found and found[1].get("niah-multi") else niah_results(kind="niah-multi")
    if not (found or found_multi):
        return ("No needle-test results yet: `memstep eval --benchmark niah` writes them.",
                niah_figure({}), niah_figure({}, "niah-multi"))
    note = ((f"From `{_shown(found[0])}`. " if found else "")
            + (f"Multi-needle from `{_shown(found_multi[0])}`. " if found_multi and found_multi is not found else "")
            + "Right = the answer names both key phrases ('sandwich', 'Dolores Park'); the multi-needle "
              "variant counts each pizza ingredient named. No judge model.")
    summary = (load_summary(found[0]) or {}) if found else {}  # read once: the standing and the KL table
    rows = standings(summary)
    if rows:  # the README's table: answered · retention per press, and memstep's verdict against each
        note += ("\n\nAnswered of the depths the full cache answers · the share of the answer's (KV head, token) "
                 "pairs still held, over every depth run; memstep minus each press, paired 95% interval:\n\n" + standing_table(rows))
    note += fidelity_note(([(found[0], summary)] if found else []) + list(FIDELITY_FOLDERS))
    return (note, niah_figure(found[1] if found else {}, "niah"),
            niah_figure(found_multi[1] if found_multi else {}, "niah-multi"))


def niah_section() -> dict:
    """The section's components, inside an open ``gr.Tab``."""
    note, single, multi = niah_view()
    with gr.Accordion("Needle In A Haystack (the public test): needle depth x context length", open=False):
        text = gr.Markdown(note, elem_id="eval-niah-note")
        single_plot = gr.Plot(single, show_label=False, elem_id="eval-niah")
        multi_plot = gr.Plot(multi, show_label=False, elem_id="eval-niah-multi")
    return {"niah_note": text, "niah": single_plot, "niah_multi": multi_plot}
