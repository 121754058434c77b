"""The Evaluate tab: the `memstep eval` results that ship (or the user's own), a one-sentence
headline first (memstep's question-aware memory beside the press that answers most), then the
takeaway per length with 95% intervals, the intervals, the quality vs peak memory vs
seconds trade-off with peers marked, the table, the heatmaps and the paired differences.

Pure functions (which results to show, table rows, headline, figures from
``memstep.evaluation.plots``) are tested without a browser; ``build_tab`` wires them into
Gradio inside an open ``gr.Tab("Evaluate")``. Nothing runs here: evaluations take
minutes to hours and run from the command line (`memstep eval`, `make bench`).
"""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from memstep.evaluation.grid import PRESS_NAMES
from memstep.evaluation.plots import heatmap_figure, intervals_figure, tradeoff_figure
from memstep.evaluation.report import _best_answering  # the press the headline names
from memstep.evaluation.report import (accuracy_text, contrasts_text, counted_text, entries_text, fair_takeaway,
                                       interval_text, paired_table, plus_minus, recommendation, retention_text,
                                       settings_text,
                                       unsupported)
from memstep.evaluation.store import SUMMARY, load_summary
from memstep.errors import MemstepError

from ui.theme import FONT, chart_template

ROOT = Path(__file__).resolve().parents[2]  # ui/tabs/evaluate.py -> the repository
# Which results the tab shows, in this fixed order, never by when files were written (a fresh
# clone writes them all at once): `memstep eval`'s default output (the user's own run), then the
# committed `make bench-eval` results. The earlier grid lives in results/legacy-grid/, not shown.
# your own results first, then the frozen test split (cases no setting was chosen on), then the development grid
RESULT_FOLDERS = (ROOT / "results" / "local", ROOT / "results" / "test-split", ROOT / "results" / "eval")
TABLE_HEADERS = ["length", "configuration", "kind", "passkey accuracy (95% CI)", "passkey kept", "NLL gap (95% CI)",
                 "seconds", "peak MiB", "peak - baseline MiB"]
# results with a KL against the full cache: the settings beside the numbers, counted accuracy, KL, top-1
# the numbers first: on a narrow screen the settings are the column one scrolls to
FAIR_HEADERS = ["length", "configuration", "answered, of the cases the full cache answers",
                "KL from the full cache (95% CI)", "top-1 agreement (95% CI)", "answer kept whole (95% CI)",
                "cases", "entries kept", "settings"]


def is_fair(summary: dict) -> bool:
    return any(r.get("kl") is not None for r in summary["rows"])


def result_folders() -> list[Path]:
    """Where to look: $MEMSTEP_RESULTS first when set, then the defaults."""
    extra = os.environ.get("MEMSTEP_RESULTS")
    return ([Path(extra)] if extra else []) + list(RESULT_FOLDERS)


def chosen_results(folders) -> tuple[Path, dict] | None:
    """The results to show, chosen by what the folders hold: the first folder, in ``folders``'
    order, whose summary is in today's form (answers counted against the full cache, KL); else
    the first with any summary; None when none has one (or none can be read)."""
    found = []
    for folder in map(Path, folders):
        if (folder / SUMMARY).is_file():
            try:
                summary = load_summary(folder)
            except (MemstepError, OSError, ValueError):
                continue  # a cut or foreign file: the next folder
            if isinstance(summary, dict) and isinstance(summary.get("rows"), list):
                found.append((folder, summary))
    return next(((f, s) for f, s in found if is_fair(s)), found[0] if found else None)


