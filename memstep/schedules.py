"""Memory schedules: how big each chunk is and how much memory is kept after each step.

Pure integer math, no torch, so the UI can preview a schedule instantly and the planner
can reason about 1M-token contexts.

The formulas follow the reference code of "Memorize Step by Step" (EMNLP 2024), rounding
included (``rounding="multiply-first"`` is memstep's former order, kept as a switch). With L
tokens, chunk size c and memory M there are n = ceil(L / c) steps:

- ``fm``   (fixed memory): chunks of c (the last takes the remainder), budget M after every step.
- ``im``   (incremental memory): chunks of c, the budget grows to M along a growth curve
  (step i = 0..n-1; the last step always ends at M):
    linear           m_i = a * (i + 1)                          with a = floor(M / n)
    square           m_i = int(i^2 * ((M - a) / (n - 1)^2) + a)      (the division first, in floats)
    sqrt             m_i = int(i^0.5 * ((M - a) / (n - 1)^0.5) + a)
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
- ``fim`` (fixed-incremental memory, the reference's "Incremental_Chunk_Streaming_Fixed_History"):
  chunks of c; the memory kept from earlier steps is never scored again, and each step adds
  its chunk's best s_i entries, s_i = M // n (+1 for the first M % n steps): m_i = s_0 + .. + s_i.
- ``local`` (the reference's ``local_window``): chunks of c, nothing kept after a step (budget
  0): each chunk attends to itself (and the sinks, if any are kept: the reference keeps none).
- ``full``: one pass over the whole document, nothing evicted.

A review (the reference's ReviewScheduler, ``review=(scheduler, times, length)``) re-feeds a
chunk: the chunk k = ceil(M / c) is read again ``times`` times among the ``length`` chunks
from k on, at positions set by ``scheduler`` (uniform, exp, early, late); budgets follow the
step index (steps from n - 1 on keep M), as in the reference.
- ``custom``: explicit chunk sizes and budgets.

Budgets count tokens besides the always-kept sink tokens: after step i each layer's cache
holds min(m_i + sinks, entries before the step + c_i) entries (the tokens seen, unless an
earlier step evicted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from memstep.errors import MemstepError

SCHEDULES = ("full", "fm", "im", "imdc", "fim", "local", "custom")
REVIEWS = ("uniform", "exp", "early", "late")  # where a review re-feeds its chunk (the reference's schedulers)
ROUNDINGS = ("divide-first", "multiply-first")
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
    # a review only: each step's first token (a re-fed chunk starts where it started before)
    starts: tuple[int, ...] | None = None

    @property
    def steps(self) -> int:
        return len(self.chunk_sizes)

    @property
    def tokens(self) -> int:
        """The document's tokens (a review reads some of them twice)."""
        if self.starts is not None:
            return max(s + c for s, c in zip(self.starts, self.chunk_sizes))
        return sum(self.chunk_sizes)

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        if self.starts is not None:
            return self.starts
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
        if self.layer_memory_sizes is None:  # one budget for every layer: one list entry stands for all
            return [([before], [after]) for before, after in self.cache_lengths(sinks)]
        layers = len(self.layer_memory_sizes[0])
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
        if self.layer_memory_sizes is not None:
            return [(max(before), max(after)) for before, after in self.layer_cache_lengths(sinks)]
        # one budget for every layer: plain ints (the planner's longest-context search calls this
        # on 16k-step schedules); a cache holds at most what it had plus the chunk
        out, before = [], 0
        for budget, chunk in zip(self.memory_sizes, self.chunk_sizes):
            after = min(budget + sinks, before + chunk)
            out.append((before, after))
            before = after
        return out

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


def growth_budget(M: int, n: int, i: int, growth: str = "linear", rounding: str = "divide-first") -> int:
    """The IM budget after step i of n, growing to M (one curve; steps from n - 1 on keep M)."""
    if i >= n - 1:
        return M  # every curve ends at the full budget
    a = M // n
    # float expressions in the reference code's order (the division first), truncated with int() as it does
    if growth == "linear":
        return a * (i + 1)
    if growth == "square":
        return int(i ** 2 * ((M - a) / (n - 1) ** 2) + a) if rounding == "divide-first" \
            else int(i ** 2 * (M - a) / (n - 1) ** 2 + a)
    if growth == "sqrt":
        return int(i ** 0.5 * ((M - a) / (n - 1) ** 0.5) + a) if rounding == "divide-first" \
            else int(math.sqrt(i) * (M - a) / math.sqrt(n - 1) + a)
    if growth == "inverse-convex":
        return int(M / (n - i))
    if growth == "inverse-concave":
        return int(M + a - M / (i + 1))
    raise MemstepError(f"unknown growth '{growth}': choose one of {', '.join(CURVES)}")


