"""The planner: peak memory and time of every step of a schedule, for real models and GPUs.

Pure arithmetic (no torch), so a 1M-token context plans in a fraction of a second. The
memory side is ``memstep.memory.step_bytes`` (the formula the engine reports per step and
whose KV parts equal the engine's real cache tensors); the planner adds FLOPs, bytes moved
and a roofline time per step, GPU and model presets, and the comparisons of schedules.

- ``catalogue``: GPU and model presets, config.json and custom GPUs;
- ``step_model``: FLOPs, bytes moved and roofline seconds of one step;
- ``plans``: a schedule planned step by step, and comparisons;
- ``search``: the longest context that fits;
- ``report``: summary rows and the text of a plan;
- ``needs``: what it takes (fewest GPUs, longest context on one), int8/int4 weights in bytes.
"""

from memstep.planner.catalogue import (DTYPES, GIB, GPU_ALIASES, GPU_PRESETS, MAX_GPU_FIGURE, MAX_MODEL_SIZE, MIB,
                                       MODEL_NAMES, MODEL_PRESETS, RESERVED_BYTES, Gpu, dtype_name, read_config,
                                       resolve_gpu, resolve_model)
from memstep.planner.needs import WEIGHT_FORMATS, WEIGHT_LABELS, Need, QuantizedShape, what_it_takes, with_weights
from memstep.planner.plans import PLAN_SCHEDULES, Plan, StepPlan, compare, plan, plan_schedule, ratios
from memstep.planner.report import format_presets, format_report, summary_rows
from memstep.planner.search import LONGEST_CAP_STEPS, LONGEST_CAP_TOKENS, Longest, longest_context
from memstep.planner.step_model import (DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_EFFICIENCY, EAGER_PASSES,
                                        LAYER_OVERHEAD_SECONDS, ONE_PASS_PASSES, PADDED_FLOAT32_BYTES,
                                        SCORER_OVERHEAD_SECONDS, TIME_LABELS, TIME_PARTS, attention_pairs,
                                        layer_linear_params, layer_step_work, retained_maps_bytes, step_seconds,
                                        step_work)

__all__ = [
    "DTYPES", "GIB", "GPU_ALIASES", "GPU_PRESETS", "MAX_GPU_FIGURE", "MAX_MODEL_SIZE", "MIB", "MODEL_NAMES",
    "MODEL_PRESETS", "RESERVED_BYTES", "Gpu", "dtype_name", "read_config", "resolve_gpu", "resolve_model",
    "WEIGHT_FORMATS", "WEIGHT_LABELS", "Need", "QuantizedShape", "what_it_takes", "with_weights",
    "PLAN_SCHEDULES", "Plan", "StepPlan", "compare", "plan", "plan_schedule", "ratios",
    "format_presets", "format_report", "summary_rows",
    "LONGEST_CAP_STEPS", "LONGEST_CAP_TOKENS", "Longest", "longest_context",
    "DEFAULT_BANDWIDTH_EFFICIENCY", "DEFAULT_EFFICIENCY", "EAGER_PASSES", "LAYER_OVERHEAD_SECONDS",
    "ONE_PASS_PASSES", "PADDED_FLOAT32_BYTES", "SCORER_OVERHEAD_SECONDS", "TIME_LABELS", "TIME_PARTS",
    "attention_pairs", "layer_linear_params", "layer_step_work", "retained_maps_bytes", "step_seconds",
    "step_work",
]
