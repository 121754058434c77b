"""`memstep plan`: predict the peak memory and time of a schedule for a model on a GPU.

Registered into `memstep` by memstep.cli._extensions. No torch: it answers instantly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memstep import planner
from memstep.errors import MemstepError
from memstep.memory import ATTENTIONS, format_bytes
from memstep.schedules import GROWTHS, LAYERWISE

SHOWN_STEPS = 12  # text output shows the first and last steps of longer schedules


def register(subparsers) -> None:
    p = subparsers.add_parser(
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
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--question-tokens", type=int, default=0,
                   help="question-aware compression: the question's tokens, read after every chunk (default 0)")
    p.add_argument("--rope", default="compact", choices=("compact", "document"),
                   help="RoPE positions: compact (contiguous, at most sinks + M + c: the reference code's) "
                        "or document (true positions); decides the trained-positions notice")
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
    p.add_argument("--output", default=None, help="also write the JSON plan to this file")
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
    shape = planner.resolve_model(args.model, args.dtype)
    chosen = planner.plan(shape, gpu, schedule=args.schedule, **settings)
    rest = {k: v for k, v in settings.items() if k != "tokens"}
    longest = planner.longest_context(shape, gpu, args.schedule, **rest)
    report = chosen.to_dict()
    for key, name in (("vs_fm", "fm"), ("vs_full", "full")):
        reference = _reference(shape, gpu, name, settings) if name != args.schedule else chosen
        report[key] = planner.ratios({args.schedule: chosen}, reference).get(args.schedule)
    report["longest_context"] = longest.to_dict()
    report["longest_context_label"] = longest.label()
    return report


def _reference(shape, gpu, name: str, settings: dict):
    """The FM or full plan to compare with; None when it cannot be built at these settings
    (FM over more steps than the cap, say), so the chosen plan is still reported."""
    try:
        return planner.plan(shape, gpu, schedule=name, **settings)
    except MemstepError:
        return None


def _step_row(step: dict) -> str:
    return (f"{step['step']:>5} {step['chunk_start']:>9} {step['chunk_size']:>6} {step['memory_before']:>7} "
            f"{step['memory_after']:>6} {format_bytes(step['kv_bytes']):>10} {format_bytes(step['peak_bytes']):>10} "
            f"{step['flops'] / 1e12:>8.2f} {step['seconds'] * 1e3:>9.2f}")


def format_report(report: dict, all_steps: bool = False) -> str:
    s, m, gpu = report["schedule"], report["model"], report["gpu"]
    growth = f" ({s['growth']} growth)" if s["growth"] else ""
    sizes = f", chunk {s['chunk']}, memory {s['memory']}" if "chunk" in s else ""
    lines = [f"{m['name']} ({report['dtype']}) on {gpu['name']}: {s['name'].upper()}{growth}, "
             f"{s['tokens']:,} tokens in {s['steps']:,} steps{sizes}, {report['attention']} attention, "
             f"{report['sinks']} sinks, {report['rope']} RoPE positions"
             + (f", question-aware ({report['question_tokens']} question tokens read per step)"
                if report.get("question_tokens") else ""),
             f"{'step':>5} {'start':>9} {'chunk':>6} {'before':>7} {'after':>6} {'KV':>10} {'peak':>10} "
             f"{'TFLOP':>8} {'ms':>9}"]
    steps = report["steps"]
    if all_steps or len(steps) <= SHOWN_STEPS:
        lines += [_step_row(step) for step in steps]
    else:
        half = SHOWN_STEPS // 2
        lines += [_step_row(step) for step in steps[:half]]
        lines.append(f"{'...':>5} ({len(steps) - 2 * half:,} more steps; --all-steps prints them)")
        lines += [_step_row(step) for step in steps[-half:]]
    verdict = "fits" if report["fits"] else "DOES NOT FIT"
    lines.append(f"peak {format_bytes(report['peak_bytes'])} at step {report['peak_step']} "
                 f"(KV {format_bytes(report['kv_peak_bytes'])}): {verdict} in {format_bytes(report['usable_bytes'])} "
                 f"usable on {gpu['name']}")
    lines.append(f"time {report['seconds']:.3f} s, {report['flops'] / 1e12:,.1f} TFLOP (roofline at "
                 f"{report['efficiency']:g} of peak FLOP/s and {report['bandwidth_efficiency']:g} of bandwidth)")
    for label, key in (("FM", "vs_fm"), ("full prefill", "vs_full")):
        r = report[key]
        if r is None:
            lines.append(f"vs {label}: not planned ({label} cannot be built at these settings)")
            continue
        lines.append(f"vs {label}: {r['peak_bytes']:.3f}x peak memory, {r['seconds']:.3f}x time "
                     f"({1 / r['seconds']:.2f}x speed)")
    lines.append(f"longest context that fits: {report['longest_context_label']}")
    return "\n".join(lines)


def format_presets() -> str:
    lines = ["models:"]
    for key, config in planner.MODEL_PRESETS.items():
        shape = planner.resolve_model(key)
        lines.append(f"  {key:<14} {shape.params / 1e9:6.2f}B params, {shape.layers} layers, {shape.heads} heads "
                     f"({shape.kv_heads} KV), KV {shape.kv_bytes_per_token // 1024} KiB/token in bf16, "
                     f"{config['max_position_embeddings']:,} positions")
    lines.append("GPUs (dense tensor TFLOP/s, bandwidth, memory):")
    for key, gpu in planner.GPU_PRESETS.items():
        bf16 = f"{gpu.bf16_tflops:g} bf16" if gpu.bf16_tflops else f"{gpu.fp16_tflops:g} fp16 (no bf16)"
        lines.append(f"  {key:<11} {bf16}, {gpu.fp32_tflops:g} fp32, {gpu.bandwidth_gbs:g} GB/s, "
                     f"{format_bytes(gpu.memory_bytes)}")
    return "\n".join(lines)


def cmd_plan(args) -> int:
    if args.list:
        print(format_presets())
        return 0
    report = build_report(args)
    for notice in report["notices"]:
        print(f"memstep: warning: {notice}", file=sys.stderr)
    if args.output:
        try:
            Path(args.output).write_text(json.dumps(report))
        except OSError as err:
            raise MemstepError(f"cannot write {args.output}: {err.strerror}") from err
    print(json.dumps(report) if args.json else format_report(report, args.all_steps))
    return 0
