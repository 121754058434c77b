"""The planner: peak memory and time of every step of a schedule, for real models and GPUs.

Pure arithmetic (no torch), so a 1M-token context plans in a fraction of a second. The
memory side is ``memstep.memory.step_bytes`` (the formula the engine reports per step and
whose KV parts equal the engine's real cache tensors); this module adds FLOPs, bytes moved
and a roofline time per step, GPU presets, and the comparisons of schedules.

Time of one step: each component (projections + MLP, attention, scorer + eviction) takes
max(FLOPs / (peak FLOP/s x efficiency), bytes moved / (bandwidth x bandwidth efficiency));
the step is their sum. Components are
timed separately because they sit on different sides of the roofline: projections are
compute-bound at useful chunk sizes, while eager attention streams its score matrices
through memory. Kernel launches (a fixed cost per layer) only add time when they take
longer than the GPU work they launch, as for small models.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from memstep.errors import MemstepError
from memstep.memory import ATTENTIONS, DTYPE_BYTES, PARTS, PLANNED_DEVICE, SCORE_BYTES, ModelShape, step_bytes
from memstep.schedules import (GROWTHS, MAX_SIZE_TOKENS, MAX_STEPS, Schedule, check_bounds, check_steps, largest_true,
                               make_schedule)

PLAN_SCHEDULES = ("fm", "im", "imdc", "full")
DTYPES = ("bf16", "fp16", "fp32")
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
# What the tensors of a run cannot use: the CUDA context, cuBLAS workspaces and allocator
# fragmentation (total memory as nvidia-smi reports it minus this is what fits).
RESERVED_BYTES = 1 << 30
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
# Longest-context search: the peak of a compressed schedule stops growing once its steps
# reach their steady size, so fitting at this length means there is no limit.
LONGEST_CAP_TOKENS = 1 << 24
LONGEST_CAP_STEPS = MAX_STEPS  # the longest schedule anything may build
# Bounds on a model's sizes and a GPU's figures: far beyond any real one, small enough that
# every formula stays finite (a config.json or custom GPU can hold anything).
MAX_MODEL_SIZE = 10_000_000
MAX_GPU_FIGURE = 1_000_000.0

# Model presets: the fields of each model's published config.json that memory and time
# depend on. Parameter counts come from memstep.memory.estimate_params (tested against the
# published counts).
MODEL_PRESETS: dict[str, dict] = {
    "llama-2-7b": dict(  # meta-llama/Llama-2-7b-hf
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
        tie_word_embeddings=False),
    "llama-3.1-8b": dict(  # meta-llama/Llama-3.1-8B
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        tie_word_embeddings=False),
    "llama-3.1-70b": dict(  # meta-llama/Llama-3.1-70B
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        tie_word_embeddings=False),
    "mistral-7b": dict(  # mistralai/Mistral-7B-v0.1
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=32768,
        tie_word_embeddings=False),
    "qwen2.5-7b": dict(  # Qwen/Qwen2.5-7B (q/k/v biases are left out: 0.01% of the weights)
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, head_dim=128, vocab_size=152064, max_position_embeddings=131072,
        tie_word_embeddings=False),
    "smollm2-135m": dict(  # HuggingFaceTB/SmolLM2-135M(-Instruct), the embedded model
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
        tie_word_embeddings=True),
}
MODEL_NAMES = {
    "llama-2-7b": "Llama-2-7B", "llama-3.1-8b": "Llama-3.1-8B", "llama-3.1-70b": "Llama-3.1-70B",
    "mistral-7b": "Mistral-7B", "qwen2.5-7b": "Qwen2.5-7B", "smollm2-135m": "SmolLM2-135M",
}

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    """One GPU: dense (no sparsity) tensor-core peaks, memory bandwidth and memory size."""

    name: str
    bf16_tflops: float | None  # None: no bf16 tensor cores
    fp16_tflops: float
    fp32_tflops: float
    bandwidth_gbs: float  # GB/s, 1e9 bytes
    memory_bytes: int  # total device memory as nvidia-smi reports it

    def peak_flops(self, dtype: str) -> float:
        if dtype == "fp32":
            return self.fp32_tflops * 1e12
        if dtype == "bf16" and self.bf16_tflops:
            return self.bf16_tflops * 1e12
        if dtype == "bf16":  # emulated on GPUs without bf16 tensor cores: FP32 speed at best
            return self.fp32_tflops * 1e12
        return self.fp16_tflops * 1e12

    @property
    def usable_bytes(self) -> int:
        return max(0, self.memory_bytes - RESERVED_BYTES)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "usable_bytes": self.usable_bytes}


# GPU presets from NVIDIA's datasheets (dense tensor-core TFLOP/s; the datasheets print the
# 2:4-sparse figure next to it, twice as large): T4 (Turing, no bf16: fp16 65, fp32 8.1,
# 320 GB/s, 16 GB), L4 (bf16 121, fp32 30.3, 300 GB/s, 24 GB), A100 40GB SXM (bf16 312,
# fp32 19.5, 1555 GB/s), A100 80GB SXM (312, 19.5, 2039 GB/s), H100 SXM 80GB (bf16 989,
# fp32 67, 3.35 TB/s), H200 SXM 141GB (989, 67, 4.8 TB/s). A10G is AWS's variant of the A10
# (no public datasheet): 24 GB at 600 GB/s like the A10, tensor peak 70 TFLOP/s (bf16) and
# fp32 35 TFLOP/s as AWS and Baseten report. Memory sizes are the totals nvidia-smi shows.
GPU_PRESETS: dict[str, Gpu] = {
    "t4": Gpu("T4", None, 65.0, 8.1, 320.0, 15360 * MIB),
    "l4": Gpu("L4", 121.0, 121.0, 30.3, 300.0, 23034 * MIB),
    "a10g": Gpu("A10G", 70.0, 70.0, 35.0, 600.0, 23028 * MIB),
    "a100-40gb": Gpu("A100 40GB", 312.0, 312.0, 19.5, 1555.0, 40960 * MIB),
    "a100-80gb": Gpu("A100 80GB", 312.0, 312.0, 19.5, 2039.0, 81920 * MIB),
    "h100-80gb": Gpu("H100 80GB", 989.0, 989.0, 67.0, 3350.0, 81559 * MIB),
    "h200-141gb": Gpu("H200 141GB", 989.0, 989.0, 67.0, 4800.0, 143771 * MIB),
}
GPU_ALIASES = {"a100": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb", "h100": "h100-80gb",
               "h100-80": "h100-80gb", "h200": "h200-141gb", "h200-141": "h200-141gb"}


# ---- inputs -----------------------------------------------------------------------------
def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def dtype_name(dtype: str) -> str:
    canonical = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
    name = canonical.get(str(dtype).lower(), str(dtype).lower())
    if name not in DTYPES:
        raise MemstepError(f"unknown dtype '{dtype}': choose one of {', '.join(DTYPES)}")
    return name


def read_config(path: str | Path) -> dict:
    """A model's config.json (or the folder that holds one) as a dict."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise MemstepError(f"model config not found: {path} (give a preset: {', '.join(MODEL_PRESETS)}, "
                           "or the path of a config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MemstepError(f"{path} is not a valid config.json: {err}") from err
    except RecursionError:
        raise MemstepError(f"{path} is not a valid config.json: nested too deeply") from None
    except OSError as err:
        raise MemstepError(f"cannot read {path}: {err.strerror}") from err
    if not isinstance(config, dict):
        raise MemstepError(f"{path} is not a valid config.json: expected a JSON object")
    return config


