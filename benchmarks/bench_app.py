"""How fast the app feels: page load, first streamed update after Run, the default example's run.

Launches the app as `make demo` does (default model loaded before the first visit), opens
it in headless Chromium and measures what a visitor waits for:

- page load: from navigation to the schedule preview drawn, in a fresh browser (cold: every
  asset downloaded, Plotly included) and on a reload (warm: assets cached); target within 3 s;
- first update: from the Run click to the first streamed update on the page (the run's
  schedule drawn, before any step: target within 2 s), and to the first finished step;
- the default example's run (the app's default: a 1,500-token passkey document, IMDC,
  chunk = memory = 512, with the full cache's answer, cached after the first run) from the
  Run click to "done" on the page (target within 20 s), the engine's own prefill seconds (the
  sum of its steps), and the CPU seconds the app's process used meanwhile: on a shared
  machine, wall seconds well above CPU seconds / threads mean the run waited for cores other
  jobs held.

    .venv/bin/python benchmarks/bench_app.py --docs      # -> benchmarks/results/bench_app_<device>.json
    .venv/bin/python benchmarks/bench_app.py --repeats 1 # one run of each

Prints a Markdown table; --docs also writes it into docs/benchmarks.md. On a shared CPU
timings are noisy: the load average is recorded with them; rerun at a quiet moment before
quoting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.docs_block import write_block  # noqa: E402
from ui.browser import chromium_page, open_app, serve, stat, wait_for_state  # noqa: E402
from ui.layout import build_app  # noqa: E402
from ui.models import get_model  # noqa: E402

TARGETS = {"page_load_s": 3.0, "page_reload_s": 3.0, "first_update_s": 2.0, "run_s": 20.0}
LABELS = {
    "page_load_s": "page load, fresh browser (navigation to the preview drawn)",
    "page_reload_s": "page load, assets cached",
    "first_update_s": "first streamed update after Run",
    "first_step_s": "first step drawn after Run",
    "run_s": "the default example's run, Run to done (answer and full-cache answer on the page)",
    "prefill_s": "of which the prefill (engine steps only)",
    "run_cpu_s": "CPU seconds the app process used during that run (all threads)",
}


def wait_for_step(page, text: str, timeout_s: float) -> None:
    page.wait_for_function(
        "t => { const el = document.querySelector('#stats [data-stat=steps] .memstep-stat-value');"
        " return el && el.innerText.startsWith(t); }", arg=text, timeout=timeout_s * 1000)


def measure_once(url: str) -> dict:
    with chromium_page() as page:
        load = open_app(page, url)
        reload = open_app(page, url)
        page.mouse.move(0, 0)
        began, cpu = time.perf_counter(), time.process_time()
        page.locator("#run").click()
        wait_for_step(page, "0 /", 60)  # the run's schedule is on the page, no step yet
        first_update = time.perf_counter() - began
        wait_for_step(page, "1 /", 300)
        first_step = time.perf_counter() - began
        wait_for_state(page, "done", 900)
        run = time.perf_counter() - began
        cpu = time.process_time() - cpu  # this process serves the app and runs the engine
        prefill = float(stat(page, "seconds").split()[0])
        steps = stat(page, "steps")
        tokens = stat(page, "tokens")
    return {"page_load_s": load, "page_reload_s": reload, "first_update_s": first_update, "first_step_s": first_step,
            "run_s": run, "prefill_s": prefill, "run_cpu_s": cpu, "steps": steps, "tokens": tokens}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--docs", action="store_true", help="also write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)

    lm = get_model(None)  # as `make demo` does: the model is in memory before the first visit
    demo = build_app()
    runs = []
    with serve(demo) as url:
        for i in range(args.repeats):
            runs.append(measure_once(url))
            print(f"repeat {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()
                                                  if isinstance(v, float)), file=sys.stderr)
    medians = {key: statistics.median(r[key] for r in runs) for key in LABELS}
    result = {
        "device": lm.device, "model": lm.name, "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "load_average": os.getloadavg(), "repeats": runs, "median": medians, "targets": TARGETS,
        "document": runs[0]["tokens"].split("/")[-1].strip() + " tokens, " + runs[0]["steps"].split("/")[-1].strip()
        + " steps",
    }
    output = args.output or ROOT / "benchmarks" / "results" / f"bench_app_{lm.device}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))

    table = markdown(result)
    print(table)
    if args.docs:
        write_block("bench-app", table, "benchmarks/bench_app.py --docs")
    print(f"\nwrote {output}", file=sys.stderr)
    return 0


def markdown(result: dict) -> str:
    medians = result["median"]
    lines = [f"| measure ({result['device']}, {result['cpu_count']} cores; {result['document']}; median of "
             f"{len(result['repeats'])}) | seconds | target |", "|---|---|---|"]
    for key, label in LABELS.items():
        target = f"≤ {TARGETS[key]:.0f} s" if key in TARGETS else ""
        lines.append(f"| {label} | {medians[key]:.2f} | {target} |")
    load = ", ".join(f"{x:.1f}" for x in result["load_average"])
    lines.append(f"\nLoad average (1, 5, 15 minutes) when the measurements ended: {load} on "
                 f"{result['cpu_count']} cores.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
