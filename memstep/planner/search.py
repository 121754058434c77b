"""The planner's search: the longest context whose peak fits a GPU, by bisection."""

from __future__ import annotations

from dataclasses import dataclass

from memstep.errors import MemstepError
from memstep.memory import PLANNED_DEVICE, ModelShape, step_bytes
from memstep.planner.catalogue import Gpu, resolve_gpu, resolve_model
from memstep.planner.step_model import _lengths, _widest, retained_maps_bytes
from memstep.schedules import MAX_STEPS, largest_true, make_schedule

# Longest-context search: the peak of a compressed schedule stops growing once its steps
# reach their steady size, so fitting at this length means there is no limit.
LONGEST_CAP_TOKENS = 1 << 24
LONGEST_CAP_STEPS = MAX_STEPS  # the longest schedule anything may build


def _peak_at(shape: ModelShape, gpu: Gpu, schedule: str, tokens: int, settings: dict) -> int | None:
    """Peak bytes of a schedule at ``tokens`` (None when the schedule cannot be built there)."""
    try:
        growth = settings.get("growth", "linear") if schedule in ("im", "imdc") else "linear"
        built = make_schedule(schedule, tokens, settings.get("chunk"), settings.get("memory"), growth,
                              layers=shape.layers)
    except MemstepError:
        return None
    attention = settings.get("attention", "sdpa")
    evict = settings.get("evict_per_layer")
    evict = attention != "padded" if evict is None else evict
    scoring = schedule != "full"
    peak, seen = 0, set()
    extra = settings.get("question_tokens", 0) if scoring else 0
    for (before, after), read in zip(_lengths(built, settings.get("sinks", 4)), built.chunk_sizes):
        chunk = read + extra
        if (before, chunk, after) in seen:
            continue
        seen.add((before, chunk, after))
        parts = step_bytes(shape, before, chunk, after, attention=attention, evict_per_layer=evict, scoring=scoring,
                           device=settings.get("device", PLANNED_DEVICE))
        total = parts["total"]
        if settings.get("keep_maps") and attention == "padded":
            total += retained_maps_bytes(shape, _widest(before), chunk)
        peak = max(peak, total)
    return peak


@dataclass(frozen=True)
class Longest:
    """The longest context that fits: ``tokens`` (0: nothing fits), or no limit up to ``cap``."""

    tokens: int
    unlimited: bool
    cap: int

    def label(self) -> str:
        if self.unlimited:
            return f"no limit (fits {self.cap:,} tokens)"
        return f"{self.tokens:,} tokens" if self.tokens else "nothing fits"

    def to_dict(self) -> dict:
        return {"tokens": None if self.unlimited else self.tokens, "unlimited": self.unlimited, "cap": self.cap}


def longest_context(model, gpu, schedule: str = "imdc", **settings) -> Longest:
    """Largest document length whose peak fits the GPU, by bisection (the peak does not shrink
    as the document grows). Compressed schedules that fit at the cap have no limit."""
    dtype = settings.get("dtype", "bf16")
    shape = resolve_model(model, dtype)
    gpu = gpu if isinstance(gpu, Gpu) else resolve_gpu(gpu)
    usable = gpu.usable_bytes

    def fits(tokens: int) -> bool:
        peak = _peak_at(shape, gpu, schedule, tokens, settings)
        return peak is not None and peak <= usable

    cap = LONGEST_CAP_TOKENS
    if schedule != "full":
        cap = min(cap, max(1, settings.get("chunk") or 1) * LONGEST_CAP_STEPS)
        if fits(cap):
            return Longest(cap, True, cap)
    if not fits(1):
        return Longest(0, False, cap)
    return Longest(largest_true(fits, 1, cap), False, cap)

