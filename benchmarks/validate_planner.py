"""Run the engine on whatever device is here and put the planner's predictions next to what
was measured, step by step: peak bytes (CUDA: torch.cuda.max_memory_allocated over each
step; CPU: not measurable), KV bytes of the real cache tensors, and seconds.

    .venv/bin/python benchmarks/validate_planner.py                      # embedded model, auto device
    .venv/bin/python benchmarks/validate_planner.py --device cuda --tokens 8192 --chunk 1024 --memory 1024

Writes benchmarks/results/validate_planner_<device>.json. Seconds are modeled only on a GPU
the planner knows (recognised by name, or --gpu); on CPU they are null.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "assets" / "pride_and_prejudice_ch1-12.txt"
RESULTS = ROOT / "benchmarks" / "results"


def detect_gpu(device_name: str, total_bytes: int) -> str | None:
    """The planner preset of a CUDA device, from its name (None when unknown)."""
    name = device_name.upper()
    for marker, preset in (("H200", "h200-141gb"), ("H100", "h100-80gb"), ("A10G", "a10g"),
                           ("L4", "l4"), ("T4", "t4")):
        if marker in name:
            return preset
    if "A100" in name:
        return "a100-80gb" if total_bytes > 60 * (1 << 30) else "a100-40gb"
    return None


def validate(model: str = "embedded", device: str = "auto", dtype: str = "auto", tokens: int = 4096,
             chunk: int = 512, memory: int = 512, schedules=("fm", "imdc", "full"), growth: str = "linear",
             sinks: int = 4, gpu: str | None = None, document: Path = DOCUMENT) -> dict:
    import torch

    from memstep import planner
    from memstep.engine import ChunkedPrefill, model_shape
    from memstep.models import load_model
    from memstep.schedules import make_schedule

    lm = load_model(model, device, dtype)
    ids = lm.tokenizer(Path(document).read_text(encoding="utf-8"))["input_ids"][:tokens]
    shape = model_shape(lm.model)  # real parameter count and dtype of the loaded model
    dtype_name = planner.dtype_name(lm.dtype)
    device_name, gpu_preset = lm.device, gpu
    if lm.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(lm.device))
        device_name = props.name
        gpu_preset = gpu or detect_gpu(props.name, props.total_memory)
    plan_gpu = planner.resolve_gpu(gpu_preset or "h100-80gb")  # bytes do not depend on the GPU
    engine = ChunkedPrefill(lm.model, sinks=sinks)

    warm = make_schedule("fm", min(len(ids), 2 * chunk), min(chunk, len(ids)), memory)
    for _ in engine.run(ids[:warm.tokens], warm):  # kernels, cuBLAS handles, allocator pools
        pass

    runs = []
    for name in schedules:
        schedule = make_schedule(name, len(ids), chunk, memory, growth)
        plan = planner.plan_schedule(shape, plan_gpu, schedule, dtype=dtype_name, sinks=sinks,
                                     device=engine.device.type)
        began = time.perf_counter()
        records = list(engine.run(ids, schedule))
        seconds = time.perf_counter() - began
        steps = []
        for record, step in zip(records, plan.steps):
            steps.append({
                "step": record.step, "chunk_size": record.chunk_size, "memory_before": record.memory_before,
                "memory_after": record.memory_after,
                "seconds_measured": record.seconds, "seconds_modeled": step.seconds if gpu_preset else None,
                "bytes_measured": record.bytes_measured, "bytes_modeled": step.peak_bytes,
                "kv_bytes_actual": record.kv_bytes_actual, "kv_bytes_modeled": step.kv_bytes,
            })
        measured = [s["bytes_measured"] for s in steps if s["bytes_measured"] is not None]
        peak_measured = max(measured) if measured else None
        runs.append({
            "schedule": name, "steps": steps, "tokens": schedule.tokens,
            "peak_bytes_measured": peak_measured, "peak_bytes_modeled": plan.peak_bytes,
            "peak_error": (plan.peak_bytes - peak_measured) / peak_measured if peak_measured else None,
            "kv_bytes_match": all(s["kv_bytes_actual"] == s["kv_bytes_modeled"] for s in steps),
            "seconds_measured": seconds, "seconds_modeled": plan.seconds if gpu_preset else None,
        })
    return {"model": lm.name, "device": lm.device, "device_name": device_name, "gpu_preset": gpu_preset,
            "dtype": lm.dtype, "document": Path(document).name, "tokens": len(ids), "chunk": chunk, "memory": memory, "growth": growth,
            "sinks": sinks, "efficiency": planner.DEFAULT_EFFICIENCY,
            "bandwidth_efficiency": planner.DEFAULT_BANDWIDTH_EFFICIENCY, "runs": runs}


HEADINGS = ("schedule", "peak measured", "peak modeled", "error", "KV exact", "s measured", "s modeled")


def _cells(run: dict, digits: int) -> list[str]:
    """One run's row, formatted: what the console summary and the Markdown table both show."""
    from memstep.memory import format_bytes

    modeled_s = f"{run['seconds_modeled']:.{digits}f}" if run["seconds_modeled"] is not None else "n/a"
    return [run["schedule"], format_bytes(run["peak_bytes_measured"]), format_bytes(run["peak_bytes_modeled"]),
            f"{run['peak_error']:+.1%}" if run["peak_error"] is not None else "n/a", str(run["kv_bytes_match"]),
            f"{run['seconds_measured']:.{digits}f}", modeled_s]


