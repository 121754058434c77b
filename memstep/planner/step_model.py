"""The planner's step model: FLOPs, bytes moved and roofline seconds of one prefill step.

Time of one step: each component (projections + MLP, attention, scorer + eviction) takes
max(FLOPs / (peak FLOP/s x efficiency), bytes moved / (bandwidth x bandwidth efficiency));
the step is their sum. Components are timed separately because they sit on different sides
of the roofline: projections are compute-bound at useful chunk sizes, while eager attention
streams its score matrices through memory. Kernel launches (a fixed cost per layer) only add
time when they take longer than the GPU work they launch, as for small models.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from memstep.errors import MemstepError
from memstep.memory import ATTENTIONS, SCORE_BYTES, ModelShape
from memstep.planner.catalogue import Gpu
from memstep.schedules import Schedule

TIME_PARTS = ("linear", "attention", "scorer", "overhead")
TIME_LABELS = {
    "linear": "projections + MLP",
    "attention": "attention",
    "scorer": "scorer + eviction",
    "overhead": "kernel launches (beyond GPU work)",
}

# Fractions of the datasheet peaks that real kernels reach. bf16 GEMMs of prefill-sized
# matrices run at 55-75% of peak on Ampere/Hopper; streaming kernels reach ~80% of the
# memory bandwidth. One factor each, stated here and in every plan's JSON.
DEFAULT_EFFICIENCY = 0.6
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
# Eager PyTorch launches ~20 kernels per decoder layer (norms, projections, RoPE, attention,
# MLP, residuals) at ~5 us each; the scorer's hook adds as many again when a step evicts.
LAYER_OVERHEAD_SECONDS = 100e-6
SCORER_OVERHEAD_SECONDS = 100e-6
# Bytes moved per score element by the reference code's eager path over its padded
# (memory + chunk)^2 maps, with s the model's dtype bytes: QK^T writes s; adding the float32
# causal mask reads s and writes 4 (type promotion to float32); adding the float32 padding
# mask reads 4, writes 4; softmax reads 4, writes 4; casting back reads 4, writes s; the
# value product reads s. Total 4 s + 24.
PADDED_FLOAT32_BYTES = 24
# Eager attention: fp32 scores written, read and written by softmax, read by the value product.
EAGER_PASSES = 4
# memstep's one-pass attention when a layer is cut: float32 logits written, masked in place
# (read + write), softmax (read + write), read by the value product and by the column sums.
ONE_PASS_PASSES = 7


def layer_linear_params(shape: ModelShape) -> int:
    """Weights of one decoder layer's projections and MLP (what every token multiplies)."""
    q_out = shape.heads * shape.head_dim
    kv_out = shape.kv_heads * shape.head_dim
    return shape.hidden * (2 * q_out + 2 * kv_out) + 3 * shape.hidden * shape.intermediate


def attention_pairs(before: int, chunk: int, attention: str) -> int:
    """Query-key pairs one head computes. memstep's attention never computes the hidden half
    of the chunk's causal square: its CPU path splits the step into the memory part and the
    causal square, CUDA's kernels take the lower-right causal bias, and the one pass stops
    each block of rows at its last visible key (which counts block / 2 more pairs per row:
    ignored). Eager runs the whole chunk x keys rectangle under an explicit mask; the padded
    reference code squares memory + chunk."""
    keys = before + chunk
    if attention == "padded":
        return keys * keys
    if attention == "sdpa":
        return chunk * before + chunk * (chunk + 1) // 2
    return chunk * keys


def _activation_elements(shape: ModelShape) -> int:
    """Activation elements one token reads and writes in one layer: two RMSNorms, q/k/v in
    and out, o_proj in and out, two residual adds, gate/up in and out, SiLU x up, down."""
    q_out = shape.heads * shape.head_dim
    kv_out = shape.kv_heads * shape.head_dim
    return 15 * shape.hidden + 2 * q_out + 2 * kv_out + 6 * shape.intermediate


