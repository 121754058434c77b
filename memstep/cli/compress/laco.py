"""`memstep compress laco`: collapse layers with LaCo, step by step, and measure what it
keeps and saves against the dense model and layer-removal baselines at the same ratio.

Parsing imports no torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memstep.cli.common import add_force_option, at_least, output_folder, saved_into

# Mirrors memstep.compress.laco.DEFAULTS (kept literal so the parser needs no torch import).
C, L, I, T = 3, 0, 1, 0.45  # noqa: E741


def register(sub) -> None:
    p = sub.add_parser(
        "laco", help="layer collapse (LaCo): merge rear layers into earlier ones, measured against baselines",
        description="LaCo (Yang et al., EMNLP 2024 Findings), with its notebook's conventions: from l = H - C "
                    "down to L, merge layers l..l+C-1 into layer l (theta_l + sum_k (theta_{l+k} - theta_l) on "
                    "attention and MLP weights), keep the merge when the cosine similarity of the final hidden "
                    "states with the dense model's on the calibration sentences is above T (then l -= I, else "
                    "l -= 1). Then measure held-out perplexity, passkey accuracy, a generation sample, sizes and "
                    "prefill seconds of the dense model, LaCo, and block-influence and uniform layer removal at "
                    "the same number of layers. A model LaCo's check finds worse than dropping the same number of "
                    "layers by block influence (or past --guard) is not saved: the command exits 1 with one line "
                    "naming both perplexities, unless --keep-worse.")
    p.add_argument("--model", default=None, help="'embedded' (default), a hub id or a folder")
    p.add_argument("--C", type=int, default=C, help=f"layers per merge: the base and C-1 above it (default {C}; "
                                                     "C = 2 only copies the upper layer)")
    p.add_argument("--L", type=int, default=L, help=f"lowest base layer tried (the notebook's LOWEST_LAY, default {L})")
    p.add_argument("--H", type=int, default=None,
                   help="the highest layer's index (the notebook's HIGHEST_LAY): the first candidate merges layers "
                        "H-C .. H-1 (default: the top layer's index; the model's depth lets the first window reach "
                        "the top layer)")
    p.add_argument("--I", type=int, default=I, help=f"step down after an accepted merge (default {I})")
    p.add_argument("--T", type=float, default=T, help=f"similarity threshold in (0, 1] (default {T})")
    p.add_argument("--variant", default="paper", choices=("paper", "notebook"),
                   help="paper: the RDSC formula; notebook: what the authors' notebook computes (the last merged "
                        "layer's weights)")
    p.add_argument("--reference", default="dense", choices=("dense", "current"),
                   help="compare candidates with the dense model (paper) or with the model collapsed so far")
    p.add_argument("--merge", default="chained", choices=("chained", "run"),
                   help="chained: a window that takes in a merged layer merges its merged weights (paper and "
                        "notebook); run: one RDSC over the original layers of the whole run (default chained)")
    add_measure_options(p, "the collapsed model", "block influence is always measured: the guard compares against it",
                        "LaCo and block influence at the same layer count",
                        "save the collapsed model even when the check finds it worse than block influence at the same "
                        "layer count (or past --guard); the report says so")
    p.set_defaults(func=cmd_laco)


def add_measure_options(p, what: str, baselines_note: str, checked: str, keep_help: str) -> None:
    """Calibration, measurement, output and guard options shared by `compress laco` and `compress drop`."""
    from memstep.compress.guard import CHECK_WINDOWS  # (torch-free)

    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="your own text (.txt, .md, .pdf, .html): its paragraphs, separated by blank lines, are the "
                        "calibration sentences (default: Persuasion, bundled)")
    p.add_argument("--sentences", type=int, default=None, help="calibration paragraphs used (default 6)")
    p.add_argument("--calibration-tokens", type=int, default=None, help="tokens per paragraph, at most (default 128)")
    p.add_argument("--no-eval", action="store_true",
                   help="skip the passkeys, the prefill timing, the generation samples and uniform removal; the "
                        f"check still runs (held-out perplexity of the dense model, {checked} on {CHECK_WINDOWS} x 256 "
                        "tokens) and decides the save as with the measurements")
    p.add_argument("--no-baselines", action="store_true", help=f"skip the uniform-removal baseline ({baselines_note})")
    p.add_argument("--perplexity-windows", type=int, default=None,
                   help="256-token held-out windows for perplexity (default 8)")
    p.add_argument("--passkey-cases", type=int, default=None, help="passkey documents (default 4)")
    p.add_argument("--passkey-tokens", type=int, default=None, help="tokens per passkey document (default 1024)")
    p.add_argument("--prefill-tokens", type=int, default=None, help="tokens of the timed prefill document (default 2048)")
    p.add_argument("--repeats", type=int, default=1, help="timed prefills per model; the best counts (default 1)")
    p.add_argument("--output", default=None, help=f"save {what} to this folder (new or empty)")
    p.add_argument("--guard", type=float, default=None, metavar="RATIO",
                   help="also refuse to save a model whose held-out perplexity is more than RATIO times the dense "
                        "model's (1 or more, e.g. 2); the command then exits with code 1")
    p.add_argument("--keep-worse", action="store_true", help=keep_help)
    add_force_option(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def checked_common(args) -> None:
    """The shared options' checks, before any model loads."""
    from memstep.compress.guard import check_limit

    for name in ("perplexity_windows", "sentences", "calibration_tokens", "passkey_cases", "passkey_tokens",
                 "prefill_tokens", "repeats"):
        at_least("--" + name.replace("_", "-"), getattr(args, name))
    check_limit(args.guard)