def summary(report: dict) -> str:
    widths = (8, 14, 13, 7, 8, 10, 10)
    line = lambda cells: " ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [f"{report['model']} on {report['device_name']} ({report['dtype']}), {report['tokens']} tokens, "
             f"chunk {report['chunk']}, memory {report['memory']}", line(HEADINGS)]
    return "\n".join(lines + [line(_cells(run, 3)) for run in report["runs"]])


def markdown(report: dict) -> str:
    """The report as a Markdown table (docs/benchmarks.md)."""
    lines = [f"{report['model']} on {report['device_name']} ({report['dtype']}), {report.get('document', '')} "
             f"{report['tokens']} tokens, chunk {report['chunk']}, memory {report['memory']}; the planner's "
             f"GPU preset {report['gpu_preset']}:", "", "| " + " | ".join(HEADINGS) + " |",
             "|---|---:|---:|---:|---|---:|---:|"]
    return "\n".join(lines + ["| " + " | ".join(_cells(run, 2)) + " |" for run in report["runs"]])


def main(argv=None) -> int:
    from memstep.errors import MemstepError

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--memory", type=int, default=512)
    p.add_argument("--growth", default="linear")
    p.add_argument("--schedules", default="fm,imdc,full", help="comma-separated")
    p.add_argument("--gpu", default=None, help="planner GPU preset for modeled seconds (default: detected)")
    p.add_argument("--document", type=Path, default=DOCUMENT, help="the text to prefill (default: 23k tokens)")
    p.add_argument("--from-json", default=None, help="measure nothing: print this earlier run's table")
    p.add_argument("--docs", action="store_true", help="with --from-json: write it into docs/benchmarks.md")
    p.add_argument("--block", default="validate-planner", help="the block of docs/benchmarks.md that --docs writes")
    p.add_argument("--output", default=None, help="JSON path (default benchmarks/results/validate_planner_<device>.json)")
    args = p.parse_args(argv)
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
        print(markdown(report))
        if args.docs:
            sys.path.insert(0, str(ROOT))
            from benchmarks.docs_block import committed_on, write_block

            write_block(args.block, markdown(report), f"benchmarks/validate_planner.py --from-json {args.from_json} "
                        f"--docs --block {args.block}", measured=committed_on(Path(args.from_json)))
        return 0
    try:
        report = validate(args.model, args.device, args.dtype, args.tokens, args.chunk, args.memory,
                          tuple(s.strip() for s in args.schedules.split(",") if s.strip()), args.growth,
                          gpu=args.gpu, document=args.document)
    except MemstepError as err:
        print(f"validate_planner: error: {err}", file=sys.stderr)
        return 2
    output = Path(args.output) if args.output else RESULTS / f"validate_planner_{report['device'].split(':')[0]}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(summary(report))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
