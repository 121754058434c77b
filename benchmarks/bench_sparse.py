"""The reconstruction grid on the embedded model, resumable, one process per cell, with enough
held-out text to tell the methods apart.

Cells: Wanda and SparseGPT masks at 50% unstructured x reconstruction none / LR / BR / BR+GP /
BR+GP+CR x calibration real (Persuasion) and added (the reference's gen_add: the real windows
plus as many self-generated ones), then magnitude at 50% on real text, and Wanda at 2:4 on real
text (``plan``). Every cell prunes all 30 blocks of the model in a process of its own (one torch
thread), so its CPU seconds and peak RSS are its own. Reconstruction trains 5 epochs over every
calibration window, as the reference code does, so added calibration trains twice the steps.

Held-out text: 66 windows of 64 tokens from the start of Pride and Prejudice (4,224 tokens, 4,158
of them predicted; never used for calibration). Per cell: the normalized hidden-state error
after the last block on the calibration windows and on held-out text, held-out and calibration
perplexity, each held-out number with a 95% interval over the 66 windows (perplexity: a t
interval of the per-window mean NLL; error: a seeded bootstrap of the pooled ratio), the
achieved sparsity, the process CPU seconds of calibration + pruning + measurement, and the
process's peak RSS (model load included). A second table compares cells on the same windows
(paired): CR against BR+GP, added against real calibration.

The model writes its pool of texts once (a child process; 8 texts of 2,048 tokens, the
reference's length, cached beside the results) and every added cell draws its windows from it;
the dense model's held-out NLL per window is measured once too. Each finished cell is appended
to a JSON-lines file at once: a stopped run resumes where it stopped. Each child takes the
shared heavy-job lock (``flock``) for its own duration, so other jobs can run between cells.

    .venv/bin/python benchmarks/bench_sparse.py --plan          # the cells, done and left, and what is left costs
    .venv/bin/python benchmarks/bench_sparse.py --limit 10      # run (or resume) up to 10 cells
    flock /tmp/memstep-heavy.lock .venv/bin/python benchmarks/bench_sparse.py --held --limit 10   # one lock hold
    .venv/bin/python benchmarks/bench_sparse.py --docs          # run what is left, then write the tables
    .venv/bin/python benchmarks/bench_sparse.py --retable --docs   # the tables from what has run, no runs
    .venv/bin/python benchmarks/bench_sparse.py --default-run   # CPU s and peak RSS of `memstep compress sparse`

Sized for a shared 2-core CPU: 8 calibration samples of 64 tokens (16 with added windows), 5
epochs in batches of 2 (20 steps per block on real text, 40 with added windows; the CLI
defaults: 16 x 128 tokens, 20 steps). Writes docs/compress.md's tables (between its sparse
markers) with --docs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CELLS_FILE = RESULTS / "bench_sparse_heldout.jsonl"
GENERATED_FILE = RESULTS / "bench_sparse_texts.json"
DENSE_FILE = RESULTS / "bench_sparse_dense.json"
SUMMARY_FILE = RESULTS / "bench_sparse_cpu.json"
DOCS = ROOT / "docs" / "compress.md"
LOCK = os.environ.get("MEMSTEP_HEAVY_LOCK", "/tmp/memstep-heavy.lock")
MASKS = ("magnitude", "wanda", "sparsegpt")
PATTERNS = ("50%", "2:4")
RECONSTRUCTIONS = ("none", "lr", "br", "br+gp", "br+gp+cr")
CALIBRATIONS = ("text", "add")
CALIBRATION_NAMES = {"text": "real", "self": "self-generated", "add": "real + generated"}
LABELS = {"none": "none", "lr": "LR", "br": "BR", "br+gp": "BR+GP", "br+gp+cr": "BR+GP+CR"}
HELD_OUT_WINDOWS = 66  # x 64 tokens: 4,224 held-out tokens, 4,158 of them predicted (at least 4,096)
POOL_TEXTS = 8  # texts of self_length tokens the model writes for the added windows
SETTINGS = dict(samples=8, seq_len=64, held_out_samples=HELD_OUT_WINDOWS, epochs=5, batch_size=2, lr=1e-3,
                self_length=2048, self_texts=POOL_TEXTS)
BOOTSTRAP_DRAWS = 2000
# CPU seconds per cell at these settings (first cells measured here): the plan's estimate
ESTIMATE_CPU_SECONDS = {"magnitude": 90, "wanda": 110, "sparsegpt": 150}
RECONSTRUCTION_FACTOR = {"none": 0.6, "lr": 1.0, "br": 1.0, "br+gp": 1.0, "br+gp+cr": 1.4}
CALIBRATION_FACTOR = {"text": 1.0, "self": 1.0, "add": 1.5}


def key(cell: dict) -> str:
    return f"{cell['method']}|{cell['pattern']}|{cell['reconstruct']}|{cell['calibration']}"


def plan() -> list[dict]:
    """Wanda and SparseGPT at 50% on real and added calibration first (the comparisons the table
    is for), then magnitude 50% and Wanda 2:4 on real text."""
    cells = [dict(method=m, pattern="50%", reconstruct=r, calibration=c)
             for c in CALIBRATIONS for m in ("wanda", "sparsegpt") for r in RECONSTRUCTIONS]
    cells += [dict(method="magnitude", pattern="50%", reconstruct=r, calibration="text") for r in RECONSTRUCTIONS]
    return cells + [dict(method="wanda", pattern="2:4", reconstruct=r, calibration="text") for r in RECONSTRUCTIONS]


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
    """The model writes its pool of texts once, as the reference writes them (8 x 2,048 tokens)."""
    import torch

    from memstep.compress.sparse.calibration import self_generated_texts
    from memstep.models import load_model

    torch.set_num_threads(1)
    lm = load_model("embedded", device="cpu", dtype="float32")
    cpu0 = time.process_time()
    texts = self_generated_texts(lm.model, lm.tokenizer, POOL_TEXTS, SETTINGS["self_length"], seed=0)
    return {"texts": texts, "cpu_seconds": time.process_time() - cpu0,
            "preview": [lm.tokenizer.decode(t[:24]) for t in texts]}


def child_dense() -> dict:
    """The dense model's mean NLL on each held-out window (every cell reuses it)."""
    import torch

    from memstep.compress.data import pooled_perplexity, window_nlls
    from memstep.compress.sparse.calibration import held_out_windows
    from memstep.models import load_model

    torch.set_num_threads(1)
    lm = load_model("embedded", device="cpu", dtype="float32")
    nlls = window_nlls(lm.model, held_out_windows(lm.tokenizer, HELD_OUT_WINDOWS, SETTINGS["seq_len"]))
    return {"nll": [total / n for total, n in nlls], "perplexity": pooled_perplexity(nlls),
            "tokens": HELD_OUT_WINDOWS * SETTINGS["seq_len"], "predicted": sum(n for _, n in nlls)}


