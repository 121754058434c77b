"""What `memstep eval --executor ray` adds to a grid's cost: one grid run by each executor into a
fresh folder, as a user runs it (a process of its own), timed as wall seconds and CPU seconds of
the whole process tree: the driver, its worker processes, and Ray's own processes (gathered as
orphans by this process, a child subreaper on Linux, so their CPU is counted too). The machine's
other load moves the wall seconds; the CPU seconds are the comparable figure.

    OMP_NUM_THREADS=1 python benchmarks/bench_ray.py [--workers 2] [--threads 1] [--block bench-ray]

Writes benchmarks/results/bench_ray.json and prints a table (``--block``: into docs/cluster.md).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_block import write_block  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "bench_ray.json"
# the acceptance grid: 2 texts x 2 depths at 512 tokens, memstep's full cache and FM: 8 cells
GRID = "--lengths 512 --depths 0.3,0.7 --schedules full,fm --budgets 128 --chunk 128 --needles passkey " \
       "--metrics accuracy --continuation-tokens 0"
CLI = "import sys; from memstep.cli import main; sys.exit(main(sys.argv[1:]))"


def gather_orphans() -> None:
    """Make this process the subreaper of everything it starts (Linux): a process whose parent dies
    (Ray's workers when Ray stops) becomes this one's child, so its CPU seconds are counted."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_all() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def run(executor: list[str], threads: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", CLI, "eval", *GRID.split(), "--threads", str(threads), "--quiet",
                               "--json", "--output", folder, *executor], cwd=ROOT, capture_output=True, text=True)
        reap_all()  # Ray's processes, once they end (they end with it)
        wall = time.monotonic() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"memstep eval {' '.join(executor)} failed: {proc.stderr.strip()[-500:]}")
        summary = json.loads(proc.stdout)
    return {"executor": " ".join(executor) or "--executor local", "cells": summary["run"]["ran"],
            "workers": summary["run"]["executor"]["workers"], "wall_seconds": round(wall, 1),
            "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)}


def table(saved: dict) -> str:
    lines = [f"`memstep eval {GRID} --threads {saved['threads']}` on {saved['machine']}:", "",
             "| executor | cells | workers | wall seconds | CPU seconds, all processes |", "|---|---:|---:|---:|---:|"]
    for row in saved["runs"]:
        lines.append(f"| `{row['executor']}` | {row['cells']} | {row['workers']} | {row['wall_seconds']} | "
                     f"{row['cpu_seconds']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--block", default=None, help="write the table into this block of docs/cluster.md")
    args = parser.parse_args()
    gather_orphans()
    runs = [run([], args.threads), run(["--executor", "ray", "--workers", str(args.workers)], args.threads)]
    saved = {"threads": args.threads, "machine": f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} "
                                                  "at the end)", "runs": runs}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(saved, indent=1))
    text = table(saved)
    print(text)
    if args.block:
        write_block(args.block, text, "python benchmarks/bench_ray.py " + " ".join(sys.argv[1:]),
                    doc=ROOT / "docs" / "cluster.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
