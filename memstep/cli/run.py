"""`memstep run`: prefill a document under a schedule, with a progress bar, a step table or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from memstep.cli.common import at_least, check_output_path, write_output
from memstep.cli.schedule import add_schedule_options, review_of
from memstep.errors import MemstepError
from memstep.models import WEIGHTS
from memstep.presets import ATTENTIONS, PRESETS, ROPE_CHOICES, SWITCHES, Fidelity, apply_preset
from memstep.question_pool import QUESTION_POOL, QUESTION_WEIGHT, TUNED, TUNED_POOL, TUNED_WEIGHT, parse_question_pool


def _checked(parse):
    """An argparse type that runs ``parse`` on the text (a readable refusal before the model loads)."""
    def check(text: str) -> str:
        try:
            parse(text)
        except MemstepError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text
    return check


def _span(text: str) -> str:
    from memstep.spans import parse_span  # imported only when --span is given

    return _checked(parse_span)(text)


_question_pool = _checked(parse_question_pool)


def register(sub) -> None:
    p = sub.add_parser("run", help="prefill a document under a schedule")
    p.add_argument("document", help=".txt, .md, .pdf or .html file, or - for stdin")
    p.add_argument("--model", default=None, help="'embedded' (default), 'gemma3-270m' (Gemma 3 270M, base model, "
                   "Gemma terms of use), a hub id, a folder or a .gguf file")
    add_schedule_options(p)
    # names spelled out so `memstep plan/schedule` start without importing torch (scorers.py)
    p.add_argument("--scorer", default=None,
                   help="chunk-attention (default), conv, snapkv, vatp, knorm, recency, random; as the reference "
                        "code's pruners: random-shared (one draw for every KV head), roco, chunk-prefix, "
                        "random-query")
    p.add_argument("--window", type=int, default=32, help="SnapKV observation window")
    p.add_argument("--kernel", type=int, default=5, help="conv scorer: keys pooled together (odd, default 5)")
    p.add_argument("--rope", default=None, choices=ROPE_CHOICES,
                   help="RoPE positions: auto (default: shared with --question-aware on a document within the "
                        "model's context, else compact), compact (contiguous, at most sinks + M + c, as the reference "
                        "code), document (true document positions) or shared (compact positions every layer "
                        "and head agree on: a kept token has one position in every head)")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="reference: the paper's reference code exactly (compact positions, conv scorer, 4 sinks, "
                        "padded attention, every switch below at the reference's value); options given "
                        "explicitly still win")
    p.add_argument("--sinks", type=int, default=None, help="always-kept first tokens (default 4)")
    p.add_argument("--attention", default=None, choices=ATTENTIONS,
                   help="sdpa (default: fused, or one pass that also yields the scores) or padded (the reference "
                        "code's queries padded to memory + chunk and (m + c)^2 maps)")
    for name, switch in SWITCHES.items():  # growth rounding comes with the schedule's options
        if name != "growth_rounding":
            p.add_argument("--" + name.replace("_", "-"), default=None, choices=switch.choices,
                           help=f"{switch.help} (default {switch.default}; --preset reference: {switch.reference})")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--question", default=None)
    p.add_argument("--question-aware", action="store_true",
                   help="score each step with the question's attention too (its tokens are read after every "
                        "chunk, then dropped): keeps what the question needs")
    p.add_argument("--question-weight", type=float, default=None,
                   help=f"question-aware: the question's share of the score, in (0, 1], the scorer's vote taking "
                        f"the rest (default {QUESTION_WEIGHT:g}: the question alone; {TUNED_WEIGHT:g} with "
                        f"--question-pool {TUNED})")
    p.add_argument("--question-pool", type=_question_pool, default=QUESTION_POOL,
                   help="question-aware: how a key takes its neighbours' question attention: max:N, mean:N "
                        "(N odd, centred), follow:N (the strongest of itself and the N - 1 keys before it: the "
                        "words after those the question looks at) or none (default "
                        f"{QUESTION_POOL}: a key takes the strongest question attention of itself and its 7 "
                        f"neighbours on each side); '{TUNED}': the recipe that was memstep's default until "
                        f"2026-12-07, {TUNED_POOL} at weight {TUNED_WEIGHT:g}, compact positions from 256 entries "
                        "per KV head; + '+carry' (follow:15+carry): a memory entry keeps the strongest "
                        "question share it has had since it was read, so long documents do not wear it away; "
                        "+ '+fade:F': +carry with "
                        "a held share worth F of itself one step on ('+fade:F/K': only the shares already carried through K "
                        "cuts); then '+heads': a key takes the strongest share any KV head of its layer gives its position "
                        "('+heads/W': the larger of its own and W times that); '@N' after +fade:F or +heads: the rule in "
                        "steps that keep N or more entries per head, its /K or /W form (or nothing) below; then "
                        "'+lend:C': where +heads does not share in full, a head whose top picks hold less than C times "
                        "what the layer's most focused head's hold takes the strongest share too; then '+spans:KxL': "
                        "in the prefill's last cut each layer's K spans of L positions ('+spans:Kxsentence': its K "
                        "sentences) with the most question share "
                        "summed over its heads stay in every head ('+spans:KxL<N': where that cut keeps fewer than N "
                        "entries per head); last, "
                        "'+last': the prefill's last cut ranks by the question's share alone ('+last:W': at weight W; "
                        "'+last<N': where that cut keeps fewer than N entries per head)")
    p.add_argument("--span", type=_span, default=None,
                   help="keep whole spans instead of single tokens: <bounds>[-max|-mean][-head|-layer|-any], "
                        "bounds fixedN (N-token pieces), sentence[N] or clause[N] (split past N tokens, default 48); "
                        "pooled by max (default) or mean; ranked per KV head (default), once per layer by the heads' "
                        "mean (layer) or by the head that wants it most (any); none = token top-k")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--continuation-tokens", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device-map", default=None, help="'auto' shards a large model across GPUs")
    p.add_argument("--load-weights", default="mapped", choices=WEIGHTS,
                   help="mapped (default): memory-mapped weights are read as first touched; "
                        "resident: every page read at load (the whole model in memory from the start)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--output", default=None, help="write the JSON result to this file (a new file)")
    p.add_argument("--force", action="store_true", help="replace an existing --output file")
    p.add_argument("--positions", action="store_true", help="include kept positions per layer/head in JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    check_output_path(args.output, args.force)  # before the run (and before torch loads), not after it
    from tqdm import tqdm

    from memstep.documents import ReadLimits, chars_for_tokens, tokenize_document
    from memstep.reading import read_document

    apply_preset(args)
    at_least("--max-tokens", args.max_tokens)
    # only the text --max-tokens can use is extracted (all of it without the option); before torch loads
    text = read_document(args.document, stdin=sys.stdin.buffer if args.document == "-" else None,
                         limits=ReadLimits(max_chars=chars_for_tokens(args.max_tokens)))
    from memstep.memory import format_bytes
    from memstep.models import load_model
    from memstep.runner import DocumentRun
    from memstep.scorers import SCORERS

    at_least("--chunk", args.chunk, unit=" token")
    if args.memory < args.sinks and args.schedule != "full":
        raise MemstepError(f"--memory {args.memory} is smaller than --sinks {args.sinks}")
    if args.scorer not in SCORERS:
        raise MemstepError(f"unknown scorer '{args.scorer}': choose one of {', '.join(SCORERS)}")
    if args.schedule != "full":
        from memstep.spans import check_span_budget, parse_span

        check_span_budget(parse_span(args.span), args.memory)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr carries memstep's own progress bar and errors only
    lm = load_model(args.model, args.device, args.dtype, args.device_map, weights=args.load_weights)
    ids, notice = tokenize_document(text, lm.tokenizer, args.max_tokens)
    notices = [notice] if notice else []
    for line in notices:
        print(line, file=sys.stderr)
    run = DocumentRun(lm, ids, schedule=args.schedule, chunk=args.chunk, memory=args.memory, growth=args.growth,
                      scorer=args.scorer, sinks=args.sinks, seed=args.seed, window=args.window,
                      question=args.question, max_new_tokens=args.max_new_tokens,
                      continuation_tokens=args.continuation_tokens, notices=notices, rope=args.rope,
                      kernel=args.kernel, attention=args.attention, question_aware=args.question_aware,
                      question_weight=args.question_weight, question_pool=args.question_pool, fidelity=Fidelity.from_settings(vars(args)),
                      review=review_of(args), span=args.span)
    for line in run.result.notices[len(notices):]:  # what the run adds (positions beyond training)
        print(line, file=sys.stderr)
    with tqdm(total=run.schedule.steps, desc=f"{args.schedule} prefill", unit="step", file=sys.stderr,
              disable=args.quiet) as bar:
        for record in run:
            bar.update(1)
            bar.set_postfix(memory=record.memory_after, chunk=record.chunk_size)
    result = run.result
    payload = result.to_dict(with_positions=args.positions)
    spans = run.span_report()
    if spans is not None:  # the setting always; which spans each layer and head holds whole with --positions
        payload["span"] = spans if args.positions else {"setting": spans["setting"]}
    if args.output is not None:
        write_output(args.output, json.dumps(payload), args.force)
    if args.json:
        print(json.dumps(payload))
        return 0
    print(f"{result.model}: {result.tokens} tokens, schedule {args.schedule}, scorer {args.scorer}, "
          f"{result.rope} RoPE positions, {result.device}/{result.dtype}")
    by_type = result.layers.get("layers_by_type", {})
    if result.layers.get("window"):
        print(f"layers: {by_type.get('global', 0)} global (the schedule's budget), {by_type.get('sliding', 0)} sliding "
              f"(their {result.layers['window']}-token window); prompt form {result.prompt_form}")
    changed = Fidelity.from_settings(result.fidelity).changed()
    if changed:
        print("as the reference code: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in changed.items()))
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
