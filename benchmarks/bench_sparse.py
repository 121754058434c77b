"""The full reconstruction grid on the embedded model, resumable, one process per cell.

Cells: magnitude, Wanda and SparseGPT masks x 50% unstructured and 2:4 x reconstruction none /
LR / BR / BR+GP / BR+GP+CR x calibration real (Persuasion), self-generated, and added (the
reference's gen_add: the real windows plus as many self-generated ones). Every cell prunes all
30 blocks of the model in a process of its own (one torch thread), so its CPU seconds and peak
RSS are its own. Per cell: the normalized hidden-state error after the last block on the
calibration windows and on held-out text (Pride and Prejudice, never used for calibration),
held-out and calibration perplexity, the achieved sparsity, the process CPU seconds of
calibration + pruning + measurement, and the process's peak RSS (model load included).

The model writes its text once (a child process; cached beside the results) and every
self-generated or added cell reuses it. Each finished cell is appended to a JSON-lines file
at once: a stopped run resumes where it stopped. Each child takes the shared heavy-job lock
(``flock``) for its own duration, so other jobs can run between cells.

    .venv/bin/python benchmarks/bench_sparse.py --plan          # the cells, done and left, and what is left costs
    .venv/bin/python benchmarks/bench_sparse.py --limit 10      # run (or resume) up to 10 cells
    flock /tmp/memstep-heavy.lock .venv/bin/python benchmarks/bench_sparse.py --held --limit 10   # one lock hold
    .venv/bin/python benchmarks/bench_sparse.py --docs          # run what is left, then write the table
    .venv/bin/python benchmarks/bench_sparse.py --retable --docs   # the table from what has run, no runs
    .venv/bin/python benchmarks/bench_sparse.py --default-run   # CPU s and peak RSS of `memstep compress sparse`

Sized for a shared 2-core CPU: 8 calibration samples of 64 tokens, 4 held-out windows of 64
tokens, 6 Adam steps per block (or window), batches of 2 (the CLI defaults: 16 x 128 tokens,
20 steps). Writes docs/compress.md's table (between its sparse markers) with --docs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CELLS_FILE = RESULTS / "bench_sparse_grid.jsonl"
GENERATED_FILE = RESULTS / "bench_sparse_generated.json"
SUMMARY_FILE = RESULTS / "bench_sparse_cpu.json"
DOCS = ROOT / "docs" / "compress.md"
LOCK = "/tmp/memstep-heavy.lock"
MASKS = ("magnitude", "wanda", "sparsegpt")
PATTERNS = ("50%", "2:4")
RECONSTRUCTIONS = ("none", "lr", "br", "br+gp", "br+gp+cr")
CALIBRATIONS = ("text", "self", "add")
CALIBRATION_NAMES = {"text": "real", "self": "self-generated", "add": "real + generated"}
LABELS = {"none": "none", "lr": "LR", "br": "BR", "br+gp": "BR+GP", "br+gp+cr": "BR+GP+CR"}
SETTINGS = dict(samples=8, seq_len=64, held_out_samples=4, steps=6, batch_size=2, lr=1e-3, self_length=2048)
# CPU seconds per cell measured in the former grid (same settings, two threads): the plan's estimate
ESTIMATE_CPU_SECONDS = {"magnitude": 25, "wanda": 35, "sparsegpt": 70}
RECONSTRUCTION_FACTOR = {"none": 0.5, "lr": 1.0, "br": 1.0, "br+gp": 1.0, "br+gp+cr": 1.5}
CALIBRATION_FACTOR = {"text": 1.0, "self": 1.0, "add": 1.7}


def key(cell: dict) -> str:
    return f"{cell['method']}|{cell['pattern']}|{cell['reconstruct']}|{cell['calibration']}"


def plan() -> list[dict]:
    """Every cell, 50% before 2:4 and real calibration first, so a partial grid is balanced."""
    return [dict(method=m, pattern=p, reconstruct=r, calibration=c)
            for p in PATTERNS for c in CALIBRATIONS for m in MASKS for r in RECONSTRUCTIONS]


def estimate(cell: dict) -> float:
    return (ESTIMATE_CPU_SECONDS[cell["method"]] * RECONSTRUCTION_FACTOR[cell["reconstruct"]]
            * CALIBRATION_FACTOR[cell["calibration"]] + 6)  # + loading the model in the child


def done_cells(path: Path = CELLS_FILE) -> dict[str, dict]:
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {key(r): r for r in rows}


def config_of(cell: dict):
    from memstep.compress.sparse import SparseConfig

    pattern = {"nm": cell["pattern"]} if ":" in cell["pattern"] else {"sparsity": float(cell["pattern"].rstrip("%")) / 100}
    return SparseConfig(method=cell["method"], reconstruct=cell["reconstruct"], calibration=cell["calibration"],
                        **pattern, **SETTINGS).validate()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# ---- the child processes -----------------------------------------------------------------------
def child_generate() -> dict:
    """The model writes the self-generated windows once, as the reference writes them."""
    import torch

    from memstep.compress.sparse.calibration import self_generated_windows
    from memstep.models import load_model

    torch.set_num_threads(1)
    lm = load_model("embedded", device="cpu", dtype="float32")
    cpu0 = time.process_time()
    windows = self_generated_windows(lm.model, lm.tokenizer, SETTINGS["samples"], SETTINGS["seq_len"], 0,
                                     SETTINGS["self_length"])
    return {"windows": windows, "cpu_seconds": time.process_time() - cpu0,
            "preview": lm.tokenizer.decode(windows[0][:40])}


def child_cell(cell: dict) -> dict:
    import torch

    from memstep.compress.sparse import SparsePruning
    from memstep.compress.sparse.calibration import calibration_set
    from memstep.models import load_model

    torch.set_num_threads(1)
    lm = load_model("embedded", device="cpu", dtype="float32")
    config = config_of(cell)
    generated = json.loads(GENERATED_FILE.read_text())["windows"] if cell["calibration"] != "text" else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    calibration = calibration_set(lm.model, lm.tokenizer, config, generated=generated)
    run = SparsePruning(lm, config, calibration=calibration)
    for _ in run:
        pass
    r = run.result
    return {**cell, "final_error": r.final_error, "perplexity": r.perplexity, "sparsity": r.sparsity,
            "cpu_seconds": time.process_time() - cpu0, "seconds": time.perf_counter() - wall0,
            "peak_rss_bytes": peak_rss_bytes(), "real_windows": r.real_windows,
            "generated_windows": r.generated_windows, "mask_tokens": r.mask_tokens,
            "errors": {"calibration": [x.error_calibration for x in r.records],
                       "held_out": [x.error_held_out for x in r.records]},
            "min_matrix_sparsity": min(r.matrices.values()), "threads": torch.get_num_threads()}


def child_default() -> dict:
    """`memstep compress sparse` at its defaults, as a user runs it: process CPU seconds and peak RSS."""
    from memstep.cli import main as cli

    cpu0 = time.process_time()
    code = cli(["compress", "sparse", "--quiet", "--json"])
    return {"exit_code": code, "cpu_seconds": time.process_time() - cpu0, "peak_rss_bytes": peak_rss_bytes(),
            "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0)}


def in_child(args: list[str], held: bool = False) -> dict:
    """Run this script as a child holding the heavy-job lock (``held``: the caller holds it for a
    batch of cells); its last stdout line is its JSON."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = ([] if held else ["flock", LOCK]) + [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the table ---------------------------------------------------------------------------------