def resolve_model(model, dtype: str = "bf16") -> ModelShape:
    """A ModelShape from a preset name, a config.json path (file or folder), a config dict or
    object, or a ModelShape; its byte sizes follow ``dtype``."""
    dtype_bytes = DTYPE_BYTES[dtype_name(dtype)]
    if isinstance(model, ModelShape):
        return dataclasses.replace(model, dtype_bytes=dtype_bytes)
    name = None
    if isinstance(model, (str, Path)):
        key = _key(str(model))
        if key in MODEL_PRESETS:
            model, name = MODEL_PRESETS[key], MODEL_NAMES[key]
        elif str(model).endswith(".json") or Path(model).exists() or "/" in str(model):
            name = Path(model).parent.name if str(model).endswith(".json") else Path(model).name
            model = read_config(model)
        else:
            raise MemstepError(f"unknown model '{model}': choose a preset ({', '.join(MODEL_PRESETS)}) "
                               "or give the path of a config.json")
    if isinstance(model, dict):
        _check_config(model)
    try:
        shape = ModelShape.from_config(model, dtype_bytes=dtype_bytes, name=name)
    except (ValueError, TypeError) as err:
        raise MemstepError(f"model config is missing sizes: {err}") from err
    except RecursionError:
        raise MemstepError("model config is nested too deeply (text_config inside text_config ...)") from None
    _check_shape(shape)
    return shape


CONFIG_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size")


def _check_config(config: dict) -> None:
    """A config.json's sizes, before any arithmetic on them: strings, NaN, negative or absurd
    sizes get one readable line (the language model's sizes sit in text_config when nested)."""
    for _ in range(8):
        if not isinstance(config.get("text_config"), dict):
            break
        config = config["text_config"]
    else:
        raise MemstepError("model config is nested too deeply (text_config inside text_config ...)")
    for key in CONFIG_SIZES + ("max_position_embeddings",):
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= (
                MAX_SIZE_TOKENS if key == "max_position_embeddings" else MAX_MODEL_SIZE):
            raise MemstepError(f"model config has a bad {key} ({str(value)[:40]!r}): give a whole number from 1 to "
                               f"{MAX_MODEL_SIZE:,}")