def child_cell(cell: dict) -> dict:
    import torch

    from memstep.compress.data import pooled_perplexity, window_nlls
    from memstep.compress.sparse import SparsePruning
    from memstep.compress.sparse.calibration import calibration_set
    from memstep.models import load_model

    torch.set_num_threads(1)
    lm = load_model("embedded", device="cpu", dtype="float32")
    config = config_of(cell)
    texts = json.loads(GENERATED_FILE.read_text())["texts"] if cell["calibration"] != "text" else None
    dense_held = json.loads(DENSE_FILE.read_text())["perplexity"]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    calibration = calibration_set(lm.model, lm.tokenizer, config, texts=texts)
    dense_calibration = pooled_perplexity(window_nlls(lm.model, calibration.windows[:calibration.recon]))
    run = SparsePruning(lm, config, calibration=calibration,
                        dense_perplexity={"calibration": dense_calibration, "held_out": dense_held})
    for _ in run:
        pass
    r = run.result
    return {**cell, "final_error": r.final_error, "perplexity": r.perplexity, "sparsity": r.sparsity,
            "cpu_seconds": time.process_time() - cpu0, "seconds": time.perf_counter() - wall0,
            "peak_rss_bytes": peak_rss_bytes(), "real_windows": r.real_windows,
            "generated_windows": r.generated_windows, "generated_texts": r.generated_texts,
            "mask_tokens": r.mask_tokens, "epochs": r.epochs, "steps": r.steps, "held_out_windows": r.held_out_windows,
            "held_out_tokens": r.held_out_tokens,
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


def perplexity_interval(nll: list[float]) -> tuple[float, float]:
    """95% interval of the held-out perplexity: a t interval of the per-window mean NLL, exponentiated."""
    from memstep.evaluation.stats import mean_interval

    found = mean_interval(nll)
    return math.exp(found["low"]), math.exp(found["high"])


def ratio_interval(squared: list[float], reference: list[float], draws: int = BOOTSTRAP_DRAWS,
                   seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the pooled error sum(squared) / sum(reference),
    resampling windows (seeded)."""
    rng = random.Random(seed)
    n = len(squared)
    values = []
    for _ in range(draws):
        picked = [rng.randrange(n) for _ in range(n)]
        values.append(sum(squared[i] for i in picked) / sum(reference[i] for i in picked))
    values.sort()
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def paired_change(first: dict, second: dict) -> tuple[float, float, float]:
    """Held-out perplexity of ``first`` against ``second`` on the same windows: the mean
    per-window NLL difference's t interval, as a relative change exp(d) - 1 (mean, low, high)."""
    from memstep.evaluation.stats import mean_interval

    found = mean_interval([a - b for a, b in zip(first["held_out_windows"]["nll_pruned"],
                                                  second["held_out_windows"]["nll_pruned"])])
    return tuple(math.exp(found[k]) - 1 for k in ("mean", "low", "high"))


def _order(rows: list[dict]) -> list[dict]:
    order = {key(c): i for i, c in enumerate(
        dict(method=m, pattern=p, reconstruct=r, calibration=c)
        for m in MASKS for p in PATTERNS for c in CALIBRATIONS for r in RECONSTRUCTIONS)}
    return sorted(rows, key=lambda r: order[key(r)])


def markdown(rows: list[dict], dense: dict | None = None) -> str:
    rows = _order(rows)
    add_reductions(rows)
    lines = ["| mask | pattern | calibration (real + generated windows) | reconstruction | steps per block "
             "| error calib. | error held-out (95%) | cut vs none (calib. / held-out) | ppl held-out (95%) "
             "| ppl calib. | CPU s | peak RSS |",
             "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    if dense:
        low, high = perplexity_interval(dense["nll"])
        calibrations = {r["calibration"]: r["perplexity"]["calibration"]["dense"] for r in rows}
        lines.append(f"| dense | | | | | | | | {dense['perplexity']:.2f} ({low:.2f}-{high:.2f}) | "
                     + " / ".join(f"{CALIBRATION_NAMES[c]} {calibrations[c]:.2f}" for c in CALIBRATIONS
                                  if c in calibrations) + " | | |")
    for r in rows:
        cut = r["reduction"]
        cut_text = "" if cut is None else f"{cut['calibration']:.0%} / {cut['held_out']:.0%}"
        windows = r["held_out_windows"]
        e_low, e_high = ratio_interval(windows["error_squared"], windows["error_reference"])
        p_low, p_high = perplexity_interval(windows["nll_pruned"])
        lines.append(f"| {r['method']} | {r['pattern']} | {CALIBRATION_NAMES[r['calibration']]} ({r['real_windows']} + "
                     f"{r['generated_windows']}) | {LABELS[r['reconstruct']]} | {r['steps'] or ''} | "
                     f"{r['final_error']['calibration']:.4f} | {r['final_error']['held_out']:.4f} "
                     f"({e_low:.4f}-{e_high:.4f}) | {cut_text} | {r['perplexity']['held_out']['pruned']:.2f} "
                     f"({p_low:.2f}-{p_high:.2f}) | {r['perplexity']['calibration']['pruned']:.2f} | "
                     f"{r['cpu_seconds']:.0f} | {r['peak_rss_bytes'] / 2**30:.2f} GiB |")
    return "\n".join(lines)


def comparisons(rows: list[dict]) -> list[tuple[str, dict, dict]]:
    """The paired comparisons the grid can make: each reconstruction against none, CR against
    BR+GP, and added against real calibration, cell by cell."""
    found = {key(r): r for r in rows}
    pairs = []
    for r in _order(rows):
        base = dict(method=r["method"], pattern=r["pattern"], calibration=r["calibration"])
        if r["reconstruct"] != "none" and key({**base, "reconstruct": "none"}) in found:
            pairs.append((f"{LABELS[r['reconstruct']]} vs none", r, found[key({**base, "reconstruct": "none"})]))
        if r["reconstruct"] == "br+gp+cr" and key({**base, "reconstruct": "br+gp"}) in found:
            pairs.append(("BR+GP+CR vs BR+GP", r, found[key({**base, "reconstruct": "br+gp"})]))
        if r["calibration"] == "add" and key({**r, "calibration": "text"}) in found:
            pairs.append((f"added vs real ({LABELS[r['reconstruct']]})", r, found[key({**r, "calibration": "text"})]))
    return pairs


def paired_markdown(rows: list[dict]) -> str:
    lines = ["| comparison | mask | pattern | calibration | held-out ppl | held-out ppl change (95%) | apart? |",
             "|---|---|---|---|---|---:|---|"]
    for label, first, second in comparisons(rows):
        change, low, high = paired_change(first, second)
        apart = "lower" if high < 0 else "higher" if low > 0 else "no"
        calibration = "real → added" if label.startswith("added") else CALIBRATION_NAMES[first["calibration"]]
        lines.append(f"| {label} | {first['method']} | {first['pattern']} | {calibration} | "
                     f"{second['perplexity']['held_out']['pruned']:.2f} → {first['perplexity']['held_out']['pruned']:.2f}"
                     f" | {change:+.1%} ({low:+.1%} to {high:+.1%}) | {apart} |")
    return "\n".join(lines)


def coverage(rows: dict[str, dict]) -> str:
    cells = plan()
    left = [c for c in cells if key(c) not in rows]
    tokens = HELD_OUT_WINDOWS * SETTINGS["seq_len"]
    text = (f"{len(cells) - len(left)} of {len(cells)} cells measured; held-out: {HELD_OUT_WINDOWS} windows of "
            f"{SETTINGS['seq_len']} tokens of Pride and Prejudice per cell ({tokens:,} tokens, "
            f"{tokens - HELD_OUT_WINDOWS:,} predicted)")
    if left:
        groups = {}
        for c in left:
            groups.setdefault(f"{c['method']} {c['pattern']} {CALIBRATION_NAMES[c['calibration']]}", []).append(
                LABELS[c["reconstruct"]])
        text += "; not yet run: " + "; ".join(f"{k} ({', '.join(v)})" for k, v in groups.items())
    return text


def write_docs(text: str, path: Path = DOCS, marker: str = "sparse-results") -> None:
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    head, rest = path.read_text().split(start, 1)
    path.write_text(f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}")


def summary(rows: dict[str, dict]) -> dict:
    generated = json.loads(GENERATED_FILE.read_text()) if GENERATED_FILE.is_file() else {}
    dense = json.loads(DENSE_FILE.read_text()) if DENSE_FILE.is_file() else None
    default = json.loads(SUMMARY_FILE.read_text()).get("default_run") if SUMMARY_FILE.is_file() else None
    return {"model": "SmolLM2-135M-Instruct (embedded)", "device": "cpu", "threads": 1,
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}; shared with other sessions",
            "settings": {**SETTINGS, "optimizer": "adam", "train": "norms", "mask_data": "real",
                         "held_out": "Pride and Prejudice ch. 1-12, from its start", "calibration_text":
                         "Persuasion (excerpt)", "add": "the real windows plus as many self-generated ones (gen_add), "
                         f"drawn at random offsets from {POOL_TEXTS} texts the model wrote",
                         "self_generation_cpu_seconds": generated.get("cpu_seconds"),
                         "error": "||pruned - dense||^2 / ||dense||^2 of the hidden states after the last block, "
                                  "first position of each window (attention sink) left out",
                         "intervals": "95% over the held-out windows: perplexity, t interval of the per-window mean "
                                      f"NLL; error, percentile bootstrap ({BOOTSTRAP_DRAWS} draws) of the pooled ratio; "
                                      "paired changes, t interval of the per-window NLL differences",
                         "peak_rss": "the cell's own process, model load included"},
            "coverage": coverage(rows), "default_run": default, "dense": dense, "cells": list(rows.values()),
            "table": markdown(list(rows.values()), dense), "paired": paired_markdown(list(rows.values()))}


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
        payload = {"generate": child_generate, "dense": child_dense, "default": child_default}.get(args.child)
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
            print(f"self-generated {len(generated['texts'])} texts in {generated['cpu_seconds']:.0f} CPU s: "
                  f"{generated['preview']!r}", flush=True)
        if left and not DENSE_FILE.is_file():
            DENSE_FILE.write_text(json.dumps(in_child(["--child", "dense"], args.held)))
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
    print(payload["paired"])
    print(payload["coverage"])
    if args.docs:
        write_docs(f"{payload['table']}\n\n{payload['coverage']}.")
        write_docs(payload["paired"], marker="sparse-paired")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
