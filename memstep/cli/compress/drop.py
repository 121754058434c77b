"""`memstep compress drop`: drop the layers with the lowest block influence (ShortGPT), step by
step, and measure the shallower model against the dense model and uniform removal.

Parsing imports no torch."""

from __future__ import annotations

import sys

from memstep.cli.common import output_folder, saved_into
from memstep.cli.compress.laco import (add_measure_options, calibration_from_args, checked_common, finish,
                                       guard_lines, models_table, probe_from_args)


def register(sub) -> None:
    p = sub.add_parser(
        "drop", help="drop the layers with the lowest block influence (ShortGPT), measured against uniform removal",
        description="Block influence (ShortGPT, Men et al. 2024): score each layer by 1 - the cosine similarity of "
                    "its input and output hidden states on the calibration sentences, drop the --remove layers with "
                    "the lowest score at once, then measure held-out perplexity, passkey accuracy, a generation "
                    "sample, sizes and prefill seconds of the dense model, the shallower model and uniform removal "
                    "of the same number of layers.")
    p.add_argument("--model", default=None, help="'embedded' (default), a hub id or a folder")
    p.add_argument("--remove", type=int, default=None,
                   help="layers to drop (default: a quarter of the layers, as ShortGPT removes about 25%%)")
    add_measure_options(p, "the shallower model", "the dense model is always measured", "the shallower model",
                        "save the shallower model even when its perplexity passes --guard; the report says so")
    p.set_defaults(func=cmd_drop)


def build_run(args, lm=None):
    """The DropRun the arguments describe (options and calibration checked before any model loads)."""
    from memstep.cli.common import at_least
    from memstep.compress.drop import DropRun
    from memstep.compress.laco import CALIBRATION_SENTENCES, CALIBRATION_TOKENS
    from memstep.models import load_model

    checked_common(args)
    at_least("--remove", args.remove)
    texts = calibration_from_args(args, args.sentences or CALIBRATION_SENTENCES)
    lm = lm or load_model(args.model, args.device, args.dtype)
    return DropRun(lm, texts, remove=args.remove, probe=probe_from_args(args, lm.tokenizer),
                   baselines=not args.no_baselines, output=args.output, repeats=args.repeats, guard=args.guard,
                   keep_worse=args.keep_worse, max_tokens=args.calibration_tokens or CALIBRATION_TOKENS)


def format_report(report: dict) -> str:
    search = report["search"]
    order = ", ".join(f"{layer} ({search['influence'][layer]:.4f})" for layer in search["order"])
    lines = [f"block influence on {report['model']}: {search['layers_before']} -> {search['layers_after']} layers, "
             f"removed {search['removed']} ({search['pruning_ratio']:.1%})",
             f"  lowest influence first: {order}"]
    lines += guard_lines(report)
    if report["models"]:
        lines += models_table(report)
    return "\n".join(lines)


def cmd_drop(args) -> int:
    output_folder(args)  # before any model loads
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    run = build_run(args)
    output_folder(args, run.lm.model)  # room on its disk for the model, now that it is loaded
    with tqdm(total=len(run.search.dense_layers), desc="block influence", unit="layer", file=sys.stderr,
              disable=args.quiet) as bar, saved_into(args):
        for event in run:
            kind = event["event"]
            if kind == "influence":
                bar.update(1)
                bar.write(f"layer {event['layer']}: block influence {event['influence']:.4f}", file=sys.stderr)
            elif kind == "drop":
                bar.write(f"drop {event['rank']}: layer {event['layer']} (influence {event['influence']:.4f}) -> "
                          f"{event['layers_after']} layers", file=sys.stderr)
            elif kind == "model":
                bar.write(f"measured {event['label']}: perplexity {event['perplexity']:.2f}", file=sys.stderr)
    return finish(args, run.report, format_report)
