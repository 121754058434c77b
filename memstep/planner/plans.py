"""Plans: every step of a schedule for a model on a GPU (memory from
``memstep.memory.step_bytes``, time from the step model), and comparisons of schedules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from memstep.errors import MemstepError
from memstep.memory import ATTENTIONS, PARTS, PLANNED_DEVICE, ModelShape, step_bytes
from memstep.planner.catalogue import GIB, Gpu, dtype_name, resolve_gpu, resolve_model
from memstep.planner.step_model import (DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_EFFICIENCY, layer_step_work,
                                        retained_maps_bytes, step_seconds, _lengths, _pairs, _widest)
from memstep.presets import ROPE_MODES
from memstep.schedules import GROWTHS, Schedule, check_bounds, check_steps, make_schedule

PLAN_SCHEDULES = ("fm", "im", "imdc", "full")


@dataclass
class StepPlan:
    """The prediction for one step."""

    step: int
    chunk_start: int
    chunk_size: int
    memory_before: int  # cache entries per layer before the step (sinks included)
    memory_after: int
    parts: dict[str, int]  # modeled peak bytes by component (memstep.memory.PARTS)
    peak_bytes: int
    flops: int
    seconds_parts: dict[str, float]
    layer_memory_after: list[int] | None = None  # layer-wise budgets or hybrid: each layer's entries after the step
    kv_bytes_by_type: dict[str, int] | None = None  # hybrid attention: KV bytes after the step by layer type

    @property
    def kv_bytes(self) -> int:
        """Largest size of the KV cache during the step (memory + chunk)."""
        return self.parts["kv_memory"] + self.parts["kv_chunk"]

    @property
    def seconds(self) -> float:
        return sum(self.seconds_parts.values())

    def to_dict(self) -> dict:
        return {
            "step": self.step, "chunk_start": self.chunk_start, "chunk_size": self.chunk_size,
            "memory_before": self.memory_before, "memory_after": self.memory_after,
            "kv_bytes": self.kv_bytes, "peak_bytes": self.peak_bytes, "parts": dict(self.parts),
            "flops": self.flops, "seconds": self.seconds,
            "seconds_parts": {k: v for k, v in self.seconds_parts.items()},
            **({"layer_memory_after": self.layer_memory_after} if self.layer_memory_after else {}),
            **({"kv_bytes_by_type": self.kv_bytes_by_type} if self.kv_bytes_by_type else {}),
        }


@dataclass
class Plan:
    """A schedule planned for a model on a GPU: every step, and the totals."""

    model: ModelShape
    gpu: Gpu
    dtype: str
    schedule: Schedule
    attention: str
    sinks: int
    evict_per_layer: bool
    keep_maps: bool
    efficiency: float
    bandwidth_efficiency: float
    steps: list[StepPlan]
    notices: list[str] = field(default_factory=list)
    rope: str = "compact"  # RoPE positions of the engine: compact (contiguous), document or shared
    question_tokens: int = 0  # question-aware: the question's tokens read with every step

    @property
    def largest_position(self) -> int:
        """How many RoPE positions the run uses (0..n-1): compact positions stop at the widest step;
        shared ones at most where every layer and KV head holds different tokens."""
        if self.rope != "document" and self.schedule.name != "full":
            window = self.model.kinds.memory_limit or 0  # a sliding layer's memory: its window's earlier tokens
            heads = 1 if self.rope == "compact" else self.model.layers * self.model.kv_heads
            return min(self.schedule.tokens, max(heads * max(s.memory_before, min(window, s.chunk_start))
                                                 + s.chunk_size for s in self.steps))
        return self.schedule.tokens

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_bytes for s in self.steps)

    @property
    def peak_step(self) -> int:
        return max(range(len(self.steps)), key=lambda i: self.steps[i].peak_bytes)

    @property
    def kv_peak_bytes(self) -> int:
        return max(s.kv_bytes for s in self.steps)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def flops(self) -> int:
        return sum(s.flops for s in self.steps)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.gpu.usable_bytes

    @property
    def gpus_needed(self) -> int:
        """GPUs of this kind whose usable memory together holds the peak (an ideal even split
        of weights and working set: a lower bound for sharding)."""
        return max(1, math.ceil(self.peak_bytes / self.gpu.usable_bytes))

    @property
    def weights_fit(self) -> bool:
        return self.steps[0].parts["weights"] <= self.gpu.usable_bytes

    def to_dict(self, with_steps: bool = True) -> dict:
        s = self.schedule
        out = {
            "model": {"name": self.model.name, "layers": self.model.layers, "hidden": self.model.hidden,
                      "heads": self.model.heads, "kv_heads": self.model.kv_heads,
                      "head_dim": self.model.head_dim, "intermediate": self.model.intermediate,
                      "vocab": self.model.vocab, "params": self.model.params,
                      "max_positions": self.model.max_positions,
                      "kv_bytes_per_token": self.model.kv_bytes_per_token,
                      **({"window": self.model.kinds.window,
                          "layers_by_type": self.model.kinds.to_dict()["layers_by_type"]}
                         if self.model.kinds.hybrid else {})},
            "dtype": self.dtype,
            "gpu": self.gpu.to_dict(),
            "schedule": {"name": s.name, "growth": s.growth, "tokens": s.tokens, "steps": s.steps,
                         **{k: v for k, v in s.settings.items() if k in ("chunk", "memory", "layers")}},
            "attention": self.attention, "sinks": self.sinks, "evict_per_layer": self.evict_per_layer,
            "rope": self.rope, "largest_position": self.largest_position, "question_tokens": self.question_tokens,
            "keep_maps": self.keep_maps, "efficiency": self.efficiency,
            "bandwidth_efficiency": self.bandwidth_efficiency,
            "peak_bytes": self.peak_bytes, "peak_step": self.peak_step, "kv_peak_bytes": self.kv_peak_bytes,
            "seconds": self.seconds, "flops": self.flops, "fits": self.fits, "gpus_needed": self.gpus_needed,
            "usable_bytes": self.gpu.usable_bytes, "notices": list(self.notices),
        }
        if with_steps:
            out["steps"] = [step.to_dict() for step in self.steps]
        return out


def _check_settings(tokens: int, chunk: int | None, memory: int | None, sinks: int, schedule: str,
                    attention: str, growth: str, efficiency: float, bandwidth_efficiency: float) -> None:
    if schedule not in PLAN_SCHEDULES:
        raise MemstepError(f"unknown schedule '{schedule}': choose one of {', '.join(PLAN_SCHEDULES)}")
    if attention not in ATTENTIONS:
        raise MemstepError(f"unknown attention '{attention}': choose one of {', '.join(ATTENTIONS)}")
    if growth not in GROWTHS:
        raise MemstepError(f"unknown growth '{growth}': choose one of {', '.join(GROWTHS)}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise MemstepError(f"tokens must be a whole number of at least 1 (got {tokens})")
    check_bounds(tokens=tokens, sinks=sinks, **({} if schedule == "full" else {"chunk": chunk, "memory": memory}))
    if schedule != "full":
        if chunk is None or chunk < 1:
            raise MemstepError(f"chunk must be at least 1 token (got {chunk})")
        if memory is None or memory < 1:
            raise MemstepError(f"memory must be at least 1 token (got {memory})")
        check_steps(tokens, chunk)
    if sinks < 0:
        raise MemstepError(f"sinks must be 0 or more (got {sinks})")
    for label, value in (("efficiency", efficiency), ("bandwidth efficiency", bandwidth_efficiency)):
        if not (0 < value <= 1):
            raise MemstepError(f"{label} must be in (0, 1] (got {value})")



def plan_schedule(shape: ModelShape, gpu: Gpu, schedule: Schedule, *, dtype: str = "bf16",
                  attention: str = "sdpa", sinks: int = 4, evict_per_layer: bool | None = None,
                  keep_maps: bool = False, efficiency: float = DEFAULT_EFFICIENCY,
                  bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY, rope: str = "compact",
                  question_tokens: int = 0, device: str = PLANNED_DEVICE) -> Plan:
    """Plan an already-built schedule. ``device``: the device type whose one-pass block
    the working set counts (a GPU's unless the engine's own run is modeled on CPU).
    ``question_tokens``: question-aware compression reads
    the question after every chunk of a compressed schedule (more rows, and their entries
    until the layer is cut). ``evict_per_layer`` defaults to the engine's per-layer
    eviction, except for the padded reference code, which evicts after the whole forward.
    ``rope`` only decides which positions the tokens get (for the trained-positions notice)."""
    dtype = dtype_name(dtype)
    if evict_per_layer is None:
        evict_per_layer = attention != "padded"
    scoring = schedule.name != "full"
    memo: dict[tuple, tuple] = {}  # FM repeats the same step thousands of times
    steps = []
    extra = question_tokens if scoring else 0
    for i, ((before, after), start, read) in enumerate(
            zip(_hybrid_lengths(shape, _lengths(schedule, sinks), schedule), schedule.chunk_starts,
                schedule.chunk_sizes)):
        chunk = read + extra  # the tokens the step runs: the chunk, and the question when question-aware
        key = (before, chunk, after)
        if key not in memo:
            parts = step_bytes(shape, before, chunk, after, attention=attention,
                               evict_per_layer=evict_per_layer, scoring=scoring, device=device)
            if keep_maps and attention == "padded":
                parts["attention"] += retained_maps_bytes(shape, _widest(before), chunk)
            total = sum(parts[p] for p in PARTS)
            work = layer_step_work(shape, before, chunk, after, attention, scoring)
            evicts = scoring and any(b + chunk > a for b, a in _pairs(before, after))
            seconds = step_seconds(work, gpu, dtype, shape.layers, evicts, efficiency, bandwidth_efficiency)
            memo[key] = ({p: parts[p] for p in PARTS}, total, sum(f for f, _ in work.values()), seconds)
        parts, total, flops, seconds = memo[key]
        steps.append(StepPlan(i, start, read, shape.kinds.widest_global(before), shape.kinds.widest_global(after),
                              dict(parts), total, flops,
                              dict(seconds), list(after) if isinstance(after, tuple) else None,
                              shape.kv_bytes_by_type(after) if shape.kinds.hybrid else None))
    plan = Plan(shape, gpu, dtype, schedule, attention, sinks, evict_per_layer, keep_maps, efficiency,
                bandwidth_efficiency, steps, rope=rope, question_tokens=extra)
    plan.notices.extend(_notices(plan))
    return plan


def _hybrid_lengths(shape: ModelShape, lengths: list, schedule: Schedule) -> list:
    """Each layer's entries per step under hybrid attention: the schedule's for the global
    layers, the window's for the sliding ones (memstep.layers.LayerKinds.apply, as the engine)."""
    if not shape.kinds.hybrid:
        return lengths
    per_layer = [([b] * shape.layers, [a] * shape.layers) if isinstance(b, int) else (list(b), list(a))
                 for b, a in lengths]
    return [(tuple(b), tuple(a)) for b, a in shape.kinds.apply(per_layer, schedule.chunk_sizes)]


