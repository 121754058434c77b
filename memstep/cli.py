"""`memstep ...`: schedule previews, document runs (and, added by their modules, plan/eval).

Every error a user can cause ends the process with exit code 2 and one readable line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memstep.errors import MemstepError
from memstep.presets import PRESETS, ROPE_MODES, apply_preset
from memstep.schedules import GROWTHS, SCHEDULES, check_run_settings, format_table, make_schedule


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2
        raise MemstepError(f"{self.prog}: {message}")


def _add_schedule_options(p, default_schedule="imdc"):
    p.add_argument("--schedule", default=default_schedule, choices=[s for s in SCHEDULES if s != "custom"])
    p.add_argument("--chunk", type=int, default=512, help="chunk size in tokens (default 512)")
    p.add_argument("--memory", type=int, default=512, help="memory budget M in tokens (default 512)")
    p.add_argument("--growth", default="linear", choices=GROWTHS,
                   help="IM/IMDC growth curve; square-sqrt and double-inverse are layer-wise (the lower half "
                        "of the layers follows the first curve, the upper half the second)")


def cmd_schedule(args) -> int:
    check_run_settings(args.schedule, args.tokens, args.chunk, args.memory, args.sinks)  # the app's rule too
    schedule = make_schedule(args.schedule, args.tokens, args.chunk, args.memory, args.growth, layers=args.layers)
    if args.json:
        print(json.dumps(schedule.to_dict()))
    else:
        print(format_table(schedule, args.sinks))
    return 0


def cmd_run(args) -> int:
    from tqdm import tqdm

    from memstep.documents import read_document, tokenize_document
    from memstep.memory import format_bytes
    from memstep.models import load_model
    from memstep.runner import DocumentRun
    from memstep.scorers import SCORERS

    check_output_path(args.output)  # before the run, not after it
    apply_preset(args)
    text = read_document(args.document, stdin=sys.stdin.buffer if args.document == "-" else None)
    if args.max_tokens is not None and args.max_tokens < 1:
        raise MemstepError(f"--max-tokens must be at least 1 (got {args.max_tokens})")
    if args.chunk < 1:
        raise MemstepError(f"--chunk must be at least 1 token (got {args.chunk})")
    if args.memory < args.sinks and args.schedule != "full":
        raise MemstepError(f"--memory {args.memory} is smaller than --sinks {args.sinks}")
    if args.scorer not in SCORERS:
        raise MemstepError(f"unknown scorer '{args.scorer}': choose one of {', '.join(SCORERS)}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr carries memstep's own progress bar and errors only
    lm = load_model(args.model, args.device, args.dtype, args.device_map)
    ids, notice = tokenize_document(text, lm.tokenizer, args.max_tokens)
    notices = [notice] if notice else []
    for line in notices:
        print(line, file=sys.stderr)
    run = DocumentRun(lm, ids, schedule=args.schedule, chunk=args.chunk, memory=args.memory, growth=args.growth,
                      scorer=args.scorer, sinks=args.sinks, seed=args.seed, window=args.window,
                      question=args.question, max_new_tokens=args.max_new_tokens,
                      continuation_tokens=args.continuation_tokens, notices=notices, rope=args.rope,
                      kernel=args.kernel, attention=args.attention, question_aware=args.question_aware,
                      question_weight=args.question_weight)
    for line in run.result.notices[len(notices):]:  # what the run adds (positions beyond training)
        print(line, file=sys.stderr)
    with tqdm(total=run.schedule.steps, desc=f"{args.schedule} prefill", unit="step", file=sys.stderr,
              disable=args.quiet) as bar:
        for record in run:
            bar.update(1)
            bar.set_postfix(memory=record.memory_after, chunk=record.chunk_size)
    result = run.result
    payload = result.to_dict(with_positions=args.positions)
    if args.output:
        write_output(args.output, json.dumps(payload))
    if args.json:
        print(json.dumps(payload))
        return 0
    print(f"{result.model}: {result.tokens} tokens, schedule {args.schedule}, scorer {args.scorer}, "
          f"{args.rope} RoPE positions, {result.device}/{result.dtype}")
    print(f"{'step':>4} {'start':>6} {'chunk':>6} {'before':>6} {'budget':>6} {'after':>6} "
          f"{'seconds':>8} {'modeled':>10} {'measured':>10}")
    for s in result.steps:
        print(f"{s.step:>4} {s.chunk_start:>6} {s.chunk_size:>6} {s.memory_before:>6} {s.memory_budget:>6} "
              f"{s.memory_after:>6} {s.seconds:>8.3f} {format_bytes(s.bytes_modeled):>10} "
              f"{format_bytes(s.bytes_measured):>10}")
    print(f"total {result.seconds:.2f} s, peak modeled {format_bytes(result.peak_bytes_modeled)}, "
          f"peak measured {format_bytes(result.peak_bytes_measured)}"
          + ("" if result.peak_bytes_measured is not None else " (no device counter on CPU)"))
    if result.continuation_nll is not None:
        print(f"continuation NLL ({result.continuation_tokens} tokens): {result.continuation_nll:.4f}")
    if result.answer is not None:
        print(f"Q: {result.question}\nA: {result.answer}")
    return 0


def check_output_path(output: str | None) -> None:
    """An --output file must go into an existing folder: checked before any work."""
    if output is None:
        return
    folder = Path(output).expanduser().parent
    if not folder.is_dir():
        raise MemstepError(f"--output {output}: the folder {folder} does not exist; create it first")
    if Path(output).is_dir():
        raise MemstepError(f"--output {output} is a folder: give a file name")


def write_output(output: str, text: str) -> None:
    try:
        Path(output).expanduser().write_text(text)
    except OSError as err:
        raise MemstepError(f"cannot write {output}: {err.strerror}") from err


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="memstep", description="Chunked long-context prefill under a memory budget.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("schedule", help="print a schedule's chunk and memory sizes (no model)")
    p.add_argument("--tokens", type=int, required=True)
    _add_schedule_options(p)
    p.add_argument("--layers", type=int, default=None,
                   help="the model's layers, for a layer-wise growth (30 for the embedded model)")
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("run", help="prefill a document under a schedule")
    p.add_argument("document", help=".txt, .md, .pdf or .html file, or - for stdin")
    p.add_argument("--model", default=None, help="'embedded' (default), a hub id, a folder or a .gguf file")
    _add_schedule_options(p)
    # names spelled out so `memstep plan/schedule` start without importing torch (scorers.py)
    p.add_argument("--scorer", default=None,
                   help="chunk-attention (default), conv, snapkv, vatp, knorm, recency or random")
    p.add_argument("--window", type=int, default=32, help="SnapKV observation window")
    p.add_argument("--kernel", type=int, default=5, help="conv scorer: keys pooled together (odd, default 5)")
    p.add_argument("--rope", default=None, choices=ROPE_MODES,
                   help="RoPE positions: compact (default; contiguous, at most sinks + M + c, as the reference "
                        "code) or document (true document positions)")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="reference: the paper's reference code (compact positions, conv scorer, 4 sinks); "
                        "options given explicitly still win")
    p.add_argument("--sinks", type=int, default=None, help="always-kept first tokens (default 4)")
    p.add_argument("--attention", default="sdpa", choices=("sdpa", "padded"),
                   help="sdpa (default: fused, or one pass that also yields the scores) or padded (the reference "
                        "code's queries padded to memory + chunk and (m + c)^2 maps, for measurement)")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--question", default=None)
    p.add_argument("--question-aware", action="store_true",
                   help="score each step with the question's attention too (its tokens are read after every "
                        "chunk, then dropped): keeps what the question needs")
    p.add_argument("--question-weight", type=float, default=0.75,
                   help="question-aware: the question's share of the score, in (0, 1] (default 0.75)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--continuation-tokens", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device-map", default=None, help="'auto' shards a large model across GPUs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--output", default=None, help="write the JSON result to this file")
    p.add_argument("--positions", action="store_true", help="include kept positions per layer/head in JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    for register in _extensions():
        register(sub)
    return parser


def _extensions():
    """Subcommands that live in their own modules (planner, evaluation, compression)."""
    import importlib

    out = []
    for module in ("memstep.plan_cli", "memstep.eval_cli", "memstep.compress_cli"):
        try:
            out.append(importlib.import_module(module).register)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except MemstepError as err:
        print(f"memstep: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memstep: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early: no traceback
        _silence_stdout()
        print("memstep: error: the output was closed early (broken pipe)", file=sys.stderr)
        return 2
    except (MemoryError, OverflowError, RecursionError) as err:  # a safety net: inputs are bounded first
        print(f"memstep: error: the request is too large for this machine ({type(err).__name__}): "
              "use smaller sizes", file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's exit-time flush does not raise again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