def growth_budgets(memory: int, steps: int, growth: str = "linear", rounding: str = "divide-first") -> list[int]:
    """The IM budget after each of ``steps`` steps, growing to ``memory`` (one curve)."""
    if growth not in CURVES:
        raise MemstepError(f"unknown growth '{growth}': choose one of {', '.join(CURVES)}")
    if rounding not in ROUNDINGS:
        raise MemstepError(f"unknown growth rounding '{rounding}': choose one of {', '.join(ROUNDINGS)}")
    return [growth_budget(memory, steps, i, growth, rounding) for i in range(steps)]


def layer_growth_budgets(memory: int, steps: int, growth: str, layers: int,
                         rounding: str = "divide-first") -> list[list[int]]:
    """Per step, the budget of every layer: a plain curve gives every layer the same budget;
    a layer-wise growth gives the lower half (l < layers // 2) its first curve, the rest its second."""
    if growth not in LAYERWISE:
        return [[m] * layers for m in growth_budgets(memory, steps, growth, rounding)]
    lower, upper = (growth_budgets(memory, steps, curve, rounding) for curve in LAYERWISE[growth])
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


def _budgets(memory: int, steps: int, growth: str, layers: int,
             rounding: str = "divide-first") -> tuple[list[int], list[list[int]] | None]:
    """The budgets IMDC's chunks follow (the layer average under a layer-wise growth) and,
    for a layer-wise growth, every layer's budgets."""
    if growth in LAYERWISE:
        per_layer = layer_growth_budgets(memory, steps, growth, layers, rounding)
        return _average_budgets(per_layer), per_layer
    return growth_budgets(memory, steps, growth, rounding), None


def fixed_incremental_budgets(memory: int, steps: int) -> list[int]:
    """FIM: each step adds its share of M (M // n, one more for the first M % n steps)."""
    base, extra = divmod(memory, steps)
    out, total = [], 0
    for i in range(steps):
        total += base + (1 if i < extra else 0)
        out.append(total)
    return out


def review_positions(scheduler: str, window: int, times: int) -> list[int]:
    """Where, among ``window`` chunks, a review inserts its re-fed chunk (the reference's
    ReviewScheduler positions, relative to the window)."""
    if scheduler == "uniform":
        return [int(window / times * (i + 1)) - 1 for i in range(times)]
    if scheduler == "exp":
        if times < 2 or window < 2:
            raise MemstepError("an exp review needs at least 2 review times over at least 2 chunks "
                               "(the reference divides by times - 1)")
        base = (window - 1) ** (1 / (times - 1))
        return sorted(set([int(round(base ** i)) for i in range(times - 1)] + [window - 1]))
    if scheduler == "early":
        return [0] * times
    if scheduler == "late":
        return [window] * times
    raise MemstepError(f"unknown review '{scheduler}': choose one of {', '.join(REVIEWS)}")


def reviewed_steps(steps: int, memory: int, chunk: int, review: tuple[str, int, int]) -> list[int]:
    """The original step each step of a reviewed schedule reads: chunk k = ceil(M / c) is read
    again ``times`` times among the ``length`` chunks from k on."""
    scheduler, times, length = review
    if not 1 <= times <= MAX_STEPS or not 1 <= length <= MAX_STEPS:
        raise MemstepError(f"a review needs from 1 to {MAX_STEPS:,} review times and a window of as many chunks "
                           f"(got times {times}, length {length})")
    order = list(range(steps))
    k = math.ceil(memory / chunk)
    window = order[k:k + length]
    if not window:
        raise MemstepError(f"the review re-feeds chunk {k} (ceil(M / c)), but the schedule has {steps} chunks: "
                           "use a longer document, a smaller memory or a smaller chunk")
    augmented = list(window)
    for position in sorted(review_positions(scheduler, len(window), times), reverse=True):
        augmented.insert(min(position, len(augmented)), window[0])
    return order[:k] + augmented + order[k + length:]


