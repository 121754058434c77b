"""Pruning with reconstruction on the embedded model: error reduction and perplexity per technique.

The grid: Wanda and SparseGPT masks x 50% unstructured and 2:4 x reconstruction none / LR / BR /
BR+GP / BR+GP+CR, all on text calibration (Persuasion); then Wanda 50% with BR+GP and BR+GP+CR
on self-generated calibration data. For each run: the normalized error after the last block on
the calibration data and on held-out text (Pride and Prejudice), its reduction against no
reconstruction (the seed paper reports 87-94% in total on LLaMA-7B), perplexity before/after on
both, the achieved sparsity and seconds. Every run prunes all 30 blocks of a fresh copy.

    nice -n 10 .venv/bin/python benchmarks/bench_sparse.py     # -> benchmarks/results/bench_sparse_cpu.json
    .venv/bin/python benchmarks/bench_sparse.py --samples 2 --seq-len 32 --steps 2 --grid wanda:0.5  # a quick check

Sized to finish in about 15 minutes on a shared 2-core CPU, so it uses fewer calibration tokens
and steps than the CLI defaults (see the JSON's "settings"): the reductions here are those of
short reconstructions. Prints the README's Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import torch

from memstep.compress.sparse import RECONSTRUCTIONS, SparseConfig, SparsePruning
from memstep.models import LoadedModel, load_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GRID = ("wanda:0.5", "wanda:2:4", "sparsegpt:0.5", "sparsegpt:2:4")
SELF_GENERATED = ("br+gp", "br+gp+cr")  # run again on self-generated data, Wanda 50%
LABELS = {"none": "none", "lr": "LR", "br": "BR", "br+gp": "BR+GP", "br+gp+cr": "BR+GP+CR"}


def parse_cell(cell: str) -> tuple[str, dict]:
    method, _, pattern = cell.partition(":")
    return method, ({"nm": pattern} if ":" in pattern else {"sparsity": float(pattern)})


def run_one(base, config: SparseConfig, dense_ppl: dict) -> dict:
    """Prune a fresh copy; the dense perplexity is measured once per calibration source (same windows)."""
    lm = LoadedModel(copy.deepcopy(base.model), base.tokenizer, base.name, base.device, base.dtype)
    cpu0 = time.process_time()
    process = SparsePruning(lm, config, dense_perplexity=dense_ppl.get(config.calibration))
    for _ in process:
        pass
    r = process.result
    dense_ppl[config.calibration] = {k: v["dense"] for k, v in r.perplexity.items()}
    return {"method": config.method, "pattern": config.nm or f"{config.sparsity:.0%}",
            "reconstruct": config.reconstruct, "calibration": config.calibration,
            "final_error": r.final_error, "perplexity": r.perplexity, "sparsity": r.sparsity,
            "seconds": r.seconds, "cpu_seconds": time.process_time() - cpu0,
            "errors": {"calibration": [x.error_calibration for x in r.records],
                       "held_out": [x.error_held_out for x in r.records],
                       "calibration_masked": [x.error_calibration_masked for x in r.records]},
            "min_matrix_sparsity": min(r.matrices.values()), "blocks": len(r.records)}


def add_reductions(runs: list[dict]) -> None:
    """Error reduction against 'none' (text calibration) with the same mask and pattern. Runs on
    self-generated data get the held-out reduction only: their calibration error is on other data."""
    nones = {(r["method"], r["pattern"]): r for r in runs if r["reconstruct"] == "none" and r["calibration"] == "text"}
    for r in runs:
        none = nones.get((r["method"], r["pattern"]))
        if none is None:
            continue
        r["reduction"] = {k: 1 - r["final_error"][k] / none["final_error"][k] for k in ("calibration", "held_out")}
        if r["calibration"] != "text":
            r["reduction"]["calibration"] = None


def markdown(runs: list[dict]) -> str:
    lines = ["| mask | pattern | calibration | reconstruction | error calib. | error held-out | cut vs none "
             "(calib. / held-out) | ppl calib. | ppl held-out | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    dense = runs[0]["perplexity"] if runs else None
    if dense:
        lines.append(f"| dense | | text | | | | | {dense['calibration']['dense']:.2f} | "
                     f"{dense['held_out']['dense']:.2f} | |")
    for r in runs:
        cut = r.get("reduction")
        cut_text = "" if not cut or r["reconstruct"] == "none" else \
            f"{'—' if cut['calibration'] is None else format(cut['calibration'], '.0%')} / {cut['held_out']:.0%}"
        lines.append(f"| {r['method']} | {r['pattern']} | {r['calibration']} | {LABELS[r['reconstruct']]} | "
                     f"{r['final_error']['calibration']:.4f} | {r['final_error']['held_out']:.4f} | {cut_text} | "
                     f"{r['perplexity']['calibration']['pruned']:.2f} | {r['perplexity']['held_out']['pruned']:.2f} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--held-out-samples", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--grid", nargs="+", default=list(GRID), help="method:sparsity or method:N:M cells")
    p.add_argument("--reconstructions", nargs="+", default=list(RECONSTRUCTIONS))
    p.add_argument("--self-generated", nargs="*", default=list(SELF_GENERATED))
    p.add_argument("--output", default=None)
    p.add_argument("--retable", default=None, help="re-render the table of an existing JSON result (no runs)")
    args = p.parse_args(argv)
    if args.retable:
        payload = json.loads(Path(args.retable).read_text())
        add_reductions(payload["runs"])
        payload["table"] = markdown(payload["runs"])
        Path(args.retable).write_text(json.dumps(payload, indent=1))
        print(payload["table"])
        return 0
    base = load_model("embedded", device="cpu", dtype="float32")
    common = dict(samples=args.samples, seq_len=args.seq_len, held_out_samples=args.held_out_samples,
                  steps=args.steps, batch_size=args.batch_size, lr=args.lr)
    plan = [(cell, rec, "text") for cell in args.grid for rec in args.reconstructions]
    plan += [(args.grid[0], rec, "self") for rec in args.self_generated]
    runs, started, dense_ppl = [], time.perf_counter(), {}
    for i, (cell, rec, calibration) in enumerate(plan, start=1):
        method, pattern = parse_cell(cell)
        run = run_one(base, SparseConfig(method=method, reconstruct=rec, calibration=calibration, **pattern,
                                         **common).validate(), dense_ppl)
        runs.append(run)
        print(f"[{i}/{len(plan)}] {cell} {rec} {calibration}: error {run['final_error']['calibration']:.4f} / "
              f"{run['final_error']['held_out']:.4f}, ppl held-out {run['perplexity']['held_out']['pruned']:.2f}, "
              f"{run['seconds']:.0f} s", flush=True)
    add_reductions(runs)
    payload = {"model": base.name, "device": "cpu", "threads": torch.get_num_threads(),
               "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}; shared with other sessions",
               "settings": {**common, "optimizer": "adam", "held_out": "Pride and Prejudice ch. 1-12",
                            "calibration_text": "Persuasion (excerpt)",
                            "error": "||pruned - dense||^2 / ||dense||^2 of the hidden states after the last block, "
                                     "first position of each window (attention sink) left out"},
               "seconds": time.perf_counter() - started, "runs": runs, "table": markdown(runs)}
    out = Path(args.output) if args.output else RESULTS / "bench_sparse_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    print(payload["table"])
    print(f"wrote {out} ({payload['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
