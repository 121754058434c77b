"""The planner's report: summary rows of planned schedules (the app's table) and the text
form of a plan (``memstep plan``)."""

from __future__ import annotations

from memstep.memory import format_bytes
from memstep.planner.catalogue import GIB, GPU_PRESETS, MODEL_PRESETS, resolve_model
from memstep.planner.plans import Plan, ratios
from memstep.planner.search import Longest

SHOWN_STEPS = 12  # text output shows the first and last steps of longer schedules


def summary_rows(plans: dict[str, Plan], longest: dict[str, Longest] | None = None) -> list[dict]:
    """One row per schedule: peaks, totals, fit, and ratios against FM and full (when planned)."""
    vs_fm = ratios(plans, plans.get("fm"))
    vs_full = ratios(plans, plans.get("full"))
    rows = []
    for name, p in plans.items():
        row = {
            "schedule": name.upper() + (f" ({p.schedule.growth})" if p.schedule.growth else ""),
            "steps": p.schedule.steps,
            "peak_gib": p.peak_bytes / GIB,
            "kv_peak_gib": p.kv_peak_bytes / GIB,
            "seconds": p.seconds,
            "tflops": p.flops / 1e12,
            "fits": p.fits,
            "peak_vs_fm": vs_fm.get(name, {}).get("peak_bytes"),
            "seconds_vs_fm": vs_fm.get(name, {}).get("seconds"),
            "peak_vs_full": vs_full.get(name, {}).get("peak_bytes"),
            "seconds_vs_full": vs_full.get(name, {}).get("seconds"),
        }
        if longest is not None and name in longest:
            row["longest_context"] = longest[name].label()
        rows.append(row)
    return rows


def _step_row(step: dict) -> str:
    return (f"{step['step']:>5} {step['chunk_start']:>9} {step['chunk_size']:>6} {step['memory_before']:>7} "
            f"{step['memory_after']:>6} {format_bytes(step['kv_bytes']):>10} {format_bytes(step['peak_bytes']):>10} "
            f"{step['flops'] / 1e12:>8.2f} {step['seconds'] * 1e3:>9.2f}")


def format_report(report: dict, all_steps: bool = False) -> str:
    s, m, gpu = report["schedule"], report["model"], report["gpu"]
    growth = f" ({s['growth']} growth)" if s["growth"] else ""
    sizes = f", chunk {s['chunk']}, memory {s['memory']}" if "chunk" in s else ""
    weights = report.get("weights")
    quantized = f", {weights} weights (bytes only)" if weights and weights != "dtype" else ""
    lines = [f"{m['name']} ({report['dtype']}{quantized}) on {gpu['name']}: {s['name'].upper()}{growth}, "
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
    for key, config in MODEL_PRESETS.items():
        shape = resolve_model(key)
        lines.append(f"  {key:<14} {shape.params / 1e9:6.2f}B params, {shape.layers} layers, {shape.heads} heads "
                     f"({shape.kv_heads} KV), KV {shape.kv_bytes_per_token // 1024} KiB/token in bf16, "
                     f"{config['max_position_embeddings']:,} positions")
    lines.append("GPUs (dense tensor TFLOP/s, bandwidth, memory):")
    for key, gpu in GPU_PRESETS.items():
        bf16 = f"{gpu.bf16_tflops:g} bf16" if gpu.bf16_tflops else f"{gpu.fp16_tflops:g} fp16 (no bf16)"
        lines.append(f"  {key:<11} {bf16}, {gpu.fp32_tflops:g} fp32, {gpu.bandwidth_gbs:g} GB/s, "
                     f"{format_bytes(gpu.memory_bytes)}")
    return "\n".join(lines)