def _notices(plan: Plan) -> list[str]:
    out = []
    limit = plan.model.max_positions
    if limit and plan.largest_position > limit:
        what = (f"{plan.schedule.tokens} tokens" if plan.largest_position == plan.schedule.tokens
                else f"the widest step ({plan.largest_position} entries)")
        if plan.rope == "shared":  # a bound: the heads and layers usually keep many of the same tokens
            what = f"up to {plan.largest_position} positions (every layer and KV head keeping different tokens)"
        verb = "may go" if plan.rope == "shared" else "go"
        out.append(f"{plan.rope} positions: {what} {verb} beyond {plan.model.name}'s {limit} trained positions "
                   "(RoPE scaling needed); the plan still counts them.")
    elif limit and plan.schedule.tokens > limit:
        out.append(f"{plan.schedule.tokens} tokens are more than {plan.model.name}'s {limit} trained positions, "
                   f"but with {plan.rope} RoPE positions no step uses more than {plan.largest_position} positions.")
    if plan.dtype == "bf16" and plan.gpu.bf16_tflops is None:
        out.append(f"{plan.gpu.name} has no bf16 tensor cores: bf16 runs at FP32 speed; plan with fp16 instead.")
    if not plan.weights_fit:
        out.append(f"{plan.schedule.name.upper()} does not fit: the weights alone "
                   f"({plan.steps[0].parts['weights'] / GIB:.1f} GiB) exceed the {plan.gpu.usable_bytes / GIB:.1f} GiB "
                   f"usable on one {plan.gpu.name}; it needs at least {plan.gpus_needed} of them (weights and "
                   "working set split evenly).")
    elif not plan.fits:
        out.append(f"{plan.schedule.name.upper()} does not fit: peak {plan.peak_bytes / GIB:.1f} GiB > "
                   f"{plan.gpu.usable_bytes / GIB:.1f} GiB usable on {plan.gpu.name}; it needs at least "
                   f"{plan.gpus_needed} of them.")
    return out


