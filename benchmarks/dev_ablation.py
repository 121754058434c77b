"""The question-aware memory's development ablation, as a table: every configuration run into
``results/dev-rule`` (dev split only: the Austen needle cases at 2,048 tokens), counted on the
cases the full cache answers, against the recipe that was the default when it ran (now
``--question-pool tuned``) at the same budget on the same cases (paired difference, Newcombe's 95%
interval), with the answer's retention beside it.

    .venv/bin/python benchmarks/dev_ablation.py                       # print the table
    .venv/bin/python benchmarks/dev_ablation.py --docs                # and write docs/question-aware.md's block
    .venv/bin/python benchmarks/dev_ablation.py --docs --folder results/dev-rule-4k --block dev-ablation-4k

Reads only what the runs wrote; the commands that filled the folder are in docs/question-aware.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.docs_block import write_block  # noqa: E402
from memstep.evaluation.stats import paired_difference_interval, wilson_interval  # noqa: E402

FOLDER = ROOT / "results" / "dev-rule"
DOC = ROOT / "docs" / "question-aware.md"
FULL = "memstep full"
TODAY = "max:15"  # today's default pool (weight 1, shared positions), the baseline of --versus today


def pool_of(label: str) -> str | None:
    """The pool a label names (None: the default of the day it ran, the tuned recipe)."""
    found = re.search(r"pool=(\S+)", label)
    return found.group(1) if found else None


def case_key(cell: dict) -> tuple:
    return cell.get("haystack"), cell["depth"], cell["seed"], cell.get("kind", "passkey")


def counted(cells: list[dict]) -> dict[str, dict[tuple, dict]]:
    """label -> {case: cell}, only the cases the full cache answers."""
    answered = {case_key(c) for c in cells if c["label"] == FULL and c["correct"]}
    by: dict[str, dict[tuple, dict]] = collections.defaultdict(dict)
    for c in cells:
        if c["label"] != FULL and case_key(c) in answered:
            by[c["label"]][case_key(c)] = c
    return by


def budget_of(label: str) -> int:
    return int(re.search(r"M=(\d+)", label).group(1))


def is_default(label: str) -> bool:
    """The label of the default of the day these cells ran (the tuned recipe): FM, chunk-attention,
    question-aware, no pool or weight named, the positions `auto` then picked (shared at 128, compact above)."""
    return label.startswith("fm ") and "pool=" not in label and "weight=" not in label and (
        (" shared " in label) or (" compact " in label))


def describe(label: str) -> str:
    schedule = {"fm": "FM", "once": "one cut", "imdc": "IMDC"}[label.split()[0]]
    positions = next(p for p in ("document", "compact", "shared") if f" {p} " in label)
    pool = f"`{pool_of(label)}`, weight 1" if pool_of(label) else "the tuned recipe"
    return f"{schedule}, {pool}, {positions} positions"


def retention(cell: dict) -> float | None:
    value = cell.get("retention")
    if isinstance(value, list):
        return sum(value) / len(value) if value else None
    return value


def is_today(label: str) -> bool:
    """Today's default at shared positions (what `auto` picks for it on these lengths)."""
    return pool_of(label) == TODAY and " shared " in label and "weight=1" in label


def groups_against_tuned(labels) -> list[tuple[list[str], str | None, str]]:
    """Per budget: its labels, the tuned recipe's (the default when these ran) and its name."""
    out = []
    for budget in sorted({budget_of(label) for label in labels}):
        group = [label for label in labels if budget_of(label) == budget]
        out.append((group, next((label for label in group if is_default(label)), None), "**then the default**: "))
    return out


def groups_against_today(labels) -> list[tuple[list[str], str | None, str]]:
    """Per schedule and budget: today's default and the pools built on it (max:15+...), at shared positions."""
    mine = [label for label in labels if " shared " in label and (pool_of(label) or "").startswith(TODAY)]
    out = []
    for schedule in ("fm", "imdc"):
        for budget in sorted({budget_of(label) for label in mine if label.split()[0] == schedule}):
            group = [label for label in mine if label.split()[0] == schedule and budget_of(label) == budget]
            out.append((group, next((label for label in group if is_today(label)), None), "**the default**: "))
    return out


VERSUS = {"tuned": ("the tuned recipe", groups_against_tuned), "today": ("today's default", groups_against_today)}


def table(cells: list[dict], versus: str = "tuned") -> str:
    by = counted(cells)
    against, groups = VERSUS[versus]
    lines = [f"| M | memory | answered (95% CI) | minus {against} on the same cases (points, 95% CI) | "
             "answer's retention |", "|---:|---|---:|---|---:|"]
    for labels, default, mark in groups(list(by)):
        budget = budget_of(labels[0])
        order = sorted(labels, key=lambda label: (label != default, label.split()[0] != "fm", label))
        for label in order:
            got = by[label]
            right = sum(c["correct"] for c in got.values())
            low, high = wilson_interval(right, len(got))
            kept = [r for r in map(retention, got.values()) if r is not None]
            diff = ""
            if default and label != default:
                common = [k for k in got if k in by[default]]
                pairs = [(got[k]["correct"], by[default][k]["correct"]) for k in common]
                if pairs:
                    d, lo, hi = paired_difference_interval(sum(a and b for a, b in pairs),
                                                           sum(a and not b for a, b in pairs),
                                                           sum(b and not a for a, b in pairs),
                                                           sum(not a and not b for a, b in pairs))
                    diff = f"{100 * d:+.0f} ({100 * lo:+.0f} to {100 * hi:+.0f}) on {len(pairs)}"
            name = (mark if label == default else "") + describe(label)
            lines.append(f"| {budget} | {name} | {right}/{len(got)} ({100 * low:.0f}-{100 * high:.0f}%) | {diff} | "
                         f"{sum(kept) / len(kept):.2f} |" if kept else f"| {budget} | {name} | {right}/{len(got)} | "
                         f"{diff} | |")
    return "\n".join(lines)


