"""Wall time and peak bytes of the engine's schedules, and what the engine and the scorer cost.

On the example document (assets/pride_and_prejudice_ch1-12.txt) at 4k and 8k tokens with
chunk = memory = 512 and 1024, for the schedules full / fm / im / imdc (chunk-attention
scorer): wall seconds, modeled peak bytes (memory.step_bytes) and measured peak bytes
(CUDA; null on CPU). Two overheads, each from one run of this script:

- engine overhead: chunked prefill with no eviction (fm, memory >= tokens: nothing is scored
  or evicted) against one plain transformers forward over the whole document; target <= 1.10x.
- scorer overhead: chunk-attention against recency (no attention to compute) on the same
  imdc schedule; target <= 1.15x.

    .venv/bin/python benchmarks/bench_engine.py                 # -> benchmarks/results/bench_engine_<device>.json
    .venv/bin/python benchmarks/bench_engine.py --tokens 1024 --sizes 256   # a quick check

Prints a Markdown table (the README's "Engine benchmark" section). Timings on a shared CPU
are noisy, and worse with more torch threads than free cores (every small op waits for a
descheduled thread). With --threads 1 on CPU the ratios compare the process's CPU time,
which other processes barely change; elsewhere they compare wall time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from memstep.documents import read_document, tokenize_document
from memstep.engine import ChunkedPrefill, cache_keyword
from memstep.memory import format_bytes
from memstep.models import load_model
from memstep.schedules import make_schedule
from memstep.scorers import make_scorer

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "assets" / "pride_and_prejudice_ch1-12.txt"
RESULTS = ROOT / "benchmarks" / "results"
SCHEDULES = ("full", "fm", "im", "imdc")
ENGINE_TARGET, SCORER_TARGET = 1.10, 1.15


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ratio_clock(device: torch.device) -> str:
    """Which time the ratios compare. One CPU thread: the process's CPU time, which other
    processes on shared cores barely change (wall time there varies by 1.5x run to run).
    Otherwise wall time (GPU, or several threads whose spin-waits CPU time would count)."""
    return "cpu_seconds" if device.type == "cpu" and torch.get_num_threads() == 1 else "seconds"


def best_of(repeats: int, measure, *args, **kwargs) -> dict:
    """The fastest of `repeats` runs (timings on a shared machine only ever get slower)."""
    clock = ratio_clock(next(args[0].parameters()).device)
    return min((measure(*args, **kwargs) for _ in range(max(1, repeats))), key=lambda r: r[clock])


def plain_prefill(model, ids: torch.Tensor) -> dict:
    """One transformers forward over the whole document, filling a cache: the baseline."""
    device = next(model.parameters()).device
    decoder = model.model
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    began, began_cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        decoder(input_ids=ids[None].to(device), use_cache=True, **{cache_keyword(decoder): DynamicCache()})
    synchronize(device)
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - began_cpu
    measured = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_bytes_measured": measured}


def engine_prefill(model, ids: torch.Tensor, schedule, scorer: str = "chunk-attention", sinks: int = 4) -> dict:
    """One engine run; wall seconds cover the whole generator, records included."""
    engine = ChunkedPrefill(model, make_scorer(scorer), sinks=sinks)
    began, began_cpu = time.perf_counter(), time.process_time()
    records = list(engine.run(ids, schedule))
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - began_cpu
    measured = [r.bytes_measured for r in records if r.bytes_measured is not None]
    return {
        "schedule": schedule.name, "growth": schedule.growth, "scorer": scorer, "steps": len(records),
        "seconds": seconds, "cpu_seconds": cpu_seconds, "step_seconds": sum(r.seconds for r in records),
        "peak_bytes_modeled": max(r.bytes_modeled for r in records),
        "peak_bytes_measured": max(measured) if measured else None,
        "peak_kv_bytes": max(r.kv_bytes_actual for r in records),
        "widest_step_tokens": max(r.memory_before + r.chunk_size for r in records),
        "evicting_steps": sum(r.evicted for r in records),
    }


def bench(lm, document_ids: list[int], tokens_list, sizes, schedules, growth: str, repeats: int = 1) -> dict:
    model = lm.model
    device = next(model.parameters()).device
    clock = ratio_clock(device)
    runs, overheads = [], []
    plain_prefill(model, torch.tensor(document_ids[:256]))  # warm-up: kernels, allocator, thread pool
    for tokens in tokens_list:
        if tokens > len(document_ids):
            raise SystemExit(f"the document has only {len(document_ids)} tokens (asked for {tokens})")
        ids = torch.tensor(document_ids[:tokens])
        plain = best_of(repeats, plain_prefill, model, ids)
        print(f"[{tokens}] plain forward {plain['seconds']:.2f} s", file=sys.stderr)
        if "full" in schedules:
            run = best_of(repeats, engine_prefill, model, ids, make_schedule("full", tokens))
            runs.append({"tokens": tokens, "chunk": None, "memory": None, **run})
            print(f"[{tokens}] full {run['seconds']:.2f} s", file=sys.stderr)
        for size in sizes:
            for name in (s for s in schedules if s != "full"):
                run = best_of(repeats, engine_prefill, model, ids, make_schedule(name, tokens, size, size, growth))
                runs.append({"tokens": tokens, "chunk": size, "memory": size, **run})
                print(f"[{tokens}] {name} c=M={size} {run['seconds']:.2f} s", file=sys.stderr)
            # the engine's own cost: chunks of `size`, a budget that never evicts
            no_eviction = best_of(repeats, engine_prefill, model, ids, make_schedule("fm", tokens, size, tokens))
            assert no_eviction["evicting_steps"] == 0
            # the scorer's cost: the same imdc schedule with recency (no attention recomputed)
            imdc = make_schedule("imdc", tokens, size, size, growth)
            scored = next((r for r in runs if r["tokens"] == tokens and r["chunk"] == size
                           and r["schedule"] == "imdc"), None) or best_of(repeats, engine_prefill, model, ids, imdc)
            recency = best_of(repeats, engine_prefill, model, ids, imdc, scorer="recency")
            overheads.append({
                "tokens": tokens, "chunk": size, "memory": size,
                "plain_seconds": plain[clock], "no_eviction_seconds": no_eviction[clock],
                "engine_overhead": no_eviction[clock] / plain[clock],
                "chunk_attention_seconds": scored[clock], "recency_seconds": recency[clock],
                "scorer_overhead": scored[clock] / recency[clock],
            })
            print(f"[{tokens}] c={size}: engine {overheads[-1]['engine_overhead']:.2f}x, "
                  f"scorer {overheads[-1]['scorer_overhead']:.2f}x", file=sys.stderr)
    return {
        "model": lm.name, "device": str(device), "dtype": lm.dtype,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or platform.machine(),
        "threads": torch.get_num_threads(), "repeats": repeats, "torch": torch.__version__,
        "document": DOCUMENT.name,
        "growth": growth, "ratio_clock": clock, "targets": {"engine_overhead": ENGINE_TARGET, "scorer_overhead": SCORER_TARGET},
        "runs": runs, "overheads": overheads,
    }


def markdown(report: dict) -> str:
    lines = [f"{report['model']} on {report['device']} ({report['device_name']}, {report['dtype']}, "
             f"{report['threads']} threads, best of {report['repeats']}), {report['document']}, "
             "chunk-attention scorer, "
             f"{report['growth']} growth:", "",
             "| tokens | schedule | c = M | steps | seconds | CPU seconds | peak modeled | peak measured | "
             "widest step |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["runs"]:
        size = "-" if r["chunk"] is None else r["chunk"]
        lines.append(f"| {r['tokens']} | {r['schedule']} | {size} | {r['steps']} | {r['seconds']:.2f} | "
                     f"{r['cpu_seconds']:.2f} | "
                     f"{format_bytes(r['peak_bytes_modeled'])} | {format_bytes(r['peak_bytes_measured'])} | "
                     f"{r['widest_step_tokens']} |")
    clock = "CPU s" if report["ratio_clock"] == "cpu_seconds" else "s"
    lines += ["", f"| tokens | c | plain forward {clock} | chunked, no eviction {clock} | engine overhead "
              f"(target <= {ENGINE_TARGET:.2f}x) | chunk-attention {clock} | recency {clock} | "
              "scorer overhead "
              f"(target <= {SCORER_TARGET:.2f}x) |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for o in report["overheads"]:
        lines.append(f"| {o['tokens']} | {o['chunk']} | {o['plain_seconds']:.2f} | {o['no_eviction_seconds']:.2f} | "
                     f"{o['engine_overhead']:.2f}x | {o['chunk_attention_seconds']:.2f} | "
                     f"{o['recency_seconds']:.2f} | {o['scorer_overhead']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="'embedded' (default), a hub id or a folder")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024], help="chunk = memory sizes")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    parser.add_argument("--growth", default="linear")
    parser.add_argument("--repeats", type=int, default=1, help="keep the fastest of this many runs of each")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", default=None,
                        help="JSON path (default benchmarks/results/bench_engine_<device>.json)")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, args.device, args.dtype)
    document_ids, _ = tokenize_document(read_document(DOCUMENT), lm.tokenizer, max(args.tokens))
    report = bench(lm, document_ids, args.tokens, args.sizes, args.schedules, args.growth, args.repeats)
    output = Path(args.output) if args.output else RESULTS / f"bench_engine_{torch.device(lm.device).type}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    print(f"\nwrote {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