def evaluation_headline(summary: dict) -> str:
    """One sentence: at the shortest length with both, memstep's question-aware FM beside the kvpress
    press that answers most, at every memory budget both ran, on the cases the full cache answers, and
    whether each paired 95% interval tells them apart. '' for results without those rows."""
    found = _compared(summary)
    if found is None:
        return ""
    length, pairs = found
    if len(pairs) == 1:
        (aware, best), = pairs
        press, interval = press_named(best), _interval(summary, length, best)
        verdict = "" if interval is None else (f"; the paired 95% interval of the difference (memstep minus {press}: "
                                              f"{_points(interval)}) {_says(interval, press)}")
        return (f"At {length:,} tokens with a memory of {aware['config'].get('budget')} tokens, memstep's "
                f"question-aware FM answers {aware['counted_correct']}/{aware['counted']} of the questions the full "
                f"cache answers and kvpress {press}, the press that answers most, "
                f"{best['counted_correct']}/{best['counted']}{verdict}.")
    clauses, named = [], None
    for aware, best in pairs:
        press, interval = press_named(best), _interval(summary, length, best)
        mine = f"{aware['counted_correct']}/{aware['counted']} with a memory of {aware['config'].get('budget')} tokens"
        theirs = f"{best['counted_correct']}/{best['counted']}"
        verdict = "" if interval is None else (
            f" ({'' if press == named else f'memstep minus {press}: '}{_points(interval)}, "
            + {None: "not told apart", True: "memstep ahead", False: f"{press} ahead"}[_lead(interval)] + ")")
        clauses.append(f"{mine}, {press} {theirs}{verdict}" if press == named else
                       f"{mine}, where kvpress {press}, the press that answers most there, answers {theirs}{verdict}")
        named = press
    return (f"At {length:,} tokens, of the questions the full cache answers, memstep's question-aware FM answers "
            + "; ".join(clauses) + ".")


def _compared(summary: dict) -> tuple[int, list[tuple[dict, dict]]] | None:
    """The shortest length where memstep's question-aware FM and a press both ran at some memory budget,
    with (memstep's row, the press that answers most) at each such budget, smallest first."""
    def both(length):
        found = []
        for aware in _aware_rows(summary, length):  # (smallest budget first)
            best = _best_answering([r for r in summary["rows"] if r["length"] == length and r["config"]["kind"] ==
                                    "kvpress" and r["config"].get("budget") == aware["config"].get("budget")])
            if aware.get("counted") and best:
                found.append((aware, best))
        return found

    return next(((length, pairs) for length in lengths(summary) for pairs in [both(length)] if pairs), None)


def headline_title(summary: dict) -> str:
    """The verdicts alone, budgets that share one grouped: '2,048 tokens: ChunkKV answers more than memstep
    at M = 128; memstep and ChunkKV not told apart at M = 256 and 512'. '' where nothing is compared or
    nothing is paired."""
    found = _compared(summary)
    if found is None:
        return ""
    length, pairs = found
    groups: list[tuple[str, list]] = []
    for aware, best in pairs:
        interval = _interval(summary, length, best)
        if interval is None:
            return ""
        lead = _lead(interval)
        press = press_named(best)
        said = (f"memstep and {press} not told apart" if lead is None else
                f"memstep answers more than {press}" if lead else f"{press} answers more than memstep")
        if groups and groups[-1][0] == said:
            groups[-1][1].append(aware["config"].get("budget"))
        else:
            groups.append((said, [aware["config"].get("budget")]))
    parts = [f"{said} at M = {', '.join(map(str, budgets[:-1])) + ' and ' if len(budgets) > 1 else ''}{budgets[-1]}"
             for said, budgets in groups]
    return f"{length:,} tokens: " + "; ".join(parts)


def press_named(row: dict) -> str:
    return PRESS_NAMES.get(row["config"].get("scorer"), row["label"])


def _interval(summary: dict, length: int, best: dict) -> tuple[float, float] | None:
    """memstep minus the press, the paired 95% interval of answered cases (None when unpaired). The store
    pairs each press against memstep (press minus memstep): turned round here."""
    paired = next((p for p in summary.get("paired") or [] if p["length"] == length and p["label"] == best["label"]),
                  {})
    low, high = paired.get("accuracy_difference_low"), paired.get("accuracy_difference_high")
    return None if low is None else (-high, -low)


def _points(interval: tuple[float, float]) -> str:
    return f"{100 * interval[0]:+.0f} to {100 * interval[1]:+.0f} points"


def _lead(interval: tuple[float, float]) -> bool | None:
    """True: memstep ahead; False: the press ahead; None: the interval includes 0."""
    return None if interval[0] <= 0 <= interval[1] else interval[0] > 0