def probe_from_args(args, tokenizer):
    """The full probe, or with --no-eval the check's (a few perplexity windows: never no check)."""
    from memstep.compress.quality import (PASSKEY_CASES, PASSKEY_TOKENS, PERPLEXITY_WINDOWS, PREFILL_TOKENS,
                                          make_check_probe, make_probe)

    return make_check_probe(tokenizer) if args.no_eval else make_probe(
        tokenizer, windows=args.perplexity_windows or PERPLEXITY_WINDOWS, passkey_cases=args.passkey_cases or PASSKEY_CASES,
        passkey_tokens=args.passkey_tokens or PASSKEY_TOKENS, prefill_tokens=args.prefill_tokens or PREFILL_TOKENS)


def calibration_from_args(args, count: int) -> list[str]:
    """The calibration sentences: the bundled text's, or the paragraphs of the user's file, read
    and checked (type, size, binary, empty, too short) before any model loads."""
    from memstep.compress.data import MIN_PARAGRAPH_CHARS, calibration_texts, read_calibration

    if not args.calibration:
        return calibration_texts(count)
    text = read_calibration(args.calibration)
    return calibration_texts(count, text, min_chars=MIN_PARAGRAPH_CHARS, name=Path(args.calibration).name)


def build_run(args, lm=None):
    """The CollapseRun the arguments describe (settings and calibration checked before any model loads)."""
    from memstep.compress.collapse_run import CollapseRun
    from memstep.compress.laco import CALIBRATION_SENTENCES, CALIBRATION_TOKENS, check_settings, settings_warnings
    from memstep.models import load_model

    checked_common(args)
    # the depth is known once the model is loaded (checked again then); check the rest now
    H = args.L + args.C if args.H is None else args.H
    check_settings(args.C, args.L, H, args.I, args.T, H)
    texts = calibration_from_args(args, args.sentences or CALIBRATION_SENTENCES)
    for warning in settings_warnings(args.C):
        print(f"memstep: warning: {warning}", file=sys.stderr)
    lm = lm or load_model(args.model, args.device, args.dtype)
    probe = probe_from_args(args, lm.tokenizer)
    return CollapseRun(lm, texts, variants=(args.variant,), probe=probe, baselines=not args.no_baselines,
                       output=args.output, repeats=args.repeats, guard=args.guard,
                       keep_worse=args.keep_worse, C=args.C, L=args.L, H=args.H, I=args.I, T=args.T,
                       reference=args.reference, merge=args.merge,
                       max_tokens=args.calibration_tokens or CALIBRATION_TOKENS)


def _mib(n) -> str:
    return f"{n / 2**20:,.1f} MiB"


def guard_lines(report: dict) -> list[str]:
    """The check's verdict and what it decided about the save, said before the table: one
    line each (a refusal or a kept worse model says the verdict itself)."""
    verdict = report.get("guard")
    lines = []
    if report.get("refused"):
        lines.append(report["refused"])
    elif report.get("kept_worse"):
        lines.append(report["kept_worse"])
    elif verdict and verdict["worse"]:
        lines.append(f"warning: {verdict['message']}")
    if verdict and not verdict["worse"]:
        lines.append(f"guard: {verdict['method']} is no worse than {verdict['baseline']} at {verdict['layers']} layers "
                     f"(perplexity {verdict['perplexity']:,.2f} against {verdict['baseline_perplexity']:,.2f})")
    if report.get("saved"):
        lines.append(f"saved to {report['saved']}")
    return lines


