"""Memory schedules: how big each chunk is and how much memory is kept after each step.

Pure integer math, no torch, so the UI can preview a schedule instantly and the planner
can reason about 1M-token contexts.

The formulas follow the reference code of "Memorize Step by Step" (EMNLP 2024), rounding
included. With L tokens, chunk size c and memory M there are n = ceil(L / c) steps:

- ``fm``   (fixed memory): chunks of c (the last takes the remainder), budget M after every step.
- ``im``   (incremental memory): chunks of c, the budget grows to M along a growth curve
  (step i = 0..n-1; the last step always ends at M):
    linear           m_i = a * (i + 1)                          with a = floor(M / n)
    square           m_i = int(i^2 * (M - a) / (n - 1)^2 + a)
    sqrt             m_i = int(sqrt(i) * (M - a) / sqrt(n - 1) + a)
    inverse-convex   m_i = int(M / (n - i))
    inverse-concave  m_i = int(M + a - M / (i + 1))
  and two layer-wise curves, where the budget depends on the layer too (the lower half of
  the layers, l < layers // 2, follows the first curve, the upper half the second):
    square-sqrt      square below, sqrt above
    double-inverse   inverse-convex below, inverse-concave above
- ``imdc`` (incremental memory, decremental chunk): budgets as ``im``; chunks
    c_0 = floor(L / n),  c_i = floor(L / n) + floor(mean(m_0 .. m_{n-2})) - m_{i-1},
  the last chunk takes the remainder, so m_{i-1} + c_i stays constant. Under a layer-wise
  curve m_i is the layer average floor(mean over layers of m_{i,l}): every layer reads the
  same chunk, so the chunk can only follow one budget, and the average keeps the widest
  step (the layer with the most memory + the chunk) as flat as one number can.
- ``full``: one pass over the whole document, nothing evicted.
- ``custom``: explicit chunk sizes and budgets.

Budgets count tokens besides the always-kept sink tokens: after step i each layer's cache
holds min(m_i + sinks, entries before the step + c_i) entries (the tokens seen, unless an
earlier step evicted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from memstep.errors import MemstepError

SCHEDULES = ("full", "fm", "im", "imdc", "custom")
CURVES = ("linear", "sqrt", "square", "inverse-convex", "inverse-concave")
# layer-wise growths of the reference code: (lower half of the layers, upper half)
LAYERWISE = {"square-sqrt": ("square", "sqrt"), "double-inverse": ("inverse-convex", "inverse-concave")}
GROWTHS = CURVES + tuple(LAYERWISE)

# The most steps any schedule may have (CLI, API, app and planner alike). 16,384 steps build
# in milliseconds and plan in well under a second, and still cover a 1M-token context at
# chunk 64 or 16M tokens at chunk 1024 (the planner's longest-context search goes that far).
# Without a cap one request (10^7 tokens at chunk 1) costs ~26 s of CPU and ~3 GB of memory.
MAX_STEPS = 1 << 14
# The largest token count any size may take (tokens, chunk, memory, sinks): ~10^9, far
# beyond any model's context, small enough that every formula stays exact in floats.
MAX_SIZE_TOKENS = 1 << 30


@dataclass(frozen=True)
class Schedule:
    """Chunk sizes and the memory budget after each step (both in tokens)."""

    name: str
    chunk_sizes: tuple[int, ...]
    memory_sizes: tuple[int, ...]
    growth: str | None = None
    settings: dict = field(default_factory=dict, compare=False)
    # layer-wise growths only: the budget of every layer after each step (steps x layers)
    layer_memory_sizes: tuple[tuple[int, ...], ...] | None = None

    @property
    def steps(self) -> int:
        return len(self.chunk_sizes)

    @property
    def tokens(self) -> int:
        return sum(self.chunk_sizes)

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        starts, pos = [], 0
        for c in self.chunk_sizes:
            starts.append(pos)
            pos += c
        return tuple(starts)

    @property
    def layerwise(self) -> bool:
        return self.layer_memory_sizes is not None

    def layer_budgets(self, step: int, layers: int) -> list[int]:
        """The budget of each of ``layers`` layers after ``step``."""
        if self.layer_memory_sizes is None:
            return [self.memory_sizes[step]] * layers
        budgets = list(self.layer_memory_sizes[step])
        if len(budgets) != layers:
            raise MemstepError(f"this layer-wise schedule was made for {len(budgets)} layers, "
                               f"the model has {layers}")
        return budgets

    def layer_cache_lengths(self, sinks: int) -> list[tuple[list[int], list[int]]]:
        """Per step, each layer's cache entries before and after the step (sinks included)."""
        layers = len(self.layer_memory_sizes[0]) if self.layer_memory_sizes else 1
        out, before = [], [0] * layers
        for step, chunk in enumerate(self.chunk_sizes):
            # a layer holds at most what it had plus the chunk (a budget may grow faster than that)
            after = [min(budget + sinks, b + chunk) for budget, b in zip(self.layer_budgets(step, layers), before)]
            out.append((before, after))
            before = after
        return out

    def cache_lengths(self, sinks: int) -> list[tuple[int, int]]:
        """(memory before, memory after) of each step in cache entries, sinks included; under a
        layer-wise growth, of the layer that holds the most."""
        return [(max(before), max(after)) for before, after in self.layer_cache_lengths(sinks)]

    def to_dict(self) -> dict:
        return {
            "schedule": self.name,
            "growth": self.growth,
            "tokens": self.tokens,
            "steps": self.steps,
            "chunk_sizes": list(self.chunk_sizes),
            "memory_sizes": list(self.memory_sizes),
            **({"layer_memory_sizes": [list(m) for m in self.layer_memory_sizes]} if self.layerwise else {}),
            **{k: v for k, v in self.settings.items() if k not in ("tokens",)},
        }


