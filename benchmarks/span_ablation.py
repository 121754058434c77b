"""Span-preserving selection against the token top-k and the presses, on the same cases.

Reads `memstep eval` results folders (cells.jsonl) and, per length and budget, counts each
configuration's answers on the cases memstep's full cache answers (Wilson 95% interval), the
answer's retention and whole-answer slots (t intervals), the entries it keeps (the range over cases:
ChunkKV rounds to whole chunks), and the paired difference of answered cases against reference
configurations (Newcombe's interval for paired proportions). Writes JSON beside the results and a
table into a block of docs/spans-and-niah.md.

    python benchmarks/span_ablation.py results/spans --block span-ablation \
        --versus "fm chunk-attention M={M} compact question-aware" "kvpress chunkkv M={M} question-aware"
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from memstep.evaluation.grid import upgrade_cell  # noqa: E402
from memstep.evaluation.metrics import case_of  # noqa: E402
from memstep.evaluation.stats import mean_interval, paired_difference_interval, wilson_interval  # noqa: E402
from memstep.presets import AUTO, resolve_rope  # noqa: E402
from memstep.question_pool import TUNED_SHARED_BELOW  # noqa: E402

FULL = "memstep full"


def load(*folders: Path) -> list[dict]:
    """The cells of the folders as the store reads them (an earlier default pool's cells under their
    pool), each key once (the first folder's cell wins)."""
    cells: dict = {}
    for folder in folders:
        for line in (folder / "cells.jsonl").read_text().splitlines():
            if line.strip():
                cell = upgrade_cell(json.loads(line))
                cells.setdefault(cell["key"], cell)
    return list(cells.values())


def _retention(cell: dict) -> float:
    """The share of the answer's (layer, KV head, token) entries a cell's memory holds, over its layers."""
    return sum(cell["retention"]) / len(cell["retention"])


def rows_of(cells: list[dict], versus: list[str], kind_filter=None) -> list[dict]:
    """One row per (length, budget, configuration), counted on the cases the full cache answers."""
    cells = [c for c in cells if kind_filter is None or c.get("kind") in kind_filter]
    answered = {(c["length"], case_of(c)) for c in cells if c["label"] == FULL and c["correct"]}
    by: dict = defaultdict(dict)
    for c in cells:
        if c["label"] != FULL and (c["length"], case_of(c)) in answered:
            by[(c["length"], c["config"].get("budget"), c["label"])][case_of(c)] = c
    rows = []
    for (length, budget, label), group in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
        n = len(group)
        k = sum(c["correct"] for c in group.values())
        low, high = wilson_interval(k, n)
        row = {"length": length, "budget": budget, "label": label, "answered": k, "cases": n,
               "low": low, "high": high,
               "retention": mean_interval([_retention(c) for c in group.values() if c.get("retention")]),
               "whole": mean_interval([c["needle_whole"] for c in group.values() if c.get("needle_whole") is not None]),
               "entries": sorted({c.get("memory_entries") for c in group.values()} - {None}),
               "paired": {}}
        for pattern in versus:
            other_label = pattern.replace("{M}", str(budget)).replace("{ROPE}", default_rope(budget))
            other = by.get((length, budget, other_label))
            if not other or other_label == label:
                continue
            shared = sorted(set(group) & set(other))
            pairs = [(group[s]["correct"], other[s]["correct"]) for s in shared]
            counts = (sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs),
                      sum(b and not a for a, b in pairs), sum(not a and not b for a, b in pairs))
            if shared:
                diff, lo, hi = paired_difference_interval(*counts)
                # the answer's retention, case by case: this configuration's minus the other's (t interval)
                kept = mean_interval([_retention(group[s]) - _retention(other[s]) for s in shared
                                      if group[s].get("retention") and other[s].get("retention")])
                row["paired"][other_label] = {"cases": len(shared), "difference": diff, "low": lo, "high": hi,
                                              "only_this": counts[1], "only_other": counts[2],
                                              "retention_difference": kept}
        rows.append(row)
    return rows


