"""Wall time and peak bytes of the engine's schedules, and what the engine and the scorer cost.

On the example document (assets/pride_and_prejudice_ch1-12.txt) at 4k and 8k tokens with
chunk = memory = 512 and 1024, for the schedules full / fm / im / imdc (chunk-attention
scorer): wall seconds, modeled peak bytes (memory.step_bytes) and measured peak bytes
(CUDA; null on CPU). Two overheads, each from one run of this script:

- engine overhead: chunked prefill with no eviction (fm, memory >= tokens: nothing is scored
  or evicted) against one plain transformers forward over the whole document; target <= 1.00x.
- scorer overhead: chunk-attention against recency (no attention to compute) on the same
  imdc schedule; target <= 1.05x.

And two more:

- fraction of the limit: the run's FLOPs (the planner's count for the same settings)
  divided by the machine's matmul rate (a micro-benchmark in the same run: same threads,
  same dtype) times the run's time; target >= 0.85 for the 4k IMDC run at c = M = 512.
- padded vs efficient: FM and IMDC with the reference code's padded attention
  (``--attention padded``: queries padded to memory + chunk, (m + c)^2 maps) and with
  memstep's; IMDC / FM time and modeled peak in both modes, next to the paper's 1.45x and
  23.3% and next to the planner's prediction for the same settings on this machine (its
  measured matmul rate and copy bandwidth).

The previous run's JSON, when there is one, is read first: its figures stand beside the new.

    .venv/bin/python benchmarks/bench_engine.py                 # -> benchmarks/results/bench_engine_<device>.json
    .venv/bin/python benchmarks/bench_engine.py --tokens 1024 --sizes 256   # a quick check

Prints Markdown tables (docs/benchmarks.md, "Engine benchmark"; --docs writes them there). Timings on a shared CPU
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

from memstep.documents import tokenize_document
from memstep.reading import read_document
from memstep.engine import ChunkedPrefill, cache_keyword
from memstep.memory import format_bytes
from memstep.models import load_model
from memstep.schedules import make_schedule
from memstep.scorers import make_scorer

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "assets" / "pride_and_prejudice_ch1-12.txt"
RESULTS = ROOT / "benchmarks" / "results"
SCHEDULES = ("full", "fm", "im", "imdc")
ENGINE_TARGET, SCORER_TARGET, FRACTION_TARGET = 1.00, 1.05, 0.85
PAPER = {"imdc_speedup": 1.45, "imdc_memory_saved": 0.233}


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


def engine_prefill(model, ids: torch.Tensor, schedule, scorer: str = "chunk-attention", sinks: int = 4,
                   attention: str = "sdpa") -> dict:
    """One engine run; wall seconds cover the whole generator, records included."""
    engine = ChunkedPrefill(model, make_scorer(scorer), sinks=sinks, attention=attention)
    began, began_cpu = time.perf_counter(), time.process_time()
    records = list(engine.run(ids, schedule))
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - began_cpu
    measured = [r.bytes_measured for r in records if r.bytes_measured is not None]
    return {
        "schedule": schedule.name, "growth": schedule.growth, "scorer": scorer, "attention": attention,
        "steps": len(records),
        "seconds": seconds, "cpu_seconds": cpu_seconds, "step_seconds": sum(r.seconds for r in records),
        "peak_bytes_modeled": max(r.bytes_modeled for r in records),
        "peak_bytes_measured": max(measured) if measured else None,
        "peak_kv_bytes": max(r.kv_bytes_actual for r in records),
        "widest_step_tokens": max(r.memory_before + r.chunk_size for r in records),
        "evicting_steps": sum(r.evicted for r in records),
    }


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a square matmul on this device, threads and dtype (best of ``repeats``), on
    the clock the ratios use: what the machine can do at most for dense work."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    clock = ratio_clock(device)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        began, began_cpu = time.perf_counter(), time.process_time()
        a @ b
        synchronize(device)
        best = min(best, time.process_time() - began_cpu if clock == "cpu_seconds" else time.perf_counter() - began)
    return 2 * size ** 3 / best


def copy_bandwidth(device: torch.device, megabytes: int = 256) -> float:
    """Bytes per second of a large tensor copy (read + write), best of 3."""
    x = torch.empty(megabytes * 2 ** 20 // 4, device=device)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(3):
        synchronize(device)
        began = time.perf_counter()
        y.copy_(x)
        synchronize(device)
        best = min(best, time.perf_counter() - began)
    return 2 * x.nbytes / best


def planned(lm, tokens: int, schedule: str, size: int | None, growth: str, attention: str, rate: float,
            bandwidth: float):
    """The planner's view of the same run on this machine (its measured rate and bandwidth)."""
    from memstep import planner
    from memstep.engine import model_shape

    shape = model_shape(lm.model)
    here = planner.Gpu("this machine", rate / 1e12, rate / 1e12, rate / 1e12, bandwidth / 1e9, 1 << 40)
    return planner.plan(shape, here, schedule=schedule, tokens=tokens, chunk=size, memory=size, growth=growth,
                        attention=attention, dtype="fp32", efficiency=1.0, bandwidth_efficiency=1.0,
                        device=torch.device(lm.device).type)


