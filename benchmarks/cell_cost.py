"""What one cell of `memstep eval` costs: per model, length and kind of configuration, the wall
seconds of a cell (its prefill, answer and continuation, in a worker with the model loaded) and
its worker's peak resident memory, from the cells of finished grids (each cell records both).
Prints a Markdown table; ``--block`` writes it into its block of docs/cluster.md.

    python benchmarks/cell_cost.py --block cell-cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

FOLDERS = ("results/eval", "results/eval-gemma3")
MODELS = {"results/eval": "SmolLM2-135M (embedded)", "results/eval-gemma3": "Gemma 3 270M"}


def kind_of(cell: dict) -> str:
    config = cell["config"]
    if config["kind"] == "kvpress":
        return "kvpress press"
    if config["kind"] == "hf":
        return "HF full cache"
    return "memstep full cache" if config["schedule"] == "full" else "memstep compressed"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def rows(folder: Path) -> list[dict]:
    groups = defaultdict(list)
    for line in (folder / "cells.jsonl").read_text().splitlines():
        cell = json.loads(line)
        if cell.get("seconds") is not None:
            groups[(cell["length"], kind_of(cell))].append(cell)
    out = []
    for (length, kind), cells in sorted(groups.items()):
        seconds = [c["seconds"] for c in cells]
        peaks = [c["peak_rss_bytes"] for c in cells if c.get("peak_rss_bytes")]
        threads = {(c.get("settings") or {}).get("threads") for c in cells} - {None}
        out.append({"length": length, "kind": kind, "cells": len(cells), "median_seconds": statistics.median(seconds),
                    "p90_seconds": percentile(seconds, 0.9),
                    "median_peak_gib": statistics.median(peaks) / 2**30 if peaks else None,
                    "threads": sorted(threads)})
    return out


def table(folders: list[str]) -> str:
    lines = ["| model | length | configuration | cells | seconds a cell, median | 90th percentile | worker's peak memory, median |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for name in folders:
        for row in rows(ROOT / name):
            peak = f"{row['median_peak_gib']:.2f} GiB" if row["median_peak_gib"] is not None else "n/a"
            lines.append(f"| {MODELS.get(name, name)} | {row['length']:,} | {row['kind']} | {row['cells']} | "
                         f"{row['median_seconds']:.1f} | {row['p90_seconds']:.1f} | {peak} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=",".join(FOLDERS), help="comma-separated results folders")
    parser.add_argument("--block", default=None, help="write the table into this block of docs/cluster.md")
    args = parser.parse_args(argv)
    text = table(args.results.split(","))
    print(text)
    if args.block:
        from docs_block import write_block

        write_block(args.block, text, "python benchmarks/cell_cost.py " + " ".join(argv if argv is not None else
                                                                                  sys.argv[1:]),
                    doc=ROOT / "docs" / "cluster.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