def step_work(shape: ModelShape, before: int, chunk: int, after: int, attention: str = "sdpa",
              scoring: bool = True) -> dict[str, tuple[int, int]]:
    """(FLOPs, bytes moved) of one step by time component, summed over layers."""
    if attention not in ATTENTIONS:
        raise MemstepError(f"unknown attention '{attention}': choose one of {', '.join(ATTENTIONS)}")
    item, layers, heads, dim = shape.dtype_bytes, shape.layers, shape.heads, shape.head_dim
    keys = before + chunk
    entry = shape.kv_bytes_per_entry
    linear_flops = 2 * chunk * layers * layer_linear_params(shape)
    linear_bytes = layers * (layer_linear_params(shape) + chunk * _activation_elements(shape)) * item

    pairs = attention_pairs(before, chunk, attention)
    queries = keys if attention == "padded" else chunk
    attn_flops = layers * 4 * heads * dim * pairs  # QK^T and probabilities x V
    cache_copy = (before + keys) * entry  # the cache update concatenates: read memory, write memory + chunk
    qkv_io = (2 * keys * shape.kv_heads + 2 * queries * heads) * dim * item  # K, V read; Q read, output written
    evicts = scoring and keys > after
    if shape.heads != shape.kv_heads and attention == "eager":
        qkv_io += 2 * 2 * keys * heads * dim * item  # K/V repeated to every query head, written and read
    if attention == "eager":
        scores = EAGER_PASSES * heads * pairs * SCORE_BYTES + pairs
    elif attention == "padded":
        scores = (4 * item + PADDED_FLOAT32_BYTES) * heads * pairs + pairs * SCORE_BYTES  # + the causal mask
    elif evicts:  # memstep's one pass: blocks of float32 logits, the scores from the same probabilities
        scores = ONE_PASS_PASSES * heads * pairs * SCORE_BYTES
    else:
        scores = 0  # no mask is materialized, no KV head repeated
    attn_bytes = layers * (cache_copy + qkv_io + scores)

    if evicts and attention == "padded":  # the reference scorer sums the kept maps' chunk rows
        score_flops = layers * heads * chunk * keys
        score_bytes = layers * (heads * chunk * keys * item + (keys + after) * entry)
    elif evicts:  # the column sums come with the attention pass: add them up, then gather the kept entries
        score_flops = layers * heads * pairs
        score_bytes = layers * (keys + after) * entry
    else:
        score_flops = score_bytes = 0
    return {"linear": (linear_flops, linear_bytes), "attention": (attn_flops, attn_bytes),
            "scorer": (score_flops, score_bytes)}


def step_seconds(work: dict[str, tuple[int, int]], gpu: Gpu, dtype: str, layers: int, evicts: bool,
                 efficiency: float = DEFAULT_EFFICIENCY,
                 bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY) -> dict[str, float]:
    """Roofline seconds of one step by component (each the slower of compute and memory)."""
    flops_per_s = gpu.peak_flops(dtype) * efficiency
    bytes_per_s = gpu.bandwidth_gbs * 1e9 * bandwidth_efficiency
    out = {part: max(flops / flops_per_s, moved / bytes_per_s) for part, (flops, moved) in work.items()}
    # launches are asynchronous: they only cost time when the GPU finishes its work sooner
    launches = layers * (LAYER_OVERHEAD_SECONDS + (SCORER_OVERHEAD_SECONDS if evicts else 0.0))
    out["overhead"] = max(0.0, launches - sum(out.values()))
    return out



def retained_maps_bytes(shape: ModelShape, before: int, chunk: int) -> int:
    """Attention maps of the other layers that the reference code's forward keeps alive until
    it returns (its pruner scores all layers afterwards): (layers - 1) x heads x (b + c)^2."""
    keys = before + chunk
    return (shape.layers - 1) * shape.heads * keys * keys * shape.dtype_bytes


def _lengths(schedule: Schedule, sinks: int) -> list:
    """(before, after) per step: entries per layer as ints, or as tuples under layer-wise budgets."""
    if schedule.layerwise:
        return [(tuple(b), tuple(a)) for b, a in schedule.layer_cache_lengths(sinks)]
    return schedule.cache_lengths(sinks)


def _widest(entries) -> int:
    return entries if isinstance(entries, int) else max(entries)


def _pairs(before, after) -> list[tuple[int, int]]:
    if isinstance(before, int):
        return [(before, after)]
    return list(zip(before, after))


def layer_step_work(shape: ModelShape, before, chunk: int, after, attention: str = "sdpa",
                    scoring: bool = True) -> dict[str, tuple[int, int]]:
    """step_work, where ``before``/``after`` may differ per layer (layer-wise budgets): the
    layers are grouped by their sizes and each group's work is added up."""
    if isinstance(before, int):
        return step_work(shape, before, chunk, after, attention, scoring)
    groups = Counter(_pairs(before, after))
    total: dict[str, tuple[int, int]] = {}
    for (b, a), count in groups.items():
        for part, (flops, moved) in step_work(replace(shape, layers=count, kinds=None), b, chunk, a, attention, scoring).items():
            f0, m0 = total.get(part, (0, 0))
            total[part] = (f0 + flops, m0 + moved)
    return total

