"""Models for the app: loaded once per spec and kept in a small LRU (loading takes seconds).

The schedule preview must stay instant, so it counts tokens with the tokenizer of a model
already loaded, or else the embedded model's tokenizer (no weights loaded).
"""

from __future__ import annotations

import functools
import gc
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from memstep.errors import MemstepError
from ui import compressed
from ui.inputs import valid_unicode
from memstep.models import (EMBEDDED, LoadedModel, looks_like_path, check_allowed, check_hub_reachable, default_model,
                            load_model, mark_prompt_form, packaged_model_folder, packaged_spec, scrub_paths)

CAPACITY = max(1, int(os.environ.get("MEMSTEP_APP_MODELS", "2")))
FALLBACK_CONTEXT = 8192  # the embedded model's context, when a config does not say

RETRY_SECONDS = 30  # a tokenizer that failed to load is tried again after this long
_models: OrderedDict[str, LoadedModel] = OrderedDict()
_tokenizer_failures: dict[str, tuple[float, str]] = {}  # spec -> (when, message)
_lock = threading.Lock()


def normalize_spec(spec: str | None, session: str | None = None) -> str:
    """The spec to load: the default when empty; refused (MemstepError) when this app does not
    offer it (memstep.models.check_allowed: an allow-list on a Space or with MEMSTEP_ALLOWED_MODELS).
    A compressed model's token (ui/compressed.py) becomes its folder: for the session that made it
    when ``session`` is given (a load); None only reads what is loaded already (a preview)."""
    valid_unicode(spec, "model")
    if compressed.is_token(spec):
        return compressed.resolve(spec, session, check_session=session is not None)
    spec = check_allowed(spec) or default_model()
    return EMBEDDED if spec == "default" else spec


# One answer for every local path that does not load, whether it exists or not: the app must
# not tell a caller which server paths exist ("Unrecognized model in /root" vs "not found").
NOT_A_MODEL_FOLDER = ("cannot load model '{spec}': there is no model memstep can load there (a folder with "
                      "config.json and weights of a supported family, or a .gguf file)")


def get_model(spec: str | None = None, session: str | None = None) -> LoadedModel:
    """The loaded model for ``spec`` (MEMSTEP_MODEL or the embedded one when empty); a compressed
    model's token loads for its own ``session`` only."""
    given = spec
    spec = normalize_spec(spec, "" if session is None and compressed.is_token(spec) else session)
    with _lock:  # one load at a time: two parallel loads of the same model would double memory
        if spec in _models:
            _models.move_to_end(spec)
            return _models[spec]
        try:
            lm = load_model(spec)
        except MemstepError as err:
            if compressed.is_token(given) or not looks_like_path(spec):
                raise
            raise MemstepError(NOT_A_MODEL_FOLDER.format(spec=spec[:80])) from err
        _models[spec] = lm
        while len(_models) > CAPACITY:
            _models.popitem(last=False)
            _release_memory()
        return lm


def cached_model(spec: str | None) -> LoadedModel | None:
    try:
        return _models.get(normalize_spec(spec))
    except MemstepError:
        if compressed.is_token(spec):  # a compressed model removed meanwhile: nothing loaded for it
            return None
        raise


def forget(spec: str) -> None:
    """Drop a loaded model whose folder is about to be replaced (the store reuses names)."""
    with _lock:
        if _models.pop(spec, None) is not None:
            _release_memory()


def _release_memory() -> None:
    gc.collect()
    try:
        import torch

        # Only where this process already uses CUDA: on ZeroGPU the main process must never
        # initialize it (CUDA calls belong in the @spaces.GPU worker, ui/runs.prefill_stream).
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except ImportError:
        pass


@functools.lru_cache(maxsize=4)
def tokenizer_only(spec: str):
    """A model's tokenizer without its weights (the embedded one, a folder, a hub id or a GGUF)."""
    from transformers import AutoTokenizer

    packaged = packaged_spec(spec)
    if packaged is not None:
        return mark_prompt_form(AutoTokenizer.from_pretrained(packaged_model_folder(packaged.spec)), spec)
    if spec.endswith(".gguf"):
        path = Path(spec)
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if not looks_like_path(spec):
        check_hub_reachable(spec)  # seconds, not transformers' ~20 s of retries
    return AutoTokenizer.from_pretrained(spec)


def embedded_tokenizer():
    return tokenizer_only(EMBEDDED)


def preview_tokenizer(spec: str | None):
    """(tokenizer, exact): the model's own tokenizer when it is loaded or is the default
    model; else the default model's tokenizer as an estimate (no download per keystroke)."""
    lm = cached_model(spec)
    if lm is not None:
        return lm.tokenizer, True
    default, exact = normalize_spec(None), normalize_spec(spec) == normalize_spec(None)
    failed = _tokenizer_failures.get(default)
    if failed and time.monotonic() - failed[0] < RETRY_SECONDS:  # no hub probe per keystroke
        raise MemstepError(failed[1])
    try:
        return tokenizer_only(default), exact
    except MemstepError as err:
        _tokenizer_failures[default] = (time.monotonic(), str(err))
        raise
    except Exception as err:  # noqa: BLE001 - any loader failure reads the same to a user
        reason = scrub_paths((str(err).strip().splitlines() or [type(err).__name__])[0][:200], keep=default)
        _tokenizer_failures[default] = (time.monotonic(), f"cannot load the tokenizer of '{default}' yet: {reason}")
        raise MemstepError(_tokenizer_failures[default][1]) from err


EMBEDDED_LAYERS = 30  # SmolLM2-135M: the layer count a preview assumes before a model is loaded


def layer_count(spec: str | None) -> tuple[int, bool]:
    """(layers, exact): the loaded model's decoder layers, else the embedded model's 30 as an
    estimate (a layer-wise preview needs a number before any model is loaded)."""
    lm = cached_model(spec)
    if lm is not None:
        return int(lm.model.config.num_hidden_layers), True
    return EMBEDDED_LAYERS, normalize_spec(spec) == EMBEDDED


def context_tokens(lm: LoadedModel | None) -> int:
    """Positions the model was trained for (its context window)."""
    config = getattr(getattr(lm, "model", None), "config", None)
    return int(getattr(config, "max_position_embeddings", None) or FALLBACK_CONTEXT)
