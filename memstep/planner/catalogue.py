"""The planner's catalogue: GPU and model presets (published datasheets and config.json
fields), and turning a preset name, a config.json or a custom GPU into the sizes the step
model counts with. No torch."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from memstep.errors import MemstepError
from memstep.memory import DTYPE_BYTES, ModelShape
from memstep.schedules import MAX_SIZE_TOKENS

DTYPES = ("bf16", "fp16", "fp32")
# What the tensors of a run cannot use: the CUDA context, cuBLAS workspaces and allocator
# fragmentation (total memory as nvidia-smi reports it minus this is what fits).
RESERVED_BYTES = 1 << 30
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
    # Hybrid attention: sliding-window layers (KV bounded by the window) between global ones.
    # Gemma 3 (google/gemma-3-*; 4B and up: the text_config): every 6th layer global
    # (sliding_window_pattern 6), the others see the last sliding_window tokens.
    "gemma-3-270m": dict(  # google/gemma-3-270m, the packaged model
        hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=32768,
        sliding_window=512, sliding_window_pattern=6, tie_word_embeddings=True),
    "gemma-3-1b": dict(  # google/gemma-3-1b-pt
        hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=32768,
        sliding_window=512, sliding_window_pattern=6, tie_word_embeddings=True),
    "gemma-3-4b": dict(  # google/gemma-3-4b-pt text_config
        hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, vocab_size=262208, max_position_embeddings=131072,
        sliding_window=1024, sliding_window_pattern=6, tie_word_embeddings=True),
    "gemma-3-12b": dict(  # google/gemma-3-12b-pt text_config
        hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, vocab_size=262208, max_position_embeddings=131072,
        sliding_window=1024, sliding_window_pattern=6, tie_word_embeddings=True),
    "gemma-3-27b": dict(  # google/gemma-3-27b-pt text_config
        hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
        num_key_value_heads=16, head_dim=128, vocab_size=262208, max_position_embeddings=131072,
        sliding_window=1024, sliding_window_pattern=6, tie_word_embeddings=True),
    # gpt-oss (openai/gpt-oss-*): layers alternate sliding (128 tokens) and global; a mixture of
    # experts (4 of num_local_experts per token); attention biases and sinks left out (0.01%).
    "gpt-oss-20b": dict(
        hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, vocab_size=201088, max_position_embeddings=131072,
        sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 12,
        num_local_experts=32, num_experts_per_tok=4, tie_word_embeddings=False),
    "gpt-oss-120b": dict(
        hidden_size=2880, intermediate_size=2880, num_hidden_layers=36, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, vocab_size=201088, max_position_embeddings=131072,
        sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 18,
        num_local_experts=128, num_experts_per_tok=4, tie_word_embeddings=False),
}
MODEL_NAMES = {
    "llama-2-7b": "Llama-2-7B", "llama-3.1-8b": "Llama-3.1-8B", "llama-3.1-70b": "Llama-3.1-70B",
    "mistral-7b": "Mistral-7B", "qwen2.5-7b": "Qwen2.5-7B", "smollm2-135m": "SmolLM2-135M",
    "gemma-3-270m": "Gemma-3-270M", "gemma-3-1b": "Gemma-3-1B", "gemma-3-4b": "Gemma-3-4B",
    "gemma-3-12b": "Gemma-3-12B", "gemma-3-27b": "Gemma-3-27B", "gpt-oss-20b": "gpt-oss-20B",
    "gpt-oss-120b": "gpt-oss-120B",
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
    except MemstepError:  # a layer type memstep does not run: its own line
        raise
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