def _says(interval: tuple[float, float], press: str) -> str:
    return {None: "does not tell them apart", True: "favours memstep", False: f"favours kvpress {press}"}[_lead(interval)]


def _aware_rows(summary: dict, length: int) -> list[dict]:
    """memstep's question-aware FM rows at its default, one per memory budget: the rows the others
    pair with (a grid run under an earlier default pairs with that one)."""
    from memstep.evaluation.metrics import default_memory

    rows = [default_memory(summary["rows"], length, budget) for budget in
            sorted({r["config"].get("budget") for r in summary["rows"] if r["length"] == length} - {None})]
    return [r for r in rows if r is not None]


def lengths(summary: dict) -> list[int]:
    return sorted({r["length"] for r in summary["rows"]})


def table_rows(summary: dict) -> list[list]:
    def num(value, scale=1.0, digits=0):
        return None if value is None else round(value * scale, digits)

    if is_fair(summary):
        return [[r["length"], r["label"], counted_text(r), interval_text(r, "kl"),
                 interval_text(r, "top1", percent=True), interval_text(r, "needle_whole", percent=True), r["cells"],
                 entries_text(r), settings_text(r, short=True)]
                for r in summary["rows"]]

    return [[r["length"], r["label"], r["config"]["kind"], accuracy_text(r), retention_text(r),
             plus_minus(r["nll_gap"], r.get("nll_gap_low"), r.get("nll_gap_high")), num(r["seconds"], 1, 1),
             num(r["peak_rss_bytes"], 2**-20), num(r["working_rss_bytes"], 2**-20)] for r in summary["rows"]]


def split_note(summary: dict) -> str:
    """Which cases the results are of, in words: the frozen test split, or the development split."""
    split = (summary.get("run") or {}).get("split") or "dev"
    if split == "test":
        return ("**The frozen test split**: cases drawn once from texts and needles no setting was chosen on "
                "(docs/test-split.md). ")
    return ("**The development split**: the cases memstep's settings were chosen on, so these numbers say how "
            "well they fit them. ")


def headline(found: tuple[Path, dict] | None) -> str:
    """Where the results come from and how to read their numbers (a note under the takeaway)."""
    if found is None:
        return ("**No evaluation results yet.** Run `memstep eval` (results in `results/local/`) or "
                "`make bench` (the default grid, committed in `results/`), then press Reload.")
    folder, summary = found
    where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
    if is_fair(summary):
        cases = {r["length"]: r.get("reference_cases") or r["cells"] for r in summary["rows"]
                 if r["config"]["kind"] == "memstep" and r["config"]["schedule"] == "full"}
        return (split_note(summary) + f"Results from `{where}`: {len({r['label'] for r in summary['rows']})} configurations; "
                + ", ".join(f"{n} cases at {length:,} tokens" for length, n in sorted(cases.items()))
                + ". KL: the mean KL divergence (nats per token) of the memory's next-token distributions from the "
                "full cache's over the prose that follows the document, with its 95% t interval; top-1 agreement: "
                "how often both pick the same token. Answers are counted on the cases memstep's full cache answers "
                "(Wilson 95% interval). Each kvpress press keeps the same number of document entries and runs as "
                "its authors run it (its settings are in the table). Peak memory and seconds: the trade-off chart.")
    run = summary.get("run", {})
    settings = run.get("settings", {})
    configs = len({r["label"] for r in summary["rows"]})
    haystacks = sorted({h for r in summary["rows"] for h in r.get("haystacks", [])})
    return (f"Results from `{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}`: "
            f"{configs} configurations at {', '.join(map(str, lengths(summary)))} tokens, model "
            f"{settings.get('model', '?')}, chunk {settings.get('chunk', '?')}"
            f"{', haystacks ' + ', '.join(haystacks) if haystacks else ''}. Accuracy is k/n passkeys with its 95% "
            "Wilson interval; the NLL gap is the mean per-case difference to memstep's full cache with its 95% "
            "t interval; compact/document/shared in a label = memstep's RoPE positions. Peak memory is the peak "
            "resident memory of a fresh worker process per configuration and length (the baseline is the "
            "worker right after loading the model); peers are kvpress presses and the plain HF full cache.")


