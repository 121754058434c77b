"""`memstep plan`: predict the peak memory and time of a schedule for a model on a GPU.

No torch: it answers instantly. The text of a plan is memstep.planner.report's.
"""

from __future__ import annotations

import json
import sys

from memstep import planner
from memstep.errors import MemstepError
from memstep.cli.common import check_output_path, write_output
from memstep.memory import ATTENTIONS
from memstep.presets import ROPE_MODES
from memstep.schedules import GROWTHS, LAYERWISE

def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="predict peak memory and time of a schedule for a model and GPU (no model download)",
        description="Predict every step's memory (weights, KV of memory and chunk, attention and scorer "
                    "working set, activations), FLOPs and roofline seconds; the totals, whether it fits, "
                    "the longest context that fits, and ratios against FM and a full prefill.")
    p.add_argument("--model", default="llama-3.1-8b",
                   help=f"a preset ({', '.join(planner.MODEL_PRESETS)}) or the path of a config.json")
    p.add_argument("--gpu", default="h100-80gb", help=f"a preset ({', '.join(planner.GPU_PRESETS)}) or 'custom'")
    p.add_argument("--tokens", type=int, default=None, help="context length in tokens")
    p.add_argument("--schedule", default="imdc", choices=planner.PLAN_SCHEDULES)
    p.add_argument("--chunk", type=int, default=1024, help="chunk size in tokens (default 1024)")
    p.add_argument("--memory", type=int, default=1024, help="memory budget M in tokens (default 1024)")
    p.add_argument("--growth", default="linear", choices=GROWTHS, help="IM/IMDC growth curve")
    p.add_argument("--attention", default="sdpa", choices=ATTENTIONS,
                   help="sdpa (fused kernels), eager, or padded (the seed paper's reference code)")
    p.add_argument("--dtype", default="bf16", choices=planner.DTYPES)
    p.add_argument("--weights", default="dtype", choices=tuple(planner.WEIGHT_FORMATS),
                   help="weights stored as the dtype (default), int8 or int4: their bytes only (scales not counted; "
                        "KV cache, activations and time stay at the dtype)")
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--question-tokens", type=int, default=0,
                   help="question-aware compression: the question's tokens, read after every chunk (default 0)")
    p.add_argument("--rope", default="compact", choices=ROPE_MODES,
                   help="RoPE positions: compact (contiguous, at most sinks + M + c: the reference code's), "
                        "document (true positions) or shared (compact, one position per kept token across layers "
                        "and heads: at most layers x KV heads x M + c); decides the trained-positions notice")
    p.add_argument("--evict", default="auto", choices=("auto", "layer", "forward"),
                   help="evict after each layer (the engine) or after the whole forward (the reference code); "
                        "auto: forward for padded attention, layer otherwise")
    p.add_argument("--keep-maps", action="store_true",
                   help="padded only: also count every layer's attention maps, which the reference code "
                        "keeps until its forward returns")
    p.add_argument("--tflops", type=float, default=None, help="replace the GPU's dense 16-bit peak TFLOP/s")
    p.add_argument("--bandwidth", type=float, default=None, help="replace the GPU's bandwidth (GB/s)")
    p.add_argument("--gpu-memory", type=float, default=None, help="replace the GPU's memory (GiB)")
    p.add_argument("--efficiency", type=float, default=planner.DEFAULT_EFFICIENCY,
                   help=f"fraction of peak FLOP/s reached (default {planner.DEFAULT_EFFICIENCY})")
    p.add_argument("--bandwidth-efficiency", type=float, default=planner.DEFAULT_BANDWIDTH_EFFICIENCY,
                   help=f"fraction of bandwidth reached (default {planner.DEFAULT_BANDWIDTH_EFFICIENCY})")
    p.add_argument("--all-steps", action="store_true", help="print every step (text output)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--output", default=None, help="also write the JSON plan to this file (a new file)")
    p.add_argument("--force", action="store_true", help="replace an existing --output file")
    p.add_argument("--list", action="store_true", help="list the model and GPU presets and exit")
    p.set_defaults(func=cmd_plan)


def _settings(args) -> dict:
    evict = {"auto": None, "layer": True, "forward": False}[args.evict]
    return dict(tokens=args.tokens, chunk=args.chunk, memory=args.memory, growth=args.growth,
                attention=args.attention, dtype=args.dtype, sinks=args.sinks, evict_per_layer=evict,
                keep_maps=args.keep_maps, efficiency=args.efficiency, rope=args.rope,
                question_tokens=args.question_tokens,
                bandwidth_efficiency=args.bandwidth_efficiency)


def build_report(args) -> dict:
    """The plan of the chosen schedule with its FM/full comparison and longest context (JSON-able)."""
    if args.tokens is None:
        raise MemstepError("memstep plan: --tokens is required (the context length to plan)")
    if args.schedule == "fm" and args.growth in LAYERWISE:
        raise MemstepError(f"growth '{args.growth}' is layer-wise: it schedules IM and IMDC budgets; "
                           "FM keeps M in every layer (use --schedule im or imdc)")
    if args.keep_maps and args.attention != "padded":
        raise MemstepError("--keep-maps models the padded reference code: add --attention padded")
    gpu = planner.resolve_gpu(args.gpu, args.tflops, args.bandwidth, args.gpu_memory)
    settings = _settings(args)
    shape = planner.with_weights(planner.resolve_model(args.model, args.dtype), args.weights)
    chosen = planner.plan(shape, gpu, schedule=args.schedule, **settings)
    rest = {k: v for k, v in settings.items() if k != "tokens"}
    longest = planner.longest_context(shape, gpu, args.schedule, **rest)
    report = chosen.to_dict()
    for key, name in (("vs_fm", "fm"), ("vs_full", "full")):
        reference = _reference(shape, gpu, name, settings) if name != args.schedule else chosen
        report[key] = planner.ratios({args.schedule: chosen}, reference).get(args.schedule)
    report["longest_context"] = longest.to_dict()
    report["longest_context_label"] = longest.label()
    report["weights"] = args.weights
    return report


def _reference(shape, gpu, name: str, settings: dict):
    """The FM or full plan to compare with; None when it cannot be built at these settings
    (FM over more steps than the cap, say), so the chosen plan is still reported."""
    try:
        return planner.plan(shape, gpu, schedule=name, **settings)
    except MemstepError:
        return None


def cmd_plan(args) -> int:
    if args.list:
        print(planner.format_presets())
        return 0
    check_output_path(args.output, args.force)
    report = build_report(args)
    for notice in report["notices"]:
        print(f"memstep: warning: {notice}", file=sys.stderr)
    if args.output is not None:
        write_output(args.output, json.dumps(report), args.force)
    print(json.dumps(report) if args.json else planner.format_report(report, args.all_steps))
    return 0