def bench(lm, document_ids: list[int], tokens_list, sizes, schedules, growth: str, repeats: int = 1,
          padded_tokens: int | None = 4096, document: str = DOCUMENT.name) -> dict:
    model = lm.model
    device = next(model.parameters()).device
    clock = ratio_clock(device)
    runs, overheads, padded = [], [], []
    plain_prefill(model, torch.tensor(document_ids[:256]))  # warm-up: kernels, allocator, thread pool
    dtype = next(model.parameters()).dtype
    rate, bandwidth = matmul_rate(device, dtype), copy_bandwidth(device)
    print(f"matmul {rate / 1e9:.1f} GFLOP/s, copy {bandwidth / 1e9:.1f} GB/s", file=sys.stderr)
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
                flops = planned(lm, tokens, name, size, growth, "sdpa", rate, bandwidth).flops
                run.update(flops=flops, limit_fraction=flops / (rate * run[clock]))
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
            if tokens == padded_tokens:
                padded.append(padded_comparison(lm, ids, tokens, size, growth, repeats, runs, rate, bandwidth))
    return {
        "model": lm.name, "device": str(device), "dtype": lm.dtype,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or platform.machine(),
        "threads": torch.get_num_threads(), "repeats": repeats, "torch": torch.__version__,
        "document": document,
        "growth": growth, "ratio_clock": clock,
        "targets": {"engine_overhead": ENGINE_TARGET, "scorer_overhead": SCORER_TARGET,
                    "limit_fraction": FRACTION_TARGET},
        "matmul_flops_per_second": rate, "copy_bytes_per_second": bandwidth,
        "runs": runs, "overheads": overheads, "padded": padded, "paper": PAPER,
    }


def padded_comparison(lm, ids, tokens: int, size: int, growth: str, repeats: int, runs: list, rate: float,
                      bandwidth: float) -> dict:
    """IMDC / FM time and modeled peak with the reference's padded attention and with memstep's,
    measured in this run, and as the planner predicts them on this machine."""
    clock = ratio_clock(next(lm.model.parameters()).device)
    out = {"tokens": tokens, "chunk": size, "memory": size}
    for attention in ("padded", "sdpa"):
        got = {}
        for name in ("fm", "imdc"):
            run = next((r for r in runs if (r["tokens"], r["chunk"], r["schedule"], r.get("attention")) ==
                        (tokens, size, name, attention)), None)
            if run is None:
                run = best_of(repeats, engine_prefill, lm.model, ids, make_schedule(name, tokens, size, size, growth),
                              attention=attention)
            got[name] = run
        plans = {name: planned(lm, tokens, name, size, growth, attention, rate, bandwidth) for name in got}
        out[attention] = {
            "fm_seconds": got["fm"][clock], "imdc_seconds": got["imdc"][clock],
            "speedup": got["fm"][clock] / got["imdc"][clock],
            "fm_peak_modeled": got["fm"]["peak_bytes_modeled"], "imdc_peak_modeled": got["imdc"]["peak_bytes_modeled"],
            "memory_saved": 1 - got["imdc"]["peak_bytes_modeled"] / got["fm"]["peak_bytes_modeled"],
            # on a GPU the allocator's peak (weights included, as the paper's GPU memory): None on CPU
            "memory_saved_measured": (1 - got["imdc"]["peak_bytes_measured"] / got["fm"]["peak_bytes_measured"]
                                      if got["fm"]["peak_bytes_measured"] and got["imdc"]["peak_bytes_measured"]
                                      else None),
            "planned_speedup": plans["fm"].seconds / plans["imdc"].seconds,
            "planned_memory_saved": 1 - plans["imdc"].peak_bytes / plans["fm"].peak_bytes,
        }
        print(f"[{tokens}] c=M={size} {attention}: IMDC {out[attention]['speedup']:.2f}x faster, "
              f"{out[attention]['memory_saved']:.1%} less peak", file=sys.stderr)
    return out


