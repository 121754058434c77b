"""What IMDC saves against FM on hybrid-attention models, planned.

On a model whose layers are all global, a memory budget bounds every layer's KV. Gemma 3
and gpt-oss keep most layers sliding: their KV is bounded by the window whatever the
schedule, so only the global layers' memory moves with FM vs IMDC. This plans both
schedules at 32k, 64k and 128k tokens with the seed paper's chunk = memory = 1024 (bf16, 4
sinks, linear growth, memstep's SDPA engine evicting per layer, on an H200) for the
Gemma 3 family and gpt-oss, beside Llama-3.1-8B (all layers global), and writes the numbers
and a Markdown table.

    .venv/bin/python benchmarks/hybrid_saving.py          # -> benchmarks/results/hybrid_saving.json
    .venv/bin/python benchmarks/hybrid_saving.py --docs   # and its table in docs/benchmarks.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memstep import planner
from memstep.memory import format_bytes
from memstep.planner.catalogue import MODEL_NAMES, resolve_model

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "benchmarks" / "results" / "hybrid_saving.json"
MODELS = ("llama-3.1-8b", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b")
TOKENS = (32768, 65536, 131072)
SETTING = dict(chunk=1024, memory=1024, growth="linear", dtype="bf16", sinks=4, attention="sdpa")
GPU = "h200-141gb"


def rows() -> list[dict]:
    out = []
    for model in MODELS:
        shape = resolve_model(model, SETTING["dtype"])
        for tokens in TOKENS:
            plans = planner.compare(model, GPU, schedules=("full", "fm", "imdc"), tokens=tokens, **SETTING)
            full, fm, imdc = plans["full"], plans["fm"], plans["imdc"]
            weights = fm.steps[0].parts["weights"]
            out.append({
                "model": MODEL_NAMES[model], "tokens": tokens, "layers": shape.layers,
                "layers_by_type": {k.split("_")[0]: v for k, v in shape.kinds.counts().items()},
                "window": shape.kinds.window, "weights_bytes": weights,
                "full_kv_peak_bytes": full.kv_peak_bytes, "fm_kv_peak_bytes": fm.kv_peak_bytes,
                "imdc_kv_peak_bytes": imdc.kv_peak_bytes,
                "fm_peak_bytes": fm.peak_bytes, "imdc_peak_bytes": imdc.peak_bytes,
                "kv_saved": 1 - imdc.kv_peak_bytes / fm.kv_peak_bytes,
                "memory_saved": 1 - imdc.peak_bytes / fm.peak_bytes,
                "memory_saved_without_weights": 1 - (imdc.peak_bytes - weights) / (fm.peak_bytes - weights),
                "fm_seconds": fm.seconds, "imdc_seconds": imdc.seconds, "speedup": fm.seconds / imdc.seconds,
                "fm_kv_by_type_last_step": fm.steps[-1].kv_bytes_by_type,
            })
    return out


def markdown(report: dict) -> str:
    lines = ["| model (global + sliding layers, window) | tokens | KV full prefill | KV FM → IMDC | KV saved | "
             "peak above weights FM → IMDC | saved without weights | saved with weights | FM / IMDC time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        kinds = r["layers_by_type"]
        layers = (f"{kinds.get('full', 0)} + {kinds.get('sliding', 0)}, {r['window']}" if r["window"]
                  else f"{r['layers']} global")
        above = (format_bytes(r["fm_peak_bytes"] - r["weights_bytes"]), format_bytes(r["imdc_peak_bytes"] - r["weights_bytes"]))
        lines.append(
            f"| {r['model']} ({layers}) | {r['tokens'] // 1024}k | {format_bytes(r['full_kv_peak_bytes'])} | "
            f"{format_bytes(r['fm_kv_peak_bytes'])} → {format_bytes(r['imdc_kv_peak_bytes'])} | {r['kv_saved']:.1%} | "
            f"{above[0]} → {above[1]} | {r['memory_saved_without_weights']:.1%} | **{r['memory_saved']:.1%}** | "
            f"{r['fm_seconds']:.2f} s / {r['imdc_seconds']:.2f} s, {r['speedup']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    report = {"setting": {**SETTING, "gpu": GPU}, "rows": rows()}
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    print(table)
    if "--docs" in argv:
        from docs_block import write_block

        write_block("hybrid-saving", table, "benchmarks/hybrid_saving.py --docs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
