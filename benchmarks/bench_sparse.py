"""Pruning with reconstruction on the embedded model: error reduction, perplexity, passkey and a
generation sample per technique, with memstep's defaults and with the reference code's choices.

The grid: Wanda and SparseGPT masks x 50% unstructured and 2:4 x reconstruction none / LR / BR /
BR+GP / BR+GP+CR on text calibration (Persuasion), training every block parameter (``--train
norms``, the reference code's choice and memstep's default). Then Wanda 50% again: BR+GP and
BR+GP+CR training the linear weights only (``--train linear``, memstep's former choice); and
BR+GP / BR+GP+CR on self-generated calibration written as the reference does (greedy English
starts, top-k 50, one 2,048-token text cut into windows, masks from real text), and BR+GP+CR
on half real, half self-generated windows. For each run: the normalized error after the last
block on the calibration data and on held-out text (Pride and Prejudice), its reduction against
no reconstruction with the same mask (the seed paper reports 87-94% in total on LLaMA-7B),
perplexity before/after on both, passkey accuracy (5 cases at ~1k tokens, full cache), a greedy
generation sample, the achieved sparsity and seconds. Every run prunes all 30 blocks of a fresh copy.

    OMP_NUM_THREADS=2 nice -n 10 .venv/bin/python benchmarks/bench_sparse.py --docs
    .venv/bin/python benchmarks/bench_sparse.py --samples 2 --seq-len 32 --steps 2 --grid wanda:0.5 --extra  # a look

Sized to finish in about 25 minutes on a shared 2-core CPU, so it uses fewer calibration tokens
and steps than the CLI defaults (see the JSON's "settings"): the reductions here are those of
short reconstructions. Writes the tables of docs/compress.md (between its sparse markers) with --docs.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import torch

from memstep.compress.quality import SAMPLE_PROMPT, generation_sample, make_probe, passkey_answers
from memstep.compress.sparse import RECONSTRUCTIONS, SparseConfig, SparsePruning
from memstep.compress.sparse.calibration import calibration_set, self_generated_windows
from memstep.models import LoadedModel, load_model
from memstep.passkey import answer_contains_passkey

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "compress.md"
GRID = ("wanda:0.5", "wanda:2:4", "sparsegpt:0.5", "sparsegpt:2:4")
# (reconstruction, calibration, train) run again on the first cell of the grid
EXTRA = (("br+gp", "text", "linear"), ("br+gp+cr", "text", "linear"), ("br+gp", "self", "norms"),
         ("br+gp+cr", "self", "norms"), ("br+gp+cr", "both", "norms"))
SELF_LENGTH = 2048  # the reference's generation length
LABELS = {"none": "none", "lr": "LR", "br": "BR", "br+gp": "BR+GP", "br+gp+cr": "BR+GP+CR"}


def parse_cell(cell: str) -> tuple[str, dict]:
    method, _, pattern = cell.partition(":")
    return method, ({"nm": pattern} if ":" in pattern else {"sparsity": float(pattern)})


def run_one(base, config: SparseConfig, dense_ppl: dict, generated: list, passkeys) -> dict:
    """Prune a fresh copy; the dense perplexity is measured once per calibration source (same windows)."""
    lm = LoadedModel(copy.deepcopy(base.model), base.tokenizer, base.name, base.device, base.dtype)
    cpu0 = time.process_time()
    calibration = calibration_set(lm.model, lm.tokenizer, config, generated=generated)
    process = SparsePruning(lm, config, dense_perplexity=dense_ppl.get(config.calibration), calibration=calibration)
    for _ in process:
        pass
    r = process.result
    cpu = time.process_time() - cpu0
    dense_ppl[config.calibration] = {k: v["dense"] for k, v in r.perplexity.items()}
    answers = passkey_answers(lm, passkeys)
    return {"method": config.method, "pattern": config.nm or f"{config.sparsity:.0%}",
            "reconstruct": config.reconstruct, "calibration": config.calibration, "train": config.train_params,
            "final_error": r.final_error, "perplexity": r.perplexity, "sparsity": r.sparsity,
            "seconds": r.seconds, "cpu_seconds": cpu,
            "passkey_correct": [answer_contains_passkey(a, d.answer) for a, d in zip(answers, passkeys)],
            "passkey_answers": answers, "sample": generation_sample(lm),
            "windows_trained": [r2.steps for r2 in r.records][-1:], "mask_tokens": r.mask_tokens,
            "generated_windows": r.generated_windows,
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


def markdown(runs: list[dict], dense: dict | None = None) -> str:
    lines = ["| mask | pattern | calibration | reconstruction | trains | error calib. | error held-out | cut vs none "
             "(calib. / held-out) | ppl calib. | ppl held-out | passkey | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if runs:
        ppl = runs[0]["perplexity"]
        keys = f"{sum(dense['passkey_correct'])}/{len(dense['passkey_correct'])}" if dense else ""
        lines.append(f"| dense | | text | | | | | | {ppl['calibration']['dense']:.2f} | {ppl['held_out']['dense']:.2f} | "
                     f"{keys} | |")
    for r in runs:
        cut = r.get("reduction")
        cut_text = "" if not cut or r["reconstruct"] == "none" else \
            f"{'—' if cut['calibration'] is None else format(cut['calibration'], '.0%')} / {cut['held_out']:.0%}"
        trains = "" if r["reconstruct"] in ("none", "lr") else r["train"]
        lines.append(f"| {r['method']} | {r['pattern']} | {r['calibration']} | {LABELS[r['reconstruct']]} | {trains} | "
                     f"{r['final_error']['calibration']:.4f} | {r['final_error']['held_out']:.4f} | {cut_text} | "
                     f"{r['perplexity']['calibration']['pruned']:.2f} | {r['perplexity']['held_out']['pruned']:.2f} | "
                     f"{sum(r['passkey_correct'])}/{len(r['passkey_correct'])} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def samples_table(runs: list[dict], dense: dict | None) -> str:
    lines = [f"Greedy answers to \"{SAMPLE_PROMPT}\" (40 new tokens):", "", "| model | answer |", "|---|---|"]
    rows = ([("dense", dense["sample"])] if dense else []) + [
        (f"{r['method']} {r['pattern']} {r['calibration']} {LABELS[r['reconstruct']]}"
         + (f" ({r['train']})" if r["reconstruct"] not in ("none", "lr") else ""), r["sample"]) for r in runs]
    lines += [f"| {label} | {text.replace('|', chr(92) + '|').replace(chr(10), ' ') or '*(nothing: it ends at once)*'} |"
              for label, text in rows]
    return "\n".join(lines)


def sample_runs(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r["method"] == "wanda" and r["reconstruct"] in ("none", "br+gp", "br+gp+cr")]


def write_docs(text: str, path: Path = DOCS) -> None:
    start, end = "<!-- sparse-results:start -->", "<!-- sparse-results:end -->"
    head, rest = path.read_text().split(start, 1)
    path.write_text(f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--held-out-samples", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--self-length", type=int, default=SELF_LENGTH)
    p.add_argument("--grid", nargs="+", default=list(GRID), help="method:sparsity or method:N:M cells")
    p.add_argument("--reconstructions", nargs="+", default=list(RECONSTRUCTIONS))
    p.add_argument("--no-extra", action="store_true", help="skip the --train linear and self-generated runs")
    p.add_argument("--passkey-cases", type=int, default=5)
    p.add_argument("--output", default=None)
    p.add_argument("--docs", action="store_true", help="also put the tables into docs/compress.md")
    p.add_argument("--retable", default=None, help="re-render the tables of an existing JSON result (no runs)")
    args = p.parse_args(argv)
    if args.retable:
        payload = json.loads(Path(args.retable).read_text())
        add_reductions(payload["runs"])
        payload["table"] = markdown(payload["runs"], payload["dense"])
        payload["samples"] = samples_table(sample_runs(payload["runs"]), payload["dense"])
        Path(args.retable).write_text(json.dumps(payload, indent=1))
        if args.docs:
            write_docs(f"{payload['table']}\n\n{payload['samples']}")
        print(payload["table"])
        return 0
    base = load_model("embedded", device="cpu", dtype="float32")
    common = dict(samples=args.samples, seq_len=args.seq_len, held_out_samples=args.held_out_samples,
                  steps=args.steps, batch_size=args.batch_size, lr=args.lr, self_length=args.self_length)
    plan = [(cell, rec, "text", "norms") for cell in args.grid for rec in args.reconstructions]
    plan += [] if args.no_extra else [(args.grid[0], rec, cal, train) for rec, cal, train in EXTRA]
    started = time.perf_counter()
    passkeys = make_probe(base.tokenizer, windows=1, passkey_cases=args.passkey_cases, prefill_tokens=16).passkeys
    dense_answers = passkey_answers(base, passkeys)
    dense = {"passkey_correct": [answer_contains_passkey(a, d.answer) for a, d in zip(dense_answers, passkeys)],
             "passkey_answers": dense_answers, "sample": generation_sample(base)}
    generated, generation_seconds = [], 0.0
    if any(cal != "text" for _, _, cal, _ in plan):  # the model writes its text once; every run reuses it
        began = time.perf_counter()
        generated = self_generated_windows(base.model, base.tokenizer, args.samples, args.seq_len, 0, args.self_length)
        generation_seconds = time.perf_counter() - began
        print(f"self-generated {len(generated)} windows in {generation_seconds:.0f} s: "
              f"{base.tokenizer.decode(generated[0][:40])!r}", flush=True)
    runs, dense_ppl = [], {}
    for i, (cell, rec, calibration, train) in enumerate(plan, start=1):
        method, pattern = parse_cell(cell)
        config = SparseConfig(method=method, reconstruct=rec, calibration=calibration, train_params=train, **pattern,
                              **common).validate()
        run = run_one(base, config, dense_ppl, generated, passkeys)
        runs.append(run)
        print(f"[{i}/{len(plan)}] {cell} {rec} {calibration} {train}: error {run['final_error']['calibration']:.4f} / "
              f"{run['final_error']['held_out']:.4f}, ppl held-out {run['perplexity']['held_out']['pruned']:.2f}, "
              f"passkey {sum(run['passkey_correct'])}/{len(passkeys)}, {run['seconds']:.0f} s", flush=True)
    add_reductions(runs)
    table = markdown(runs, dense)
    samples = samples_table(sample_runs(runs), dense)
    payload = {"model": base.name, "device": "cpu", "threads": torch.get_num_threads(),
               "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}; shared with other sessions",
               "settings": {**common, "optimizer": "adam", "held_out": "Pride and Prejudice ch. 1-12",
                            "calibration_text": "Persuasion (excerpt)", "mask_data": "real",
                            "passkey_cases": args.passkey_cases, "self_generation_seconds": generation_seconds,
                            "error": "||pruned - dense||^2 / ||dense||^2 of the hidden states after the last block, "
                                     "first position of each window (attention sink) left out"},
               "dense": dense, "seconds": time.perf_counter() - started, "runs": runs, "table": table,
               "samples": samples}
    out = Path(args.output) if args.output else RESULTS / "bench_sparse_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    print(table)
    print(samples)
    if args.docs:
        write_docs(f"{table}\n\n{samples}")
    print(f"wrote {out} ({payload['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