def markdown(report: dict, previous: dict | None = None) -> str:
    lines = [f"{report['model']} on {report['device']} ({report['device_name']}, {report['dtype']}, "
             f"{report['threads']} threads, best of {report['repeats']}), {report['document']}, "
             "chunk-attention scorer, "
             f"{report['growth']} growth:", "",
             "| tokens | schedule | c = M | steps | seconds | CPU seconds | peak modeled | peak measured | "
             "widest step | fraction of the limit |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["runs"]:
        size = "-" if r["chunk"] is None else r["chunk"]
        fraction = f"{r['limit_fraction']:.2f}" if r.get("limit_fraction") else "-"
        lines.append(f"| {r['tokens']} | {r['schedule']} | {size} | {r['steps']} | {r['seconds']:.2f} | "
                     f"{r['cpu_seconds']:.2f} | "
                     f"{format_bytes(r['peak_bytes_modeled'])} | {format_bytes(r['peak_bytes_measured'])} | "
                     f"{r['widest_step_tokens']} | {fraction} |")
    clock = "CPU s" if report["ratio_clock"] == "cpu_seconds" else "s"
    before = {(o["tokens"], o["chunk"]): o for o in (previous or {}).get("overheads", [])}
    lines += ["", f"| tokens | c | plain forward {clock} | chunked, no eviction {clock} | engine overhead "
              f"(target <= {ENGINE_TARGET:.2f}x) | previous | chunk-attention {clock} | recency {clock} | "
              f"scorer overhead (target <= {SCORER_TARGET:.2f}x) | previous |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for o in report["overheads"]:
        old = before.get((o["tokens"], o["chunk"]), {})
        was = lambda key: f"{old[key]:.2f}x" if key in old else "-"  # noqa: E731
        lines.append(f"| {o['tokens']} | {o['chunk']} | {o['plain_seconds']:.2f} | {o['no_eviction_seconds']:.2f} | "
                     f"{o['engine_overhead']:.2f}x | {was('engine_overhead')} | {o['chunk_attention_seconds']:.2f} | "
                     f"{o['recency_seconds']:.2f} | {o['scorer_overhead']:.2f}x | {was('scorer_overhead')} |")
    if report.get("padded"):
        measured = any(p[a].get("memory_saved_measured") is not None for p in report["padded"] for a in ("padded", "sdpa"))
        lines += ["", f"| tokens | c = M | attention | FM {clock} | IMDC {clock} | IMDC speed-up | planned | "
                      "IMDC peak saved (modeled) | planned |" + (" measured |" if measured else ""),
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if measured else "")]
        for p in report["padded"]:
            for attention, label in (("padded", "padded (reference code)"), ("sdpa", "memstep (SDPA / one pass)")):
                r = p[attention]
                lines.append(f"| {p['tokens']} | {p['chunk']} | {label} | {r['fm_seconds']:.2f} | "
                             f"{r['imdc_seconds']:.2f} | {r['speedup']:.2f}x | {r['planned_speedup']:.2f}x | "
                             f"{r['memory_saved']:.1%} | {r['planned_memory_saved']:.1%} |"
                             + (f" {_percent(r.get('memory_saved_measured'))} |" if measured else ""))
        lines.append(f"| | | paper (reported, Llama-2-7B, GPU) | | | {PAPER['imdc_speedup']:.2f}x | | "
                     f"{PAPER['imdc_memory_saved']:.1%} | |" + (" |" if measured else ""))
    lines.append("")
    lines.append(f"Matmul rate measured in the same run: {report['matmul_flops_per_second'] / 1e9:.1f} GFLOP/s "
                 f"({report['threads']} threads, {report['dtype']}); copy bandwidth "
                 f"{report['copy_bytes_per_second'] / 1e9:.1f} GB/s.")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _write_docs(tables: str, command: str, measured: str | None = None, block: str = "bench-engine") -> None:
    from benchmarks.docs_block import write_block

    write_block(block, tables, command, measured=measured)


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
    parser.add_argument("--padded-tokens", type=int, default=4096,
                        help="length at which FM and IMDC also run with padded attention (0: never)")
    parser.add_argument("--output", default=None,
                        help="JSON path (default benchmarks/results/bench_engine_<device>.json)")
    parser.add_argument("--document", type=Path, default=DOCUMENT,
                        help="the text to prefill (default: Pride and Prejudice, chapters 1-12: 23k tokens)")
    parser.add_argument("--docs", action="store_true", help="also write the tables into docs/benchmarks.md")
    parser.add_argument("--block", default="bench-engine", help="the block of docs/benchmarks.md that --docs writes")
    parser.add_argument("--from-json", default=None,
                        help="measure nothing: print (and with --docs write) the tables of this earlier run's JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
        tables = markdown(report, report.get("previous"))
        print(tables)
        if args.docs:
            from benchmarks.docs_block import committed_on

            block = "" if args.block == "bench-engine" else f" --block {args.block}"
            _write_docs(tables, f"benchmarks/bench_engine.py --from-json {args.from_json} --docs{block}",
                        committed_on(Path(args.from_json)), args.block)
        return 0

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, args.device, args.dtype)
    document_ids, _ = tokenize_document(read_document(args.document), lm.tokenizer, max(args.tokens))
    output = Path(args.output) if args.output else RESULTS / f"bench_engine_{torch.device(lm.device).type}.json"
    previous = json.loads(output.read_text()) if output.exists() else None
    report = bench(lm, document_ids, args.tokens, args.sizes, args.schedules, args.growth, args.repeats,
                   args.padded_tokens, args.document.name)
    report["previous"] = {k: previous.get(k) for k in ("overheads", "runs")} if previous else None
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(markdown(report, previous))
    if args.docs:
        _write_docs(markdown(report, previous), "benchmarks/bench_engine.py " + " ".join(argv or sys.argv[1:]),
                    block=args.block)
    print(f"\nwrote {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