def growth_budgets(memory: int, steps: int, growth: str = "linear") -> list[int]:
    """The IM budget after each of ``steps`` steps, growing to ``memory`` (one curve)."""
    M, n = memory, steps
    a = M // n
    # float expressions in the reference code's order, truncated with int() as it does
    curves = {
        "linear": lambda i: a * (i + 1),
        "square": lambda i: int(i ** 2 * (M - a) / (n - 1) ** 2 + a),
        "sqrt": lambda i: int(math.sqrt(i) * (M - a) / math.sqrt(n - 1) + a),
        "inverse-convex": lambda i: int(M / (n - i)),
        "inverse-concave": lambda i: int(M + a - M / (i + 1)),
    }
    if growth not in curves:
        raise MemstepError(f"unknown growth '{growth}': choose one of {', '.join(CURVES)}")
    return [curves[growth](i) for i in range(n - 1)] + [M]  # every curve ends at the full budget


def layer_growth_budgets(memory: int, steps: int, growth: str, layers: int) -> list[list[int]]:
    """Per step, the budget of every layer: a plain curve gives every layer the same budget;
    a layer-wise growth gives the lower half (l < layers // 2) its first curve, the rest its second."""
    if growth not in LAYERWISE:
        return [[m] * layers for m in growth_budgets(memory, steps, growth)]
    lower, upper = (growth_budgets(memory, steps, curve) for curve in LAYERWISE[growth])
    half = layers // 2
    return [[lower[i]] * half + [upper[i]] * (layers - half) for i in range(steps)]


