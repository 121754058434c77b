"""Models for the app: loaded once per spec and kept in a small LRU (loading takes seconds).

The schedule preview must stay instant, so it counts tokens with the tokenizer of a model
already loaded, or else the embedded model's tokenizer (no weights loaded).
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections import OrderedDict

from memstep.models import EMBEDDED, LoadedModel, default_model, embedded_model_folder, load_model

CAPACITY = max(1, int(os.environ.get("MEMSTEP_APP_MODELS", "2")))
FALLBACK_CONTEXT = 8192  # the embedded model's context, when a config does not say

_models: OrderedDict[str, LoadedModel] = OrderedDict()
_lock = threading.Lock()


def normalize_spec(spec: str | None) -> str:
    spec = (spec or "").strip() or default_model()
    return EMBEDDED if spec == "default" else spec


def get_model(spec: str | None = None) -> LoadedModel:
    """The loaded model for ``spec`` (MEMSTEP_MODEL or the embedded one when empty)."""
    spec = normalize_spec(spec)
    with _lock:  # one load at a time: two parallel loads of the same model would double memory
        if spec in _models:
            _models.move_to_end(spec)
            return _models[spec]
        lm = load_model(spec)
        _models[spec] = lm
        while len(_models) > CAPACITY:
            _models.popitem(last=False)
            _release_memory()
        return lm


def cached_model(spec: str | None) -> LoadedModel | None:
    return _models.get(normalize_spec(spec))


def _release_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


@functools.lru_cache(maxsize=1)
def embedded_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_folder())


def preview_tokenizer(spec: str | None):
    """(tokenizer, exact): the model's own tokenizer when it is loaded (or is the embedded
    model), else the embedded tokenizer as an estimate."""
    lm = cached_model(spec)
    if lm is not None:
        return lm.tokenizer, True
    return embedded_tokenizer(), normalize_spec(spec) == EMBEDDED


def context_tokens(lm: LoadedModel | None) -> int:
    """Positions the model was trained for (its context window)."""
    config = getattr(getattr(lm, "model", None), "config", None)
    return int(getattr(config, "max_position_embeddings", None) or FALLBACK_CONTEXT)
