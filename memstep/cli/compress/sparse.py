"""`memstep compress sparse`: prune a model block by block with reconstruction (LR, BR, GP, CR)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from memstep.cli.common import add_force_option, output_folder, saved_into
from memstep.errors import MemstepError

SHOWN_MATRICES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def register(sub) -> None:
    from memstep.compress.sparse.config import (MASK_DATA, METHODS, OPTIMIZERS, RECONSTRUCTIONS, SOURCES, TRAINABLE,
                                                SparseConfig)

    d = SparseConfig()
    p = sub.add_parser(
        "sparse", help="prune weights (magnitude, Wanda, SparseGPT) and reconstruct block by block",
        description="Prune every decoder block's linear layers to a sparsity (or N:M), then fit the surviving "
                    "weights to the dense model's outputs (LR, BR, BR+GP, BR+GP+CR; Shin et al., EMNLP 2024). "
                    "Prints per block the normalized reconstruction error on calibration and held-out text, "
                    "perplexity before/after and the achieved sparsity; saves a model folder with --output.")
    p.add_argument("--model", default=None, help="the model to prune (default: the embedded SmolLM2-135M)")
    p.add_argument("--method", default=d.method, help=f"mask: {', '.join(METHODS)} (default {d.method})")
    p.add_argument("--sparsity", type=float, default=d.sparsity, help="unstructured sparsity in (0, 1) (default 0.5)")
    p.add_argument("--nm", default=None, help="N:M sparsity instead, e.g. 2:4 or 4:8")
    p.add_argument("--reconstruct", default=d.reconstruct,
                   help=f"{' | '.join(RECONSTRUCTIONS)} (cr: br+gp+cr) (default {d.reconstruct})")
    p.add_argument("--calibration", default=d.calibration, metavar="SOURCE",
                   help=f"{' | '.join(SOURCES)} | FILE: real text (bundled Persuasion, or --calibration-text), text "
                        f"the dense model generates, half of each, real text plus --self-samples generated windows "
                        f"added to it (the reference code's gen_add), or your own text file (.txt, .md, .pdf, .html; "
                        f"short for --calibration text --calibration-text FILE) (default {d.calibration})")
    p.add_argument("--calibration-text", default=None, metavar="FILE",
                   help="your own text as the real calibration text (default: Persuasion, bundled)")
    p.add_argument("--mask-data", default=d.mask_data, choices=MASK_DATA,
                   help="the windows the masks' statistics come from: real text only, as the reference code, or "
                        f"all calibration windows, self-generated ones included (default {d.mask_data})")
    p.add_argument("--self-length", type=int, default=d.self_length,
                   help=f"tokens of each self-generated text (default {d.self_length}; the reference code: 2048)")
    p.add_argument("--self-samples", type=int, default=None,
                   help="with --calibration add: self-generated windows added to the --samples real ones "
                        "(default: as many as --samples)")
    p.add_argument("--self-texts", type=int, default=None,
                   help="texts the model writes; each generated window is drawn from one at random, at a random "
                        "offset, seeded by --seed, as the reference code draws them (default: one text per "
                        "generated window)")
    p.add_argument("--train", default=d.train_params, choices=TRAINABLE,
                   help="what BR/CR trains: norms = every block parameter (surviving linear weights, biases, norm "
                        f"gains) as the reference code; linear = the surviving linear weights only (default "
                        f"{d.train_params})")
    p.add_argument("--samples", type=int, default=d.samples, help=f"calibration samples (default {d.samples})")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help=f"tokens per sample (default {d.seq_len})")
    p.add_argument("--held-out-samples", type=int, default=d.held_out_samples,
                   help=f"held-out windows of Pride and Prejudice (default {d.held_out_samples})")
    p.add_argument("--optimizer", default=d.optimizer, help=f"{', '.join(OPTIMIZERS)} (default {d.optimizer})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"learning rate, decays linearly to 0 (default {d.lr:g})")
    p.add_argument("--epochs", type=int, default=d.epochs,
                   help=f"passes over every reconstruction window per block or window, as the reference code trains: "
                        f"epochs x ceil(windows / batch size) steps, so added windows add steps (default {d.epochs})")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per block or window, instead of --epochs (default: from the epochs)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"samples per step (default {d.batch_size})")
    p.add_argument("--damp", type=float, default=d.damp, help="SparseGPT damping (fraction of mean diag H)")
    p.add_argument("--block-columns", type=int, default=d.block_columns, help="SparseGPT columns per block")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--output", default=None, help="save the pruned model to this folder (new or empty)")
    add_force_option(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sparse)


def calibration_source(args) -> tuple[str, str | None]:
    """(source, the user's text file or None) from --calibration and --calibration-text."""
    from memstep.compress.sparse.config import SOURCES

    if args.calibration in SOURCES:
        return args.calibration, args.calibration_text
    if not Path(args.calibration).suffix:
        raise MemstepError(f"unknown calibration '{args.calibration}': choose one of {', '.join(SOURCES)} or give a "
                           "text file (.txt, .md, .pdf, .html)")
    if args.calibration_text:
        raise MemstepError(f"--calibration {args.calibration} and --calibration-text both name a file: give one")
    return "text", args.calibration


def real_windows_needed(config) -> int:
    """How many windows of real text the settings read (0: none, e.g. self-generated with magnitude)."""
    if config.calibration in ("text", "add"):
        return config.samples
    if config.calibration == "both":
        return config.samples // 2
    return config.samples if config.mask_data == "real" and config.method != "magnitude" else 0


def read_calibration_text(path: str | None, config) -> str | None:
    """The user's calibration text, checked before any model loads: type, size, binary and
    empty as for documents, and long enough for the windows asked (a token takes at least one
    byte, so fewer bytes than tokens needed can never fill them; the exact count follows once
    the tokenizer is loaded)."""
    from memstep.compress.data import read_calibration

    if path is None:
        return None
    text = read_calibration(path)
    needed = real_windows_needed(config) * config.seq_len
    size = len(text.encode("utf-8"))
    if size < needed:
        raise MemstepError(f"the calibration text {Path(path).name} is too short: {size:,} bytes cannot hold "
                           f"{needed:,} tokens ({real_windows_needed(config)} windows of {config.seq_len}); give a "
                           "longer text or lower --samples or --seq-len")
    return text


def config_from_args(args):
    from memstep.compress.sparse.config import SparseConfig

    source, path = calibration_source(args)
    reconstruct = {"cr": "br+gp+cr"}.get(args.reconstruct, args.reconstruct)  # CR always runs with GP
    return SparseConfig(method=args.method, sparsity=args.sparsity, nm=args.nm, reconstruct=reconstruct,
                        calibration=source, calibration_file=Path(path).name if path else None,
                        mask_data=args.mask_data, samples=args.samples, seq_len=args.seq_len,
                        self_length=args.self_length, self_samples=args.self_samples, self_texts=args.self_texts,
                        held_out_samples=args.held_out_samples, optimizer=args.optimizer, lr=args.lr,
                        epochs=args.epochs, steps=args.steps, batch_size=args.batch_size, damp=args.damp,
                        block_columns=args.block_columns, seed=args.seed, train_params=args.train).validate()


def format_result(result) -> str:
    s = result.settings
    pattern = f"{s['nm']}" if s["nm"] else f"{s['sparsity']:.0%} unstructured"
    source = s["calibration"] + (f" ({s['calibration_file']})" if s.get("calibration_file") else "")
    masks = (f", masks from {result.mask_tokens:,} tokens of real text" if result.mask_tokens
             and s.get("mask_data") == "real" and s["calibration"] != "text" else "")
    counts = (f"{result.real_windows} real + {result.generated_windows} self-generated windows of {s['seq_len']} "
              f"tokens from {result.generated_texts} generated text{'s' if result.generated_texts != 1 else ''}"
              if result.generated_windows else f"{result.real_windows} x {s['seq_len']} tokens")
    lines = [f"{result.model}: {s['method']} {pattern}, reconstruction {s['reconstruct']} (training "
             f"{s.get('train_params', 'linear')}), calibration {source} ({counts}{masks}), "
             f"{result.seconds:.0f} s"]
    if result.steps:
        windows = result.real_windows + result.generated_windows
        batch = min(s["batch_size"], windows)
        lines.append(f"reconstruction: {result.epochs} epoch{'s' if result.epochs != 1 else ''} over {windows} windows "
                     f"in batches of {batch} = {result.steps} steps per block" if result.epochs else
                     f"reconstruction: {result.steps} steps per block (--steps; one epoch over {windows} windows in "
                     f"batches of {batch} is {result.steps_per_epoch} steps)")
    lines.append(f"{'block':>5} {'calib err':>10} {'(masked)':>10} {'held err':>10} {'(masked)':>10} "
                 f"{'sparsity':>8} {'seconds':>8}")
    for r in result.records:
        lines.append(f"{r.block:>5} {r.error_calibration:>10.4f} {r.error_calibration_masked:>10.4f} "
                     f"{r.error_held_out:>10.4f} {r.error_held_out_masked:>10.4f} {r.sparsity:>8.2%} {r.seconds:>8.1f}")
    ppl = result.perplexity
    held = held_out_interval(result)
    lines.append(f"perplexity calibration {ppl['calibration']['dense']:.2f} -> {ppl['calibration']['pruned']:.2f}, "
                 f"held-out {ppl['held_out']['dense']:.2f} -> {ppl['held_out']['pruned']:.2f}{held}")
    per_kind = {}
    for name, value in result.matrices.items():
        kind = ".".join(name.split(".")[3:5])
        per_kind.setdefault(kind, []).append(value)
    lines.append(f"sparsity {result.sparsity:.4%} of {len(result.matrices)} matrices; per matrix (min-max): " +
                 ", ".join(f"{k.split('.')[-1]} {min(v):.2%}-{max(v):.2%}" for k, v in per_kind.items()))
    if result.output:
        lines.append(f"saved to {result.output} (zeros recounted in the saved files: "
                     f"{'match' if result.verified else 'MISMATCH'}); run it: memstep run DOC --model {result.output}")
    return "\n".join(lines)


def held_out_interval(result) -> str:
    """The pruned model's held-out perplexity's 95% interval over the windows (a t interval of
    the per-window mean NLL), as a suffix; empty with fewer than two windows."""
    from memstep.evaluation.stats import mean_interval

    found = mean_interval(result.held_out_windows.get("nll_pruned", []))
    if not found or found["low"] is None:
        return ""
    return (f" (95% interval {math.exp(found['low']):.2f}-{math.exp(found['high']):.2f} over {found['n']} windows of "
            f"{result.settings['seq_len']} tokens)")


def cmd_sparse(args) -> int:
    output_folder(args)  # before anything loads
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from memstep.compress.sparse.process import SparsePruning
    from memstep.models import load_model

    config = config_from_args(args)
    text = read_calibration_text(calibration_source(args)[1], config)
    hf_logging.disable_progress_bar()
    lm = load_model(args.model, args.device, "float32")
    output_folder(args, lm.model)  # room on its disk for the pruned model
    run = SparsePruning(lm, config, output=args.output, calibration_text=text)
    blocks = len(lm.model.model.layers)
    with tqdm(total=blocks, desc=f"{config.method} {config.reconstruct}", unit="block", file=sys.stderr,
              disable=args.quiet) as bar, saved_into(args):
        for record in run:
            bar.update(1)
            bar.set_postfix(calib=f"{record.error_calibration:.4f}", held=f"{record.error_held_out:.4f}",
                            sparsity=f"{record.sparsity:.1%}")
    payload = run.result.to_dict()
    print(json.dumps(payload) if args.json else format_result(run.result))
    return 0
