"""The frozen test split's tables, from what `memstep eval --split test` wrote (``results/test-split``):
README's summary (answers at M = 128, 256 and 512, each memory paired against memstep's default
question-aware FM on the same cases) and docs/test-split.md's full tables (settings beside the numbers,
KL, paired differences, measured memory).

    .venv/bin/python benchmarks/test_split_docs.py                # print the summary
    .venv/bin/python benchmarks/test_split_docs.py --docs         # and write README.md and docs/test-split.md

Reads only what the runs wrote (`make bench-test-split` fills the folder); a memory that has not run
at some budget shows "-" there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.docs_block import write_block  # noqa: E402
from memstep.evaluation.metrics import case_of, summarize  # noqa: E402
from memstep.evaluation.report import _at_defaults, fair_table, paired_table, settings_text  # noqa: E402
from memstep.evaluation.stats import mean_interval, paired_difference_interval, wilson_interval  # noqa: E402
from memstep.evaluation.store import ResultStore  # noqa: E402

FOLDER = ROOT / "results" / "test-split"
BUDGETS = (128, 256, 512)
COMMAND = "python benchmarks/test_split_docs.py --docs"


def _name(row: dict) -> str:
    """A row's memory in words, without its budget (the column says it); memstep's positions are what
    `auto` picks (shared for the default; the tuned recipe's own rule: shared below 256, compact from 256)."""
    c = row["config"]
    if c["kind"] == "kvpress":
        return f"kvpress {c['scorer']} ({settings_text(row, short=True)})"
    if not c.get("question_aware"):
        return f"memstep FM, {c['scorer']}, no question"
    schedule = {"fm": "FM", "imdc": "IMDC", "once": "one cut after a full prefill"}.get(c["schedule"], c["schedule"])
    chunk = "" if c["schedule"] == "once" else f"c {c.get('chunk')}, "
    if c.get("question_pool"):
        recipe = "the tuned recipe" if "fade" in c["question_pool"] else f"pool {c['question_pool']}"
        recipe += f", weight {c.get('question_weight') or 1:g}"
    else:
        recipe = "the default: max:15, weight 1" + ("" if c.get("question_weight") is None
                                                    else f" at weight {c['question_weight']:g}")
    return f"memstep {schedule} ({chunk}{recipe})"


def _default_fm(row: dict) -> bool:
    c = row["config"]
    return c["kind"] == "memstep" and c["schedule"] == "fm" and c.get("question_aware") and \
        _at_defaults(c) and not c.get("fidelity")


def _cell(row: dict, paired: dict | None) -> str:
    n, k = row.get("counted") or 0, row.get("counted_correct") or 0
    if not n:
        return "-"
    text = f"{k}/{n} ({100 * row['counted_low']:.0f}-{100 * row['counted_high']:.0f}%)"
    if paired and paired.get("accuracy_difference") is not None:
        text += (f", {100 * paired['accuracy_difference']:+.0f} ({100 * paired['accuracy_difference_low']:+.0f} "
                 f"to {100 * paired['accuracy_difference_high']:+.0f})")
    return text


def _mib(row: dict | None) -> str:
    value = None if row is None else row.get("working_rss_bytes")
    return "-" if value is None else f"{value / 2 ** 20:.0f}"


def summary_table(summary: dict, length: int, aware: bool = True) -> str:
    """Rows: each memory; columns: M. Every cell: answered of the cases the full cache answers (Wilson 95%),
    then, but for memstep's default FM, minus it on the same cases (points, Newcombe 95%)."""
    rows = [r for r in summary["rows"] if r["length"] == length and r["config"].get("budget") in BUDGETS
            and bool(r["config"].get("question_aware")) == aware]
    paired = {(p["label"], p["length"]): p for p in summary.get("paired") or []}
    names: dict[str, dict[int, dict]] = {}
    for r in sorted(rows, key=lambda r: (not _default_fm(r), r["config"]["kind"] != "memstep", _name(r))):
        names.setdefault(_name(r), {})[r["config"]["budget"]] = r
    head = ["| memory (settings) | " + " | ".join(f"M = {m}" for m in BUDGETS) + " | working memory at M = 256, MiB |",
            "|---|" + "---:|" * (len(BUDGETS) + 1)]
    lines = []
    for name, by in names.items():
        cells = [_cell(by[m], None if _default_fm(by[m]) else paired.get((by[m]["label"], length)))
                 if m in by else "-" for m in BUDGETS]
        lines.append(f"| {'**' + name + '**' if _default_fm(next(iter(by.values()))) else name} | "
                     + " | ".join(cells) + f" | {_mib(by.get(256))} |")
    return "\n".join(head + lines)


def agnostic_table(cells: list[dict], length: int) -> str:
    """The question-agnostic scorers under FM (no question), each paired against chunk-attention (the
    paper's scorer) at the same M on the same cases: answers on the cases the full cache answers
    (Newcombe 95%) and KL from the full cache (mean per-case difference, t 95%)."""
    answered = {case_of(c) for c in cells if c["length"] == length and c["config"]["kind"] == "memstep"
                and c["config"]["schedule"] == "full" and c["correct"]}
    by: dict[tuple, dict] = {}
    for c in cells:
        conf = c["config"]
        if c["length"] == length and conf["kind"] == "memstep" and conf["schedule"] == "fm" and \
                not conf.get("question_aware") and conf.get("budget") in BUDGETS and not conf.get("fidelity"):
            by.setdefault((conf["scorer"], conf["budget"]), {})[case_of(c)] = c
    scorers = sorted({scorer for scorer, _ in by}, key=lambda name: (name != "chunk-attention", name))
    lines = ["| scorer | " + " | ".join(f"M = {m}: answered; KL" for m in BUDGETS) + " |", "|---|" + "---|" * len(BUDGETS)]
    for scorer in scorers:
        parts = []
        for m in BUDGETS:
            mine, base = by.get((scorer, m), {}), by.get(("chunk-attention", m), {})
            counted = [k for k in mine if k in answered]
            if not counted:
                parts.append("-")
                continue
            k = sum(mine[key]["correct"] for key in counted)
            low, high = wilson_interval(k, len(counted))
            kl = mean_interval(mine[key].get("kl") for key in mine)
            text = f"{k}/{len(counted)} ({100 * low:.0f}-{100 * high:.0f}%); {kl['mean']:.3f}" if kl else f"{k}/{len(counted)}"
            shared = [key for key in counted if key in base]
            if scorer != "chunk-attention" and shared:
                d, lo, hi = _paired(mine, base, shared)
                diff = mean_interval(mine[key]["kl"] - base[key]["kl"] for key in mine if key in base
                                     and mine[key].get("kl") is not None and base[key].get("kl") is not None)
                text += f" · minus chunk-attention {100 * d:+.0f} ({100 * lo:+.0f} to {100 * hi:+.0f})"
                if diff and diff.get("low") is not None:
                    text += f"; KL {diff['mean']:+.3f} ({diff['low']:+.3f} to {diff['high']:+.3f})"
            parts.append(text)
        lines.append(f"| {scorer} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def _paired(mine: dict, base: dict, keys: list) -> tuple[float, float, float]:
    """Answered by ``mine`` minus by ``base`` on the same cases ``keys``: difference and Newcombe's 95%."""
    pairs = [(mine[key]["correct"], base[key]["correct"]) for key in keys]
    return paired_difference_interval(sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs),
                                      sum(b and not a for a, b in pairs), sum(not a and not b for a, b in pairs))


def one_cut_text(cells: list[dict], length: int) -> str:
    """The rule against the presses with the same information: memstep's default rule in one cut after a
    full prefill (`once`) minus each question-aware press at the same M, on the cases both ran that the
    full cache answers. Empty where no `once` ran beside a press."""
    answered = {case_of(c) for c in cells if c["length"] == length and c["config"]["kind"] == "memstep"
                and c["config"]["schedule"] == "full" and c["correct"]}
    once: dict[int, dict] = {}
    presses: dict[tuple, dict] = {}
    for c in cells:
        conf, key = c["config"], case_of(c)
        if c["length"] != length or key not in answered or conf.get("budget") not in BUDGETS:
            continue
        if conf["kind"] == "memstep" and conf["schedule"] == "once" and conf.get("question_aware") \
                and _at_defaults(conf):
            once.setdefault(conf["budget"], {})[key] = c
        elif conf["kind"] == "kvpress" and conf.get("question_aware"):
            presses.setdefault((conf["budget"], conf["scorer"]), {})[key] = c
    parts = []
    for (m, press), theirs in sorted(presses.items()):
        shared = [key for key in once.get(m, {}) if key in theirs]
        if shared:
            d, lo, hi = _paired(once[m], theirs, shared)
            parts.append(f"M = {m}: memstep {sum(once[m][k]['correct'] for k in shared)}/{len(shared)}, {press} "
                         f"{sum(theirs[k]['correct'] for k in shared)}/{len(shared)}, memstep minus {press} "
                         f"{100 * d:+.0f} ({100 * lo:+.0f} to {100 * hi:+.0f})")
    if not parts:
        return ""
    return ("With the information a press has (the whole document prefilled, then one cut), memstep's default "
            "rule against each press on the same cases (points, Newcombe 95%): " + "; ".join(parts) + ".")


def summary_text(summary: dict, cells: list[dict] | None = None) -> str:
    lengths = sorted({r["length"] for r in summary["rows"]})
    parts = []
    for length in lengths:
        full = next((r for r in summary["rows"] if r["length"] == length and r["config"]["kind"] == "memstep"
                     and r["config"]["schedule"] == "full"), None)
        if full is None:
            continue
        head = f"**{length:,} tokens**: the full cache answers {full['correct']} of {full['cells']} cases"
        if not any(r["length"] == length and r["config"].get("budget") in BUDGETS and r["config"].get("question_aware")
                   for r in summary["rows"]):
            parts.append(head + "; no memory has run on them yet.")
            continue
        cut = one_cut_text(cells or [], length)
        parts.append(head + "; each memory on those (answered, Wilson 95%; then minus memstep's default FM on the "
                     "same cases, points, Newcombe 95%):\n\n" + summary_table(summary, length)
                     + (f"\n\n{cut}" if cut else ""))
    return "\n\n".join(parts) if parts else "*No test-split results yet: `make bench-test-split`.*"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--docs", action="store_true", help="write README.md's and docs/test-split.md's blocks")
    args = parser.parse_args(argv)
    cells = ResultStore(args.folder).cells()
    summary = summarize(cells)
    text = summary_text(summary, cells)
    print(text)
    if args.docs:
        write_block("test-split-summary", text, COMMAND, doc=ROOT / "README.md")
        agnostic = [length for length in sorted({r["length"] for r in summary["rows"]})
                    if any(not r["config"].get("question_aware") and r["config"]["schedule"] != "full"
                           for r in summary["rows"] if r["length"] == length)]
        extra = "".join(f"\n\n**Question-agnostic scorers, {length:,} tokens** (memstep FM, c = 512, no question; "
                        "answered of the cases the full cache answers, Wilson 95%; KL from the full cache, nats per "
                        "token; each minus chunk-attention on the same cases, points, Newcombe 95%, and KL, t 95%):\n\n"
                        + agnostic_table(cells, length) for length in agnostic)
        write_block("test-split", text + extra + "\n\nEvery row, its settings as its cells recorded them:\n\n"
                    + fair_table(summary) + "\n\nPaired against memstep's default question-aware FM at the same "
                    "length and M:\n\n" + paired_table(summary), COMMAND, doc=ROOT / "docs" / "test-split.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