def _best(rows: list[dict]) -> dict | None:
    """The row that answers most (then: least memory above its baseline)."""
    return max(rows, key=lambda r: (r["accuracy"], -(r.get("working_rss_bytes") or 0)), default=None)


def _range(rows: list[dict]) -> str:
    """'0/12 to 1/12' or 'all 0/12' over rows of one length."""
    counts = sorted({accuracy_text(r).split(" ")[0] for r in rows}, key=lambda t: int(t.split("/")[0]))
    return f"all {counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def takeaway(summary: dict) -> str:
    """The results in a few lines, per length: the full cache, memstep's compressed memories
    with and without the question, and the best peer, each with its 95% interval."""
    if is_fair(summary):
        lines = fair_takeaway(summary)
        if not lines:
            return ""
        return (recommendation(summary) + "\n\nPer length, each memory's answers on the cases the full cache "
                "answers and its KL from the full cache, with the settings it ran with (95% intervals):\n\n"
                + "\n".join(lines))
    lines = []
    for length in lengths(summary):
        rows = [r for r in summary["rows"] if r["length"] == length]
        config = lambda r: r.get("config", {})  # noqa: E731
        ours = [r for r in rows if config(r).get("kind") == "memstep"]
        full = next((r for r in ours if config(r).get("schedule") == "full"), None)
        aware = [r for r in ours if config(r).get("schedule") != "full" and config(r).get("question_aware")]
        agnostic = [r for r in ours if config(r).get("schedule") != "full" and not config(r).get("question_aware")]
        peers = [r for r in rows if config(r).get("kind") not in ("memstep", "hf")]
        parts = []
        if full:
            parts.append(f"the full cache answers {accuracy_text(full)}")
        if aware:
            parts.append(f"memstep's compressed memories with the question voting ({len(aware)}) "
                         + _summary(aware))
        if agnostic:
            parts.append(f"query-agnostic ones ({len(agnostic)}) " + _summary(agnostic))
        if peers:
            best = _best(peers)
            parts.append(f"the best peer, {best['label']}, {accuracy_text(best)}")
        cases = max((r["cells"] for r in rows), default=0)
        lines.append(f"- **{length:,} tokens** ({cases} cases per configuration): " + "; ".join(parts) + ".")
    if not lines:
        return ""
    return ("**What the results say.** Passkeys answered out of the cases run (k/n, 95% Wilson interval: with "
            "a dozen cases a row of misses means *rarely*, not *never*):\n\n" + "\n".join(lines))


def _summary(rows: list[dict]) -> str:
    """'all 12/12 (95% CI 76-100%)' or '0/12 to 1/12 (best: imdc snapkv ..., 1/12 (8%, 95% CI 1-35%))'."""
    spread = _range(rows)
    best = _best(rows)
    interval = accuracy_text(best).split(", ", 1)[1].rstrip(")")
    if spread.startswith("all"):
        return f"{spread} ({interval})"
    return f"{spread} (best: {best['label']}, {accuracy_text(best)})"


EMPTY = {"rows": [], "heatmaps": {}, "dominated": []}


def app_style(fig):
    """The evaluation's figures in the page's ink (dark mode repaints this ink, ui/theme.py); the
    type and sizes stay those memstep.evaluation.plots laid the figures out for (the page's wider
    type pushed an axis title out of a phone's chart)."""
    fig.update_layout(font=dict(color=FONT["color"]), template=chart_template())
    # panel titles and the numbers of the value axes at the page's small size (12 and 11 px); the
    # configuration names keep the plots' 10 px: wider, they would crowd a phone's panels
    fig.update_annotations(font=dict(color=FONT["color"], size=12))
    fig.update_xaxes(tickfont_size=11)
    return fig