def format_report(report: dict) -> str:
    variant = report["variants"][0]
    search = report["searches"][variant]
    lines = [f"LaCo ({variant}) on {report['model']}: {search['layers_before']} -> {search['layers_after']} layers, "
             f"removed {search['removed'] or 'none'} ({search['pruning_ratio']:.1%})"]
    for base, merged in search["merges"].items():
        diff = search["chain_difference"].get(base, 0.0)
        chained = f" (chained merges: up to {diff:.3g} per weight from one RDSC over the group)" if diff > 1e-6 else ""
        lines.append(f"  layer {base} <- {', '.join(map(str, merged))}{chained}")
    for warning in search["warnings"]:
        lines.append(f"warning: {warning}")
    lines += guard_lines(report)
    models = report["models"]
    if not models:
        return "\n".join(lines)
    lines += models_table(report)
    if "uniform" not in models and search["removed"] and not report["probe"].get("check_only"):
        lines.append("uniform-removal baseline skipped (--no-baselines)")
    elif not search["removed"]:
        lines.append("no layer removed: lower T or C to collapse more, so there is nothing to compare against")
    return "\n".join(lines)


def models_table(report: dict) -> list[str]:
    """The measured models' table, their generation samples and what the probe held (a
    check's: perplexity and sizes only)."""
    models, probe = report["models"], report["probe"]
    if probe.get("check_only"):
        lines = [f"{'model':<28} {'layers':>6} {'params':>12} {'weights':>12} {'KV/token':>10} {'perplexity':>10}"]
        lines += [f"{row['label']:<28} {row['layers']:>6} {row['params']:>12,} {_mib(row['weight_bytes']):>12} "
                  f"{row['kv_bytes_per_token'] / 1024:>7.1f} KiB {row['perplexity']:>10.2f}" for row in models.values()]
        return lines + [f"check only (--no-eval): perplexity on {probe['perplexity_tokens']} held-out tokens (Pride "
                        "and Prejudice); no passkeys, prefill timing or generation samples"]
    lines = [f"{'model':<28} {'layers':>6} {'params':>12} {'weights':>12} {'KV/token':>10} {'perplexity':>10} "
             f"{'passkey':>8} {'prefill s':>9} {'CPU s':>7}"]
    for row in models.values():
        acc = "-" if row["passkey_accuracy"] is None else f"{row['passkey_accuracy']:.0%}"
        lines.append(f"{row['label']:<28} {row['layers']:>6} {row['params']:>12,} {_mib(row['weight_bytes']):>12} "
                     f"{row['kv_bytes_per_token'] / 1024:>7.1f} KiB {row['perplexity']:>10.2f} {acc:>8} "
                     f"{row['prefill_seconds']:>9.2f} {row['prefill_cpu_seconds']:>7.2f}")
    samples = [(row["label"], row["sample"]) for row in models.values() if row.get("sample") is not None]
    if samples:
        lines.append(f"generation sample (greedy, {probe.get('sample_prompt', 'prompt')!r}):")
        lines += [f"  {label}: {text!r}" for label, text in samples]
    lines.append(f"perplexity: {probe['perplexity_tokens']} held-out tokens (Pride and Prejudice); passkey: "
                 f"{len(probe['passkey_cases'])} cases at ~{probe['passkey_cases'][0]['tokens']} tokens; prefill: "
                 f"{probe['prefill_tokens']} tokens, full cache (wall and process CPU seconds on this machine)")
    return lines


def cmd_laco(args) -> int:
    output_folder(args)  # before any model loads
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    run = build_run(args)
    output_folder(args, run.lm.model)  # room on its disk for the model, now that it is loaded
    search = run.searches[args.variant]
    with tqdm(total=max(1, search.H - search.C - search.L + 1), desc="LaCo search", unit="candidate",
              file=sys.stderr, disable=args.quiet) as bar, saved_into(args):
        for event in run:
            kind = event["event"]
            if kind == "candidate":
                bar.update(1)
                decision = "merge" if event["accepted"] else "keep"
                bar.set_postfix(layers=event["layers_after"])
                bar.write(f"candidate {event['step']}: layers {event['layers']} similarity {event['similarity']:.4f} "
                          f"{'>' if event['accepted'] else '<='} T={event['threshold']:g}: {decision}", file=sys.stderr)
            elif kind == "result":
                bar.total = bar.n
                bar.refresh()
            elif kind == "model":
                bar.write(f"measured {event['label']}: perplexity {event['perplexity']:.2f}", file=sys.stderr)
            elif kind == "guard" and event["worse"] and not args.output:  # with --output the save's line says it
                bar.write(f"memstep: warning: {event['message']}", file=sys.stderr)
    return finish(args, run.report, format_report)


def finish(args, report: dict, formatter) -> int:
    """Print the report; a refused save also ends stderr with its line (after a JSON report
    too), and the command exits 1: nothing was saved."""
    print(json.dumps(report) if args.json else formatter(report))
    if report["refused"]:
        print(f"memstep: {report['refused']}", file=sys.stderr)
        return 1
    return 0