def add_reductions(rows: list[dict]) -> None:
    """Held-out and calibration error cut against no reconstruction with the same mask, pattern
    and calibration (the calibration error of self/add cells is on their own windows)."""
    nones = {(r["method"], r["pattern"], r["calibration"]): r for r in rows if r["reconstruct"] == "none"}
    for r in rows:
        none = nones.get((r["method"], r["pattern"], r["calibration"]))
        r["reduction"] = None if none is None or r["reconstruct"] == "none" else {
            k: 1 - r["final_error"][k] / none["final_error"][k] for k in ("calibration", "held_out")}


def markdown(rows: list[dict]) -> str:
    order = {key(c): i for i, c in enumerate(
        dict(method=m, pattern=p, reconstruct=r, calibration=c)
        for m in MASKS for p in PATTERNS for c in CALIBRATIONS for r in RECONSTRUCTIONS)}
    rows = sorted(rows, key=lambda r: order[key(r)])
    add_reductions(rows)
    lines = ["| mask | pattern | calibration (real + generated windows) | reconstruction | error calib. | error held-out "
             "| cut vs none (calib. / held-out) | ppl held-out | ppl calib. | CPU s | peak RSS |",
             "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|"]
    if rows:
        dense = {r["calibration"]: r["perplexity"] for r in rows}
        text = dense.get("text") or next(iter(dense.values()))
        lines.append(f"| dense | | | | | | | {text['held_out']['dense']:.2f} | "
                     + " / ".join(f"{CALIBRATION_NAMES[c]} {dense[c]['calibration']['dense']:.2f}"
                                  for c in CALIBRATIONS if c in dense) + " | | |")
    for r in rows:
        cut = r["reduction"]
        cut_text = "" if cut is None else f"{cut['calibration']:.0%} / {cut['held_out']:.0%}"
        lines.append(f"| {r['method']} | {r['pattern']} | {CALIBRATION_NAMES[r['calibration']]} ({r['real_windows']} + "
                     f"{r['generated_windows']}) | {LABELS[r['reconstruct']]} | {r['final_error']['calibration']:.4f} | "
                     f"{r['final_error']['held_out']:.4f} | {cut_text} | {r['perplexity']['held_out']['pruned']:.2f} | "
                     f"{r['perplexity']['calibration']['pruned']:.2f} | {r['cpu_seconds']:.0f} | "
                     f"{r['peak_rss_bytes'] / 2**30:.2f} GiB |")
    return "\n".join(lines)