def _check_shape(shape: ModelShape) -> None:
    """Sizes read from a config.json: whole numbers in [1, MAX_MODEL_SIZE], KV heads <= heads."""
    for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
        value = getattr(shape, field)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MODEL_SIZE:
            raise MemstepError(f"model config has a bad {field} size ({str(value)[:40]!r}): each size must be a "
                               f"whole number from 1 to {MAX_MODEL_SIZE:,}")
    if shape.kv_heads > shape.heads:
        raise MemstepError(f"model config has more KV heads ({shape.kv_heads}) than attention heads ({shape.heads})")
    limit = shape.max_positions
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise MemstepError(f"model config has a bad max_position_embeddings ({str(limit)[:40]!r})")


def resolve_gpu(gpu="h100-80gb", tflops: float | None = None, bandwidth_gbs: float | None = None,
                memory_gib: float | None = None) -> Gpu:
    """A preset (optionally with some numbers replaced) or, with ``gpu='custom'``, your own.
    ``tflops`` is the dense 16-bit peak; a custom GPU uses it for fp32 too."""
    for label, value in (("TFLOP/s", tflops), ("bandwidth", bandwidth_gbs), ("GPU memory", memory_gib)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise MemstepError(f"{label} must be a positive number (got {value})")
        if value is not None and value > MAX_GPU_FIGURE:
            raise MemstepError(f"{label} {value:g} is beyond any GPU: at most {MAX_GPU_FIGURE:g}")
    if isinstance(gpu, Gpu):
        base = gpu
    elif _key(str(gpu)) == "custom":
        if tflops is None or bandwidth_gbs is None or memory_gib is None:
            raise MemstepError("a custom GPU needs its peak TFLOP/s, bandwidth (GB/s) and memory (GiB)")
        base = Gpu("custom", tflops, tflops, tflops, bandwidth_gbs, int(memory_gib * GIB))
    else:
        key = GPU_ALIASES.get(_key(str(gpu)), _key(str(gpu)))
        if key not in GPU_PRESETS:
            raise MemstepError(f"unknown GPU '{gpu}': choose one of {', '.join(GPU_PRESETS)} or 'custom'")
        base = GPU_PRESETS[key]
    changes = {}
    if tflops is not None:
        changes.update(bf16_tflops=tflops, fp16_tflops=tflops)
    if bandwidth_gbs is not None:
        changes["bandwidth_gbs"] = bandwidth_gbs
    if memory_gib is not None:
        changes["memory_bytes"] = int(memory_gib * GIB)
    return dataclasses.replace(base, **changes) if changes else base


# ---- FLOPs and bytes moved per step ----------------------------------------------------------
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


# ---- plans ----------------------------------------------------------------------------------
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
    layer_memory_after: list[int] | None = None  # layer-wise budgets: each layer's entries after the step

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
    rope: str = "compact"  # RoPE positions of the engine: compact (contiguous) or document
    question_tokens: int = 0  # question-aware: the question's tokens read with every step

    @property
    def largest_position(self) -> int:
        """How many RoPE positions the run uses (0..n-1): compact positions stop at the widest step."""
        if self.rope == "compact" and self.schedule.name != "full":
            return max(s.memory_before + s.chunk_size for s in self.steps)
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
                      "kv_bytes_per_token": self.model.kv_bytes_per_token},
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
        for part, (flops, moved) in step_work(replace(shape, layers=count), b, chunk, a, attention, scoring).items():
            f0, m0 = total.get(part, (0, 0))
            total[part] = (f0 + flops, m0 + moved)
    return total


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
            zip(_lengths(schedule, sinks), schedule.chunk_starts, schedule.chunk_sizes)):
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
        steps.append(StepPlan(i, start, read, _widest(before), _widest(after), dict(parts), total, flops,
                              dict(seconds), list(after) if isinstance(after, tuple) else None))
    plan = Plan(shape, gpu, dtype, schedule, attention, sinks, evict_per_layer, keep_maps, efficiency,
                bandwidth_efficiency, steps, rope=rope, question_tokens=extra)
    plan.notices.extend(_notices(plan))
    return plan


def _notices(plan: Plan) -> list[str]:
    out = []
    limit = plan.model.max_positions
    if limit and plan.largest_position > limit:
        what = (f"{plan.schedule.tokens} tokens" if plan.largest_position == plan.schedule.tokens
                else f"the widest step ({plan.largest_position} entries)")
        out.append(f"{plan.rope} positions: {what} go beyond {plan.model.name}'s {limit} trained positions "
                   "(RoPE scaling needed); the plan still counts them.")
    elif limit and plan.schedule.tokens > limit:
        out.append(f"{plan.schedule.tokens} tokens are more than {plan.model.name}'s {limit} trained positions, "
                   f"but with compact RoPE positions no step uses more than {plan.largest_position} positions.")
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
    if rope not in ("compact", "document"):
        raise MemstepError(f"unknown RoPE position mode '{rope}': choose compact or document")
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