def default_rope(budget: int | None) -> str:
    """The RoPE positions the default of these runs' day (the tuned recipe, --question-pool tuned) read a
    question-aware FM memory of ``budget`` at: shared below 256 entries per head, compact from 256 up."""
    return resolve_rope(AUTO, schedule="fm", memory=budget or 0, question_aware=True, shared_below=TUNED_SHARED_BELOW)


def _mi(found, digits=2) -> str:
    if not found:
        return "-"
    if found["low"] is None:
        return f"{found['mean']:.{digits}f}"
    return f"{found['mean']:.{digits}f} [{found['low']:.{digits}f}, {found['high']:.{digits}f}]"


def _entries(values: list[int]) -> str:
    if not values:
        return "-"
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _kept(paired: dict) -> str:
    found = paired.get("retention_difference")
    if not found or found["low"] is None:
        return ""
    return f"; retention {found['mean']:+.2f} [{found['low']:+.2f}, {found['high']:+.2f}]"


def markdown(rows: list[dict]) -> str:
    lines = ["| length | M | configuration | answered (95% CI) | answer retention | whole-answer slots | entries | "
             "paired difference in answered (95% CI) |",
             "|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        paired = "; ".join(f"vs {other.replace(' chunk-attention', '').replace(' question-aware', '')}: "
                           f"{100 * p['difference']:+.0f} pts [{100 * p['low']:+.0f}, {100 * p['high']:+.0f}] "
                           f"({p['only_this']} only here, {p['only_other']} only there{_kept(p)})"
                           for other, p in r["paired"].items()) or "-"
        lines.append(f"| {r['length']} | {r['budget']} | {r['label']} | {r['answered']}/{r['cases']} "
                     f"({100 * r['low']:.0f}-{100 * r['high']:.0f}%) | {_mi(r['retention'])} | {_mi(r['whole'])} | "
                     f"{_entries(r['entries'])} | {paired} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--with", dest="more", type=Path, nargs="*", default=[],
                   help="other results folders whose cells count too (the full cache and the M = 512 rows of "
                        "results/eval: `memstep eval` reuses them when their cells.jsonl is copied in first)")
    p.add_argument("--versus", nargs="*", default=["fm chunk-attention M={M} compact question-aware",
                                                    "kvpress chunkkv M={M} question-aware"],
                   help="labels each row is paired with; {M}: the row's budget, {ROPE}: the RoPE positions "
                        "memstep's default reads a question-aware memory of that budget at")
    p.add_argument("--kinds", default=None, help="needle kinds to count (default all)")
    p.add_argument("--lengths", default=None, help="lengths to show, comma-separated (default all)")
    p.add_argument("--match", default=r"^fm chunk-attention M=\d+ compact question-aware( pool=(max|follow):15)?( span=\S+)?$"
                   r"|^kvpress chunkkv",
                   help="the configurations shown (a regular expression on the label; default: question-aware FM "
                        "with and without spans, at the default pool and the earlier follow:15 and max:15, and kvpress ChunkKV)")
    p.add_argument("--block", default=None, help="write the table into this block of --doc")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "spans-and-niah.md")
    p.add_argument("--json", default="span_ablation.json", help="file name of the rows, in the results folder")
    p.add_argument("--command", default=None, help="the command recorded under the table")
    args = p.parse_args(argv)
    rows = rows_of(load(args.folder, *args.more), args.versus, set(args.kinds.split(",")) if args.kinds else None)
    lengths = {int(n) for n in args.lengths.split(",")} if args.lengths else None
    rows = [r for r in rows if re.search(args.match, r["label"]) and (lengths is None or r["length"] in lengths)]
    (args.folder / args.json).write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    print(table)
    if args.block:
        from docs_block import write_block

        # the command as given, so the table can be made again from the committed cells
        given = shlex.join(["python", "benchmarks/span_ablation.py", *(sys.argv[1:] if argv is None else argv)])
        write_block(args.block, table, args.command or given, doc=args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