def _average_budgets(per_layer: list[list[int]]) -> list[int]:
    return [sum(step) // len(step) for step in per_layer]


def check_bounds(**sizes) -> None:
    """Every size a whole number in [0, MAX_SIZE_TOKENS] (bools and floats are refused)."""
    for name, value in sizes.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise MemstepError(f"{name} must be a whole number of tokens (got {str(value)[:40]!r})")
        if value > MAX_SIZE_TOKENS:
            raise MemstepError(f"{name} {value:.3g} is too large: at most {MAX_SIZE_TOKENS:,} tokens")


def check_steps(tokens: int, chunk: int, cap: int = MAX_STEPS) -> None:
    """Refuse a schedule of more than ``cap`` steps before building it (see MAX_STEPS)."""
    steps = -(-tokens // chunk)  # ceil without floats: exact for any size
    if steps > cap:
        least = -(-tokens // cap)
        raise MemstepError(f"{tokens:,} tokens at chunk {chunk:,} would take {steps:,} steps, over the limit of "
                           f"{cap:,}: use a chunk of at least {least:,} tokens")


def _check_sizes(tokens: int, chunk: int, memory: int) -> None:
    check_bounds(tokens=tokens, chunk=chunk, memory=memory)
    if tokens < 1:
        raise MemstepError(f"the document has {tokens} tokens: it needs at least 1")
    if chunk < 1:
        raise MemstepError(f"chunk size must be at least 1 token (got {chunk})")
    if memory < 0:
        raise MemstepError(f"memory size must be 0 or more tokens (got {memory})")
    check_steps(tokens, chunk)


def _fixed_chunks(tokens: int, chunk: int) -> list[int]:
    n = math.ceil(tokens / chunk)
    return [chunk] * (n - 1) + [tokens - chunk * (n - 1)]


def _imdc_chunks(tokens: int, budgets: list[int]) -> list[int]:
    n = len(budgets)
    if n == 1:
        return [tokens]
    base = tokens // n
    mean_memory = math.floor(sum(budgets[:-1]) / (n - 1))
    chunks = [base] + [base + mean_memory - budgets[i - 1] for i in range(1, n - 1)]
    chunks.append(tokens - sum(chunks))
    return chunks


def _first_empty_chunk(chunks: list[int]) -> int | None:
    return next((i for i, c in enumerate(chunks) if c < 1), None)


def largest_true(predicate, lo: int, hi: int) -> int:
    """Bisection: the largest n in [lo, hi] with predicate(n), given predicate(lo) holds and
    the predicate turns false at most once as n grows."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predicate(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _budgets(memory: int, steps: int, growth: str, layers: int) -> tuple[list[int], list[list[int]] | None]:
    """The budgets IMDC's chunks follow (the layer average under a layer-wise growth) and,
    for a layer-wise growth, every layer's budgets."""
    if growth in LAYERWISE:
        per_layer = layer_growth_budgets(memory, steps, growth, layers)
        return _average_budgets(per_layer), per_layer
    return growth_budgets(memory, steps, growth), None


def _imdc_max_memory(tokens: int, chunk: int, growth: str, memory: int, layers: int = 1) -> int | None:
    """Largest memory <= ``memory`` whose IMDC schedule has no empty chunk (None if none).
    Binary search on the (nearly monotone) failure boundary, then checked downwards."""
    n = math.ceil(tokens / chunk)

    def ok(m: int) -> bool:
        return _first_empty_chunk(_imdc_chunks(tokens, _budgets(m, n, growth, layers)[0])) is None

    if not ok(0):
        return None
    lo = largest_true(ok, 0, memory)
    while lo > 0 and not ok(lo):
        lo -= 1
    return lo


def check_run_settings(name: str, tokens: int, chunk: int, memory: int, sinks: int) -> None:
    """Checks a run makes before any model work (shared by the CLI/runner and the app's
    preview): ``tokens`` counts everything prefilled, the prompt head included."""
    check_bounds(tokens=tokens, chunk=chunk, memory=memory, sinks=sinks)
    if tokens < 1:
        raise MemstepError(f"the document has {tokens} tokens: it needs at least 1")
    if sinks < 0:
        raise MemstepError(f"sinks must be 0 or more (got {sinks})")
    if name == "full":
        return
    if chunk < 1:
        raise MemstepError(f"chunk size must be at least 1 token (got {chunk})")
    check_steps(tokens, chunk)
    if chunk > tokens:
        raise MemstepError(f"chunk size {chunk} is larger than the document ({tokens} tokens to prefill, "
                           f"prompt head included): use a chunk of at most {tokens}, or schedule 'full'")
    if memory < sinks:
        raise MemstepError(f"memory size {memory} is smaller than the {sinks} sink tokens: "
                           f"use a memory of at least {sinks}")


def make_schedule(
    name: str,
    tokens: int,
    chunk: int | None = None,
    memory: int | None = None,
    growth: str = "linear",
    chunk_sizes: list[int] | None = None,
    memory_sizes: list[int] | None = None,
    layers: int | None = None,
) -> Schedule:
    """Build a schedule by name; raises MemstepError with a fix for bad settings. A layer-wise
    growth (square-sqrt, double-inverse) needs the model's number of ``layers``."""
    name = name.lower()
    if name not in SCHEDULES:
        raise MemstepError(f"unknown schedule '{name}': choose one of {', '.join(SCHEDULES)}")
    if name == "full":
        _check_sizes(tokens, tokens, 0)  # one step, whatever the length
        return Schedule("full", (tokens,), (tokens,), settings={"tokens": tokens})
    if name == "custom":
        return custom_schedule(tokens, chunk_sizes or [], memory_sizes or [])

    if chunk is None or memory is None:
        raise MemstepError(f"schedule '{name}' needs a chunk size and a memory size")
    _check_sizes(tokens, chunk, memory)
    if growth not in GROWTHS:
        raise MemstepError(f"unknown growth '{growth}': choose one of {', '.join(GROWTHS)}")
    settings = {"chunk": chunk, "memory": memory}
    n = math.ceil(tokens / chunk)
    if growth in LAYERWISE:
        if name == "fm":
            raise MemstepError(f"growth '{growth}' is layer-wise: it schedules IM and IMDC budgets; "
                               "FM keeps M in every layer (use schedule im or imdc, or growth linear)")
        if not isinstance(layers, int) or layers < 1:
            raise MemstepError(f"growth '{growth}' is layer-wise: it needs the model's number of layers")
        settings["layers"] = layers
    if name == "fm":
        return Schedule("fm", tuple(_fixed_chunks(tokens, chunk)), (memory,) * n, None, settings)

    budgets, per_layer = _budgets(memory, n, growth, layers or 1)
    per_layer = tuple(map(tuple, per_layer)) if per_layer else None
    if name == "im":
        return Schedule("im", tuple(_fixed_chunks(tokens, chunk)), tuple(budgets), growth, settings, per_layer)

    chunks = _imdc_chunks(tokens, budgets)
    bad = _first_empty_chunk(chunks)
    if bad is not None:
        best = _imdc_max_memory(tokens, chunk, growth, memory, layers or 1)
        fix = (
            f"use a memory of at most {best} tokens at chunk {chunk}, a larger chunk, "
            f"or schedule 'im'" if best is not None else "use a larger chunk or schedule 'im'"
        )
        raise MemstepError(
            f"IMDC with {tokens} tokens, chunk {chunk}, memory {memory}, {growth} growth would give "
            f"step {bad} a chunk of {chunks[bad]} tokens: {fix}"
        )
    return Schedule("imdc", tuple(chunks), tuple(budgets), growth, settings, per_layer)


def custom_schedule(tokens: int, chunk_sizes: list[int], memory_sizes: list[int]) -> Schedule:
    """Explicit chunk sizes and budgets; the chunks must cover the document exactly."""
    if not chunk_sizes or len(chunk_sizes) != len(memory_sizes):
        raise MemstepError(
            "a custom schedule needs as many memory sizes as chunk sizes "
            f"(got {len(chunk_sizes)} chunks and {len(memory_sizes)} memory sizes)"
        )
    if len(chunk_sizes) > MAX_STEPS:
        raise MemstepError(f"a custom schedule may have at most {MAX_STEPS:,} steps (got {len(chunk_sizes):,})")
    check_bounds(tokens=tokens, chunk=max(chunk_sizes), memory=max(memory_sizes))
    if any(c < 1 for c in chunk_sizes):
        raise MemstepError("every chunk of a custom schedule must hold at least 1 token")
    if any(m < 0 for m in memory_sizes):
        raise MemstepError("memory sizes of a custom schedule must be 0 or more")
    if sum(chunk_sizes) != tokens:
        raise MemstepError(
            f"custom chunk sizes add up to {sum(chunk_sizes)} tokens but the document has {tokens}"
        )
    return Schedule("custom", tuple(chunk_sizes), tuple(memory_sizes), settings={"tokens": tokens})


def format_table(schedule: Schedule, sinks: int = 4) -> str:
    """A readable per-step table of a schedule (used by `memstep schedule`)."""
    rows = [f"{'step':>4}  {'start':>7}  {'chunk':>6}  {'budget':>6}  {'cache+chunk':>11}"]
    for i, ((before, _), start, c, m) in enumerate(
        zip(schedule.cache_lengths(sinks), schedule.chunk_starts, schedule.chunk_sizes, schedule.memory_sizes)
    ):
        rows.append(f"{i:>4}  {start:>7}  {c:>6}  {m:>6}  {before + c:>11}")
    peak = max(b + c for (b, _), c in zip(schedule.cache_lengths(sinks), schedule.chunk_sizes))
    growth = f" ({schedule.growth} growth)" if schedule.growth else ""
    rows.append(
        f"{schedule.name}{growth}: {schedule.tokens} tokens in {schedule.steps} steps, "
        f"peak memory + chunk {peak} tokens (with {sinks} sinks)"
    )
    return "\n".join(rows)
