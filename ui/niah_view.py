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
# (the multi-needle variant in a folder of its own: `memstep eval` keeps one test per folder)
NIAH_FOLDERS = (ROOT / "results" / "local", ROOT / "results" / "niah", ROOT / "results" / "niah-multi")


def niah_results(folders=None, kind: str = "niah") -> tuple[Path, dict] | None:
    """The first folder (in order: $MEMSTEP_RESULTS, then NIAH_FOLDERS) whose summary has maps of
    ``kind`` (the single-needle test, or its multi-needle variant)."""
    extra = os.environ.get("MEMSTEP_RESULTS")
    for folder in folders or ([Path(extra)] if extra else []) + list(NIAH_FOLDERS):
        summary = load_summary(folder) if Path(folder).is_dir() else None
        if summary and (summary.get("niah") or {}).get(kind):
            return Path(folder), summary["niah"]
    return None


def _shown(folder: Path) -> str:
    try:
        return str(folder.relative_to(ROOT))
    except ValueError:
        return folder.name


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
    lines = standing(load_summary(found[0]) or {}) if found else []
    if lines:
        note += "\n\n" + "\n".join(f"- {line}" for line in lines)
    return (note, niah_figure(found[1] if found else {}, "niah"),
            niah_figure(found_multi[1] if found_multi else {}, "niah-multi"))


def _counted(row: dict) -> str:
    return f"{row['counted_correct']}/{row['counted']}"


def _kept(row: dict, lead: str, tail: str = "") -> str:
    """How much of the answer a row still holds at the end (answer retention), where measured."""
    return "" if row.get("retention") is None else f"{lead}{row['retention']:.2f}{tail}"


def standing(summary: dict) -> list[str]:
    """One line per (length, budget) of the single-needle test: memstep's question-aware FM (the row
    the others are paired with) and each kvpress press, counted on the depths the full cache
    answers, with the paired interval of memstep minus each press, and how much of the answer
    each still holds (answer retention, over every depth), which tells why one answers more."""
    rows = [r for r in summary.get("rows", []) if r.get("kinds") == ["niah"] and r.get("counted")]
    paired = {(p["label"], p["length"]): p for p in summary.get("paired", [])}
    lines = []
    for anchor in (r for r in rows if r.get("anchor") and r["config"].get("question_aware")):
        length, budget = anchor["length"], anchor["config"].get("budget")
        parts = []
        for press in (r for r in rows if r["length"] == length and r["config"]["kind"] == "kvpress"
                      and r["config"].get("budget") == budget):
            found = paired.get((press["label"], length)) or {}
            interval = ""
            if found.get("accuracy_difference") is not None:
                # memstep minus the press (the entry holds the press minus memstep); + 0.0: never "-0"
                low, high = -100 * found["accuracy_difference_high"] + 0.0, -100 * found["accuracy_difference_low"] + 0.0
                verdict = ("memstep leads" if low > 0 else "memstep loses" if high < 0 else "not told apart")
                interval = (f" (memstep {-100 * found['accuracy_difference'] + 0.0:+.0f} points, 95% CI {low:+.0f} to "
                            f"{high:+.0f}: {verdict})")
            parts.append(f"kvpress {press['config']['scorer']} {_counted(press)}{interval}{_kept(press, ', keeps ')}")
        lines.append(f"{length:,} tokens, M = {budget}: memstep's question-aware FM answers {_counted(anchor)} of the "
                     "depths the full cache answers" + _kept(anchor, " and keeps ", " of the answer's (KV head, token) pairs")
                     + ("; " + "; ".join(parts) if parts else "") + ".")
    return lines


def niah_section() -> dict:
    """The section's components, inside an open ``gr.Tab``."""
    note, single, multi = niah_view()
    with gr.Accordion("Needle In A Haystack (the public test): needle depth x context length", open=False):
        text = gr.Markdown(note, elem_id="eval-niah-note")
        single_plot = gr.Plot(single, show_label=False, elem_id="eval-niah")
        multi_plot = gr.Plot(multi, show_label=False, elem_id="eval-niah-multi")
    return {"niah_note": text, "niah": single_plot, "niah_multi": multi_plot}
