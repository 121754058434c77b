"""Where a chunked prefill's time goes beside a plain forward: torch's profiler over one plain
forward and one engine run with no eviction (FM, memory >= tokens) on a model folder, printing the
ops that take the most device (or CPU) time and how often the host waits for the device
(``aten::item`` / ``_local_scalar_dense``: a value read back, which syncs on a GPU).

    python benchmarks/profile_engine.py --model /tmp/llama-2-7b-random --device cuda --tokens 8192 --chunk 1024

Writes a JSON summary (--output) with each run's wall seconds, its top ops and the sync count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")


def profiled(fn, device, top: int) -> dict:
    """Run ``fn`` once under the profiler: wall seconds, the ``top`` ops by self time, and the syncs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        began = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - began
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    ops = [{"op": e.key, "calls": e.count, "self_ms": round(getattr(e, key) / 1e3, 2),
            "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)} for e in events[:top]]
    syncs = sum(e.count for e in prof.key_averages() if e.key in SYNC_OPS)
    launches = sum(e.count for e in prof.key_averages() if e.key in ("cudaLaunchKernel", "cuLaunchKernel"))
    return {"seconds": round(seconds, 3), "syncs": syncs, "kernel_launches": launches, "ops": ops}


def main(argv=None) -> int:
    import torch

    from benchmarks.bench_engine import engine_prefill, plain_prefill
    from memstep.documents import tokenize_document
    from memstep.models import load_model
    from memstep.reading import read_document
    from memstep.schedules import make_schedule

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--document", type=Path, default=ROOT / "assets" / "pride_and_prejudice.txt")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    lm = load_model(args.model, args.device, args.dtype)
    device = next(lm.model.parameters()).device
    ids, _ = tokenize_document(read_document(args.document), lm.tokenizer, args.tokens)
    ids = torch.tensor(ids[:args.tokens])
    fm = lambda memory: make_schedule("fm", len(ids), args.chunk, memory)  # noqa: E731
    runs = {"plain forward": lambda: plain_prefill(lm.model, ids),  # the same runs as bench_engine's overheads
            "chunked, no eviction": lambda: engine_prefill(lm.model, ids, fm(len(ids))),
            "fm, chunk-attention, memory = chunk": lambda: engine_prefill(lm.model, ids, fm(args.chunk))}
    for fn in runs.values():  # warm-up: kernels, cuBLAS handles, allocator pools
        fn()
    report = {"model": lm.name, "device": str(device), "dtype": lm.dtype, "tokens": len(ids), "chunk": args.chunk,
              "runs": {name: profiled(fn, device, args.top) for name, fn in runs.items()}}
    for name, run in report["runs"].items():
        print(f"\n{name}: {run['seconds']:.3f} s, {run['syncs']} host syncs, {run['kernel_launches']} kernel launches")
        for op in run["ops"]:
            print(f"  {op['self_ms']:>9.2f} ms  {op['calls']:>6}x  cpu {op['self_cpu_ms']:>9.2f} ms  {op['op'][:70]}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
