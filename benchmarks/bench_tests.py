"""The test suite's own cost: one pytest run, timed as wall and CPU seconds, with its 20 slowest
tests; or (``--scans``) the exhaustive scans that the suite only samples, run whole
(MEMSTEP_FULL_SCANS=1, the tests marked ``scan``).

Two CPU figures: user + system of pytest and the processes it waited for (its workers, the app's
servers, subprocesses), and, on Linux, the whole machine's busy CPU over the run (/proc/stat),
which also counts what no waiting parent reports: Chromium's page processes, about a third of the
suite's CPU. The machine figure is the suite's only on a quiet machine.

    OMP_NUM_THREADS=1 python benchmarks/bench_tests.py [--scans] [--docs] [-- PYTEST_ARGS]

Writes benchmarks/results/bench_tests[_scans].json and the pytest log beside it; ``--docs``
writes the table into docs/benchmarks.md (block ``bench-tests``, or ``bench-tests-scans``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_block import write_block  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux), else None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run(args: list[str], env: dict) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = machine_busy_seconds()
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=20", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_after = machine_busy_seconds()
    output = proc.stdout + proc.stderr
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in SUMMARY.findall(tail)}
    slowest = [{"seconds": float(m.group(1)), "phase": m.group(2), "test": m.group(3)}
               for m in map(DURATION.match, output.splitlines()) if m]
    return {"exit_code": proc.returncode, "wall_seconds": round(wall, 1),
            "cpu_seconds": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
            "machine_busy_seconds": None if busy is None or busy_after is None else round(busy_after - busy, 1),
            "counts": counts, "slowest": slowest[:20], "summary": tail, "output": output}


def table(result: dict, scans: bool) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in result["counts"].items())
    what = "the scans the suite samples, run whole" if scans else "the whole suite"
    machine = result.get("machine_busy_seconds")
    busy = f", the machine busy {machine / 60:.1f} CPU-min" if machine is not None else ""
    lines = [f"{what.capitalize()}: {counts}; {result['wall_seconds'] / 60:.1f} min wall, "
             f"{result['cpu_seconds'] / 60:.1f} CPU-min of pytest and what it waited for{busy} "
             f"({result['machine']}).", "",
             "| slowest | phase | seconds (wall) |", "| --- | --- | ---: |"]
    lines += [f"| `{s['test']}` | {s['phase']} | {s['seconds']:.1f} |" for s in result["slowest"][:10]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", action="store_true", help="run the sampled scans whole (the tests marked scan)")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (test files, -m ...; "
                        "`make test` runs -n 2 --dist loadgroup --no-loadscope-reorder)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    extra = list(args.pytest_args)
    if args.scans:
        env["MEMSTEP_FULL_SCANS"] = "1"
        extra = ["-m", "scan", *extra]
    result = run(extra, env)
    result["machine"] = f"{os.cpu_count()} cores, {platform.machine()}, load {os.getloadavg()[0]:.1f} at the end"
    name = "bench_tests_scans" if args.scans else "bench_tests"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.log").write_text(result.pop("output"))
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result, args.scans))
    if args.docs:
        write_block("bench-tests-scans" if args.scans else "bench-tests", table(result, args.scans),
                    "python benchmarks/bench_tests.py" + (" --scans" if args.scans else "") + " --docs"
                    + (" -- " + " ".join(args.pytest_args) if args.pytest_args else ""))
    sys.exit(result["exit_code"])


if __name__ == "__main__":
    main()