def plan(model="llama-3.1-8b", gpu="h100-80gb", *, schedule: str = "imdc", tokens: int = 32768,
         chunk: int | None = 1024, memory: int | None = 1024, growth: str = "linear", attention: str = "sdpa",
         dtype: str = "bf16", sinks: int = 4, evict_per_layer: bool | None = None, keep_maps: bool = False,
         efficiency: float = DEFAULT_EFFICIENCY,
         bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY, rope: str = "compact",
         question_tokens: int = 0, device: str = PLANNED_DEVICE) -> Plan:
    """Plan one schedule; ``model`` and ``gpu`` take anything resolve_model/resolve_gpu take."""
    schedule = str(schedule).lower()
    _check_settings(tokens, chunk, memory, sinks, schedule, attention, growth, efficiency, bandwidth_efficiency)
    shape = resolve_model(model, dtype)
    gpu = gpu if isinstance(gpu, Gpu) else resolve_gpu(gpu)
    if rope not in ROPE_MODES:
        raise MemstepError(f"unknown RoPE position mode '{rope}': choose {', '.join(ROPE_MODES)}")
    if not isinstance(question_tokens, int) or question_tokens < 0:
        raise MemstepError(f"question tokens must be a whole number, 0 or more (got {question_tokens})")
    # FM and full have no growth curve: planned beside IM/IMDC, they ignore the growth
    built = make_schedule(schedule, tokens, chunk, memory, growth if schedule in ("im", "imdc") else "linear",
                          layers=shape.layers)
    return plan_schedule(shape, gpu, built, dtype=dtype, attention=attention, sinks=sinks,
                         evict_per_layer=evict_per_layer, keep_maps=keep_maps, efficiency=efficiency,
                         bandwidth_efficiency=bandwidth_efficiency, rope=rope, question_tokens=question_tokens,
                         device=device)


def compare(model="llama-3.1-8b", gpu="h100-80gb", schedules=("fm", "imdc", "full"), **settings) -> dict[str, Plan]:
    """Plan several schedules with the same settings (model and GPU resolved once)."""
    if not schedules:
        raise MemstepError("choose at least one schedule to plan")
    dtype = settings.get("dtype", "bf16")
    shape = resolve_model(model, dtype)
    gpu = gpu if isinstance(gpu, Gpu) else resolve_gpu(gpu)
    return {name: plan(shape, gpu, schedule=name, **settings) for name in dict.fromkeys(schedules)}


def ratios(plans: dict[str, Plan], reference: Plan | None) -> dict[str, dict[str, float]]:
    """Peak bytes and seconds of each plan divided by the reference plan's (FM or full)."""
    if reference is None:
        return {}
    return {name: {"peak_bytes": p.peak_bytes / reference.peak_bytes, "seconds": p.seconds / reference.seconds}
            for name, p in plans.items()}