def headline_markdown(summary: dict) -> str:
    """The tab's first lines: the evaluation's headline, then where memstep stands on the public
    needle test against each press (from the needle-test results, ui/niah_view.py)."""
    from ui.niah_view import needle_sentence

    sentence, title = evaluation_headline(summary), headline_title(summary)
    split = "Frozen test split" if (summary.get("run") or {}).get("split") == "test" else "Development split"
    if title:  # the verdicts first, short enough to read at a glance; the numbers under them
        lines = [f"### {split}, {title}", sentence]
    else:  # which cases the sentence is of, before anything else on the tab
        lines = [f"### {split}: {sentence[0].lower()}{sentence[1:]}" if sentence else ""]
    needles = needle_sentence()
    if needles:  # the public needle grid is development data, run with the recipe of its day
        needles = "*Development split, run with the recipe memstep used then.* " + needles
    return "\n\n".join(part for part in (*lines, needles) if part)


def default_length(summary: dict) -> int | None:
    """The trade-off's first length: the one with the most configurations (the longest of equals), so a
    length where only the full cache has run yet does not open on a chart of one point."""
    counts = {length: sum(r["length"] == length for r in summary["rows"]) for length in lengths(summary)}
    return max(sorted(counts, reverse=True), key=lambda length: counts[length], default=None)


def show(length=None):
    """Everything the tab shows, for the chosen results (and the trade-off at ``length``)."""
    found = chosen_results(result_folders())
    summary = found[1] if found else EMPTY
    choices = lengths(summary)
    length = int(length) if length in choices else default_length(summary)
    return (takeaway(summary), headline(found), app_style(intervals_figure(summary)),
            app_style(tradeoff_figure(summary, length)),
            gr.update(value=table_rows(summary), headers=FAIR_HEADERS if is_fair(summary) else TABLE_HEADERS),
            app_style(heatmap_figure(summary)), differences_text(summary) if found else "",
            gr.update(choices=choices, value=length), headline_markdown(summary))


def differences_text(summary: dict) -> str:
    """The paired differences: against memstep's question-aware FM (with what the intervals
    cannot tell apart) for results with a KL, else the earlier contrasts."""
    if not is_fair(summary):
        return contrasts_text(summary)
    return "\n".join([paired_table(summary), "", *unsupported(summary)])


def build_tab() -> dict:
    """The Evaluate tab's outputs, built inside an open ``with gr.Tab("Evaluate"):``."""
    first = show()
    sentence = gr.Markdown(first[8], elem_id="eval-headline")
    with gr.Accordion("What the results say, per length (95% intervals)", open=False, elem_id="eval-more"):
        lead = gr.Markdown(first[0], elem_id="eval-takeaway")
    status = gr.Markdown(first[1], elem_id="eval-status", elem_classes="memstep-note")
    intervals = gr.Plot(first[2], show_label=False, elem_id="eval-intervals")
    with gr.Row():
        length = gr.Dropdown(first[7]["choices"], value=first[7]["value"], label="trade-off at length (tokens)",
                             elem_id="eval-length")
        reload = gr.Button("Reload", variant="secondary", elem_id="eval-reload")
    tradeoff = gr.Plot(first[3], show_label=False, elem_id="eval-tradeoff")
    table = gr.Dataframe(first[4]["value"], headers=first[4]["headers"], interactive=False, wrap=True,
                         elem_id="eval-table")
    with gr.Accordion("Passkey accuracy by needle depth and length, per configuration", open=False):
        heatmaps = gr.Plot(first[5], show_label=False, elem_id="eval-heatmaps")
    with gr.Accordion("Paired differences on the same cases", open=False):
        contrasts = gr.Markdown(first[6], elem_id="eval-contrasts")
    from ui.niah_view import niah_section  # the public needle test's heatmap (its own module)

    niah_section()
    outputs = [lead, status, intervals, tradeoff, table, heatmaps, contrasts, length, sentence]
    reload.click(show, [length], outputs, api_visibility="private")
    length.input(show, [length], outputs, api_visibility="private", show_progress="hidden")
    return {"headline": sentence, "takeaway": lead, "status": status, "heatmaps": heatmaps, "tradeoff": tradeoff, "table": table,
            "contrasts": contrasts, "intervals": intervals}