def _review(schedule: Schedule, review: tuple[str, int, int], budget_at) -> Schedule:
    """``schedule`` with its review: chunk order from ``reviewed_steps``, budgets by step index."""
    settings = schedule.settings
    order = reviewed_steps(schedule.steps, settings["memory"], settings["chunk"], review)
    if len(order) > MAX_STEPS:
        raise MemstepError(f"the review makes {len(order):,} steps, over the limit of {MAX_STEPS:,}")
    starts = tuple(schedule.chunk_starts[i] for i in order)
    chunks = tuple(schedule.chunk_sizes[i] for i in order)
    per_layer = [budget_at(i) for i in range(len(order))]
    budgets = tuple(_average_budgets(per_layer)) if schedule.layerwise else tuple(b[0] for b in per_layer)
    return Schedule(schedule.name, chunks, budgets, schedule.growth,
                    {**settings, "review": {"scheduler": review[0], "times": review[1], "length": review[2]}},
                    tuple(map(tuple, per_layer)) if schedule.layerwise else None, starts)


def _imdc_max_memory(tokens: int, chunk: int, growth: str, memory: int, layers: int = 1,
                     rounding: str = "divide-first") -> int | None:
    """Largest memory <= ``memory`` whose IMDC schedule has no empty chunk (None if none).
    Binary search on the (nearly monotone) failure boundary, then checked downwards."""
    n = math.ceil(tokens / chunk)

    def ok(m: int) -> bool:
        return _first_empty_chunk(_imdc_chunks(tokens, _budgets(m, n, growth, layers, rounding)[0])) is None

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
    rounding: str = "divide-first",
    review: tuple[str, int, int] | None = None,
) -> Schedule:
    """Build a schedule by name; raises MemstepError with a fix for bad settings. A layer-wise
    growth (square-sqrt, double-inverse) needs the model's number of ``layers``. ``rounding``:
    the growth curves' order of operations (see the module's docstring); ``review``: (scheduler,
    times, length) to re-feed a chunk (FM, IM, IMDC)."""
    schedule = _make_schedule(name, tokens, chunk, memory, growth, chunk_sizes, memory_sizes, layers, rounding)
    if not review or review[1] == 0:
        return schedule
    if schedule.name not in ("fm", "im", "imdc"):
        raise MemstepError(f"a review re-feeds a chunk of an FM, IM or IMDC schedule, not of '{schedule.name}'")
    n = math.ceil(tokens / chunk)
    if schedule.name == "fm":
        return _review(schedule, review, lambda i: [memory])
    if growth in LAYERWISE:
        lower, upper = LAYERWISE[growth]
        half = layers // 2
        return _review(schedule, review, lambda i: [growth_budget(memory, n, i, lower, rounding)] * half
                       + [growth_budget(memory, n, i, upper, rounding)] * (layers - half))
    return _review(schedule, review, lambda i: [growth_budget(memory, n, i, growth, rounding)])


def _make_schedule(name, tokens, chunk, memory, growth, chunk_sizes, memory_sizes, layers, rounding) -> Schedule:
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
    if rounding not in ROUNDINGS:
        raise MemstepError(f"unknown growth rounding '{rounding}': choose one of {', '.join(ROUNDINGS)}")
    settings = {"chunk": chunk, "memory": memory}
    if rounding != "divide-first":
        settings["rounding"] = rounding
    n = math.ceil(tokens / chunk)
    if name in ("fim", "local"):
        budgets = fixed_incremental_budgets(memory, n) if name == "fim" else [0] * n
        return Schedule(name, tuple(_fixed_chunks(tokens, chunk)), tuple(budgets), None, settings)
    if growth in LAYERWISE:
        if name == "fm":
            raise MemstepError(f"growth '{growth}' is layer-wise: it schedules IM and IMDC budgets; "
                               "FM keeps M in every layer (use schedule im or imdc, or growth linear)")
        if not isinstance(layers, int) or layers < 1:
            raise MemstepError(f"growth '{growth}' is layer-wise: it needs the model's number of layers")
        settings["layers"] = layers
    if name == "fm":
        return Schedule("fm", tuple(_fixed_chunks(tokens, chunk)), (memory,) * n, None, settings)

    budgets, per_layer = _budgets(memory, n, growth, layers or 1, rounding)
    per_layer = tuple(map(tuple, per_layer)) if per_layer else None
    if name == "im":
        return Schedule("im", tuple(_fixed_chunks(tokens, chunk)), tuple(budgets), growth, settings, per_layer)

    chunks = _imdc_chunks(tokens, budgets)
    bad = _first_empty_chunk(chunks)
    if bad is not None:
        best = _imdc_max_memory(tokens, chunk, growth, memory, layers or 1, rounding)
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