def _pairs(cells: list[dict], pool: str, budget: int) -> list[tuple[bool, bool]]:
    """(``pool``'s FM answer, today's default's) on each case both ran at ``budget`` that the full cache answers."""
    by = counted(cells)
    mine = next((label for label in by if label.startswith(f"fm chunk-attention M={budget} ") and " shared " in label
                 and pool_of(label) == pool and "weight=1" in label), None)
    base = next((label for label in by if label.startswith(f"fm chunk-attention M={budget} ") and is_today(label)), None)
    if mine is None or base is None:
        return []
    return [(by[mine][k]["correct"], by[base][k]["correct"]) for k in by[mine] if k in by[base]]


def _difference(pairs: list[tuple[bool, bool]]) -> tuple[str, float, float]:
    d, lo, hi = paired_difference_interval(sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs),
                                           sum(b and not a for a, b in pairs), sum(not a and not b for a, b in pairs))
    return f"{sum(a for a, _ in pairs)} vs {sum(b for _, b in pairs)} of {len(pairs)}: " \
        f"{100 * d:+.0f} ({100 * lo:+.0f} to {100 * hi:+.0f})", lo, hi


def decision(folders: list[Path], pool: str, budgets=(128, 256)) -> str:
    """``pool`` against today's default, FM, per length and budget pooled over ``folders`` (the rounds),
    then pooled over everything: the rule fixed in docs/question-aware.md before the second round ran
    (pooled interval above 0, and no (length, M) interval below 0)."""
    by_cell: dict[tuple[int, int], list] = collections.defaultdict(list)
    for folder in folders:
        cells = [json.loads(line) for line in (folder / "cells.jsonl").read_text().splitlines() if line.strip()]
        for length in sorted({c["length"] for c in cells}):
            for budget in budgets:
                by_cell[length, budget] += _pairs([c for c in cells if c["length"] == length], pool, budget)
    lines = [f"| length | M | `{pool}` vs the default, answered (points, 95% CI) |", "|---:|---:|---|"]
    every, below = [], []
    for (length, budget), pairs in sorted(by_cell.items()):
        if not pairs:
            continue
        every += pairs
        text, _, hi = _difference(pairs)
        below += [f"{length} tokens, M = {budget}"] if hi < 0 else []
        lines.append(f"| {length} | {budget} | {text} |")
    text, lo, _ = _difference(every)
    lines.append(f"| pooled | {', '.join(map(str, budgets))} | {text} |")
    adopt = lo > 0 and not below
    lines += ["", f"By the rule fixed before the second round: {'adopt' if adopt else 'keep the default'} "
              f"(pooled interval {'above 0' if lo > 0 else 'not above 0'}; "
              f"{'below 0 at ' + ', '.join(below) if below else 'no length and M below 0'})."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--docs", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    parser.add_argument("--block", default="dev-ablation", help="the block of the doc it writes (dev-ablation-4k "
                        "for results/dev-rule-4k)")
    parser.add_argument("--versus", choices=tuple(VERSUS), default="tuned", help="the baseline of each row: the "
                        "tuned recipe (the default the folder's first runs had) or today's default and the pools built on it")
    parser.add_argument("--decide", nargs="+", type=Path, metavar="FOLDER", help="pooled over these folders: "
                        "`--pool` against today's default, FM at M = 128 and 256 (writes the block dev-carry-decision)")
    parser.add_argument("--pool", default="max:15+carry", help="the pool --decide weighs (default max:15+carry)")
    args = parser.parse_args(argv)
    if args.decide:
        text = decision([f.resolve() for f in args.decide], args.pool)
        print(text)
        if args.docs:
            write_block("dev-carry-decision", text, "python benchmarks/dev_ablation.py --docs --decide "
                        + " ".join(str(f) for f in args.decide), doc=DOC)
        return 0
    args.folder = args.folder.resolve()
    cells = [json.loads(line) for line in (args.folder / "cells.jsonl").read_text().splitlines() if line.strip()]
    text = table(cells, args.versus)
    print(text)
    if args.docs:
        command = "python benchmarks/dev_ablation.py --docs" + (
            "" if args.folder == FOLDER else f" --folder {args.folder.relative_to(ROOT)}") + (
            "" if args.block == "dev-ablation" else f" --block {args.block}") + (
            "" if args.versus == "tuned" else f" --versus {args.versus}")
        write_block(args.block, text, command, doc=DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
