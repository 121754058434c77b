"""How close the Compress tab's time estimates (ui/estimates.py: FLOPs counted with the planner's
formulas / this machine's matmul rate) come to real runs of the embedded model, and the
efficiency (the fraction of the matmul rate whole runs reach) the estimate uses.

Runs a few LaCo and pruning configurations through the library (as the app does, minus the
page), each timed in wall seconds, and writes benchmarks/results/bench_estimates.json and a
table. Run it alone (flock /tmp/memstep-heavy.lock): about ten minutes on a 2-core CPU."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "bench_estimates.json"


def main() -> None:
    import copy

    from memstep.compress.collapse_run import CollapseRun
    from memstep.compress.data import calibration_texts
    from memstep.compress.quality import make_probe
    from memstep.compress.sparse import SparseConfig, SparsePruning
    from memstep.engine import model_shape
    from memstep.models import LoadedModel, load_model
    from ui import estimates
    from ui.compressed import weight_bytes
    from ui.tabs.compress.laco import APP_PROBE

    lm = load_model("embedded", device="cpu", dtype="float32")
    shape, size = model_shape(lm.model), weight_bytes(lm.model)
    rate = estimates.matmul_flops_per_second()
    rows = []

    def record(label, flops, decode, seconds):
        work = flops + decode * estimates._forward(shape, estimates.DECODE_STEP_FLOP_EQUIVALENT, shape.layers, True)
        rows.append({"run": label, "wall_seconds": seconds, "gflops": work / 1e9,
                     "efficiency": work / (seconds * rate),
                     "estimate_seconds": estimates.seconds(flops, decode, shape, 0)})
        print(f"{label:<44} {seconds:>7.1f} s  estimate {rows[-1]['estimate_seconds']:>7.1f} s  "
              f"efficiency {rows[-1]['efficiency']:.2f}", flush=True)

    laco_runs = [("LaCo search, L=1 (28 candidates), 6 x 128", dict(C=2, L=1, H=30), False),
                 ("LaCo L=24, 6 x 128, measured (4 models)", dict(C=2, L=24, H=30), True)]
    for label, settings, evaluate in laco_runs:
        probe = make_probe(lm.tokenizer, **APP_PROBE) if evaluate else None
        run = CollapseRun(lm, calibration_texts(6), probe=probe, repeats=2, max_tokens=128, T=0.8, I=1, **settings)
        began = time.perf_counter()
        for _ in run:
            pass
        flops, decode = estimates.laco_work(shape, sentences=6, tokens=128, evaluate=evaluate, probe=APP_PROBE,
                                            repeats=2, **settings)
        record(label, flops, decode, time.perf_counter() - began)
    for label, cfg in (("pruning wanda none, 16 x 128", dict(method="wanda", reconstruct="none")),
                       ("pruning wanda br+gp, 16 x 128, 20 steps", dict(method="wanda", reconstruct="br+gp"))):
        config = SparseConfig(samples=16, seq_len=128, held_out_samples=8, steps=20, batch_size=4, **cfg).validate()
        copy_lm = LoadedModel(copy.deepcopy(lm.model), lm.tokenizer, lm.name, lm.device, lm.dtype)
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            for _ in SparsePruning(copy_lm, config):
                pass
            seconds = time.perf_counter() - began
        flops, decode = estimates.sparse_work(shape, method=config.method, technique=config.reconstruct,
                                              calibration="text", samples=16, seq_len=128, held_out=8, steps=20,
                                              batch=4)
        record(label, flops, decode, seconds)
        del copy_lm
    efficiency = statistics.median(r["efficiency"] for r in rows)
    out = {"matmul_gflops": rate / 1e9, "runs": rows, "median_efficiency": efficiency,
           "efficiency_used": estimates.EFFICIENCY, "weight_bytes": size}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    print(f"matmul {rate / 1e9:.1f} GFLOP/s; median efficiency {efficiency:.2f} "
          f"(ui/estimates.EFFICIENCY = {estimates.EFFICIENCY})")


if __name__ == "__main__":
    main()