def coverage(rows: dict[str, dict]) -> str:
    cells = plan()
    left = [c for c in cells if key(c) not in rows]
    text = f"{len(cells) - len(left)} of {len(cells)} cells measured"
    if left:
        groups = {}
        for c in left:
            groups.setdefault(f"{c['method']} {c['pattern']} {CALIBRATION_NAMES[c['calibration']]}", []).append(
                LABELS[c["reconstruct"]])
        text += "; not yet run: " + "; ".join(f"{k} ({', '.join(v)})" for k, v in groups.items())
    return text


def write_docs(text: str, path: Path = DOCS) -> None:
    start, end = "<!-- sparse-results:start -->", "<!-- sparse-results:end -->"
    head, rest = path.read_text().split(start, 1)
    path.write_text(f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}")


def summary(rows: dict[str, dict]) -> dict:
    generated = json.loads(GENERATED_FILE.read_text()) if GENERATED_FILE.is_file() else {}
    default = json.loads(SUMMARY_FILE.read_text()).get("default_run") if SUMMARY_FILE.is_file() else None
    return {"model": "SmolLM2-135M-Instruct (embedded)", "device": "cpu", "threads": 1,
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}; shared with other sessions",
            "settings": {**SETTINGS, "optimizer": "adam", "train": "norms", "mask_data": "real",
                         "held_out": "Pride and Prejudice ch. 1-12", "calibration_text": "Persuasion (excerpt)",
                         "add": "the real windows plus as many self-generated ones (gen_add)",
                         "self_generation_cpu_seconds": generated.get("cpu_seconds"),
                         "error": "||pruned - dense||^2 / ||dense||^2 of the hidden states after the last block, "
                                  "first position of each window (attention sink) left out",
                         "peak_rss": "the cell's own process, model load included"},
            "coverage": coverage(rows), "default_run": default, "cells": list(rows.values()),
            "table": markdown(list(rows.values()))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", action="store_true", help="list the cells, what has run and what is left, and stop")
    p.add_argument("--limit", type=int, default=None, help="run at most this many cells now")
    p.add_argument("--only", nargs="+", default=None, help="cells to run, as method|pattern|reconstruct|calibration")
    p.add_argument("--docs", action="store_true", help="write the table into docs/compress.md")
    p.add_argument("--retable", action="store_true", help="no runs: the table from the cells measured")
    p.add_argument("--default-run", action="store_true", help="measure `memstep compress sparse` at its defaults")
    p.add_argument("--held", action="store_true",
                   help="the caller holds the heavy-job lock for the whole batch: `flock LOCK ... --held --limit N`")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        payload = {"generate": child_generate, "default": child_default}.get(args.child)
        result = payload() if payload else child_cell(dict(zip(("method", "pattern", "reconstruct", "calibration"),
                                                                args.child.split("|"))))
        print(json.dumps(result))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = done_cells()
    left = [c for c in plan() if key(c) not in rows and (args.only is None or key(c) in args.only)]
    if args.plan:
        print(coverage(rows))
        print(f"left: {len(left)} cells, about {sum(map(estimate, left)) / 3600:.1f} CPU-hours (one thread each)")
        return 0
    if args.default_run:
        default = in_child(["--child", "default"], args.held)
        saved = json.loads(SUMMARY_FILE.read_text()) if SUMMARY_FILE.is_file() else {}
        SUMMARY_FILE.write_text(json.dumps({**saved, "default_run": default}, indent=1))
        print(f"memstep compress sparse (defaults): {default['cpu_seconds']:.0f} CPU s, "
              f"peak RSS {default['peak_rss_bytes'] / 2**30:.2f} GiB")
        return 0
    if not args.retable:
        left = left[:args.limit] if args.limit is not None else left
        if any(c["calibration"] != "text" for c in left) and not GENERATED_FILE.is_file():
            generated = in_child(["--child", "generate"], args.held)
            GENERATED_FILE.write_text(json.dumps(generated))
            print(f"self-generated {len(generated['windows'])} windows in {generated['cpu_seconds']:.0f} CPU s: "
                  f"{generated['preview']!r}", flush=True)
        for i, cell in enumerate(left, start=1):
            row = in_child(["--child", key(cell)], args.held)
            with CELLS_FILE.open("a") as out:
                out.write(json.dumps(row) + "\n")
            rows[key(cell)] = row
            print(f"[{i}/{len(left)}] {key(cell)}: error {row['final_error']['calibration']:.4f} / "
                  f"{row['final_error']['held_out']:.4f}, ppl held-out {row['perplexity']['held_out']['pruned']:.2f}, "
                  f"{row['cpu_seconds']:.0f} CPU s, {row['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
    payload = summary(rows)
    SUMMARY_FILE.write_text(json.dumps(payload, indent=1))
    print(payload["table"])
    print(payload["coverage"])
    if args.docs:
        write_docs(f"{payload['table']}\n\n{payload['coverage']}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
