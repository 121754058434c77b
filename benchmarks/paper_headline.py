"""The seed paper's headline with the planner: what IMDC saves against FM.

Memorize Step by Step reports IMDC 1.45x faster than FM with 23.3% less GPU memory for
Llama-2-7B on 32k tokens with chunk 1024 and memory 1024. This plans that setting as the
reference code runs it (padded (memory + chunk)^2 eager attention, eviction after the
whole forward, every layer's attention maps kept until the forward returns), the same
without the kept maps, and an efficient setting (SDPA, eviction right after each layer's
attention, as memstep's engine does), and writes the numbers and a Markdown table.

    .venv/bin/python benchmarks/paper_headline.py      # -> benchmarks/results/paper_headline.json
    .venv/bin/python benchmarks/paper_headline.py --docs   # and its table in docs/benchmarks.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memstep import planner

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "benchmarks" / "results" / "paper_headline.json"
PAPER = dict(model="llama-2-7b", tokens=32768, chunk=1024, memory=1024, growth="linear", dtype="bf16", sinks=4)
SETTINGS = {
    "reference code as written (padded, evict after forward, all layers' maps kept)":
        dict(attention="padded", keep_maps=True),
    "padded, evict after forward, one layer's maps": dict(attention="padded"),
    "eager, evict per layer": dict(attention="eager"),
    "SDPA, evict per layer (memstep's engine)": dict(attention="sdpa"),
}
GPUS = ("a100-80gb", "h100-80gb")


def headline() -> dict:
    rows = []
    for label, extra in SETTINGS.items():
        for gpu in GPUS:
            settings = {k: v for k, v in PAPER.items() if k != "model"} | extra
            plans = planner.compare(PAPER["model"], gpu, schedules=("fm", "imdc"), **settings)
            fm, imdc = plans["fm"], plans["imdc"]
            widest = {name: max(s.memory_before + s.chunk_size for s in p.steps) for name, p in plans.items()}
            rows.append({
                "setting": label, "gpu": fm.gpu.name, **extra,
                "fm_peak_bytes": fm.peak_bytes, "imdc_peak_bytes": imdc.peak_bytes,
                "weights_bytes": fm.steps[0].parts["weights"],
                "memory_saved": 1 - imdc.peak_bytes / fm.peak_bytes,
                "memory_saved_without_weights": 1 - (imdc.peak_bytes - imdc.steps[0].parts["weights"])
                / (fm.peak_bytes - fm.steps[0].parts["weights"]),
                "fm_seconds": fm.seconds, "imdc_seconds": imdc.seconds, "speedup": fm.seconds / imdc.seconds,
                "fm_widest_step": widest["fm"], "imdc_widest_step": widest["imdc"],
                "fm_seconds_parts": {k: sum(s.seconds_parts[k] for s in fm.steps) for k in planner.TIME_PARTS},
                "imdc_seconds_parts": {k: sum(s.seconds_parts[k] for s in imdc.steps) for k in planner.TIME_PARTS},
            })
    return {"paper": {"memory_saved": 0.233, "speedup": 1.45}, "setting": PAPER,
            "efficiency": planner.DEFAULT_EFFICIENCY, "bandwidth_efficiency": planner.DEFAULT_BANDWIDTH_EFFICIENCY,
            "rows": rows}


def markdown(report: dict) -> str:
    """One row per setting: memory (the same on every GPU) and the speed-up on each GPU."""
    gib = 1 << 30
    by_setting: dict[str, list[dict]] = {}
    for r in report["rows"]:
        by_setting.setdefault(r["setting"], []).append(r)
    gpus = [r["gpu"] for r in next(iter(by_setting.values()))]
    lines = ["| setting | FM peak | IMDC peak | memory saved | saved without weights | "
             + " | ".join(f"FM / IMDC time, speed-up ({g})" for g in gpus) + " |",
             "|---|---|---|---|---|" + "---|" * len(gpus)]
    for label, rows in by_setting.items():
        r = rows[0]
        times = " | ".join(f"{x['fm_seconds']:.2f} s / {x['imdc_seconds']:.2f} s, **{x['speedup']:.2f}x**" for x in rows)
        lines.append(f"| {label} | {r['fm_peak_bytes'] / gib:.2f} GiB | {r['imdc_peak_bytes'] / gib:.2f} GiB | "
                     f"**{r['memory_saved']:.1%}** | {r['memory_saved_without_weights']:.1%} | {times} |")
    paper = report["paper"]
    lines.append(f"| paper (reported) | | | **{paper['memory_saved']:.1%}** | | "
                 + " | ".join(f"**{paper['speedup']:.2f}x**" if i == 0 else "" for i in range(len(gpus))) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    report = headline()
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    if "--docs" in (sys.argv[1:] if argv is None else argv):
        sys.path.insert(0, str(ROOT))
        from benchmarks.docs_block import write_block

        write_block("paper-headline", markdown(report), "benchmarks/paper_headline.py --docs")
    print(f"wrote {OUTPUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
