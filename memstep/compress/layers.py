"""Layer-stack surgery shared by layer collapse and layer removal: run a model with another
list of decoder layers, build a standalone model from such a list (config, layer indices and
cache layout made consistent), final hidden states and cost counts.

A decoder layer list is a plain Python list of ``nn.Module``; a layer of the dense model can
appear in it unchanged (shared, never written to), so a candidate costs one new layer at most.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from torch import nn

from memstep.cancel import checkpoint
from memstep.engine import decoder_of, model_shape
from memstep.errors import MemstepError
from memstep.models import check_supported


def check_decoder(model) -> list[nn.Module]:
    """The model's decoder layers; a MemstepError for anything but a supported decoder."""
    config = getattr(model, "config", None)
    if config is None:
        raise MemstepError("not a transformers model: layer collapse needs a causal LM with a config")
    check_supported(config)
    layers = list(decoder_of(model).layers)
    if len(layers) < 2:
        raise MemstepError(f"the model has {len(layers)} decoder layer(s): nothing to collapse")
    return layers


def _layer_types(config, origins: list[int]):
    types = getattr(config, "layer_types", None)
    return [types[i] for i in origins] if types is not None else None


@contextmanager
def using_layers(model, layers: list[nn.Module], origins: list[int]):
    """Run ``model`` with ``layers`` in place of its decoder layers for the duration (no
    copies). ``origins[i]`` is the original index of layer i (its layer type is kept).
    For forward passes without a cache only: layer indices are left as they are."""
    decoder = decoder_of(model)
    config = model.config
    saved = (decoder.layers, config.num_hidden_layers, getattr(config, "layer_types", None))
    decoder.layers = nn.ModuleList(layers)
    config.num_hidden_layers = len(layers)
    if saved[2] is not None:
        config.layer_types = _layer_types(config, origins)
    try:
        yield model
    finally:
        decoder.layers, config.num_hidden_layers = saved[0], saved[1]
        if saved[2] is not None:
            config.layer_types = saved[2]


def reindex(model) -> None:
    """Give every module of decoder layer i ``layer_idx = i``: the cache keeps one entry per
    layer and each attention module writes to the entry its layer_idx names."""
    for i, layer in enumerate(decoder_of(model).layers):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = i


def build_model(model, layers: list[nn.Module], origins: list[int], info: dict | None = None):
    """A standalone copy of ``model`` whose decoder layers are copies of ``layers``: config
    (num_hidden_layers, layer_types), layer indices and so the cache layout all agree with the
    new depth. ``model`` itself is left untouched. ``info`` is stored as ``config.memstep_compress``."""
    with using_layers(model, layers, origins):
        built = copy.deepcopy(model)  # copies only the layers in the list (and the shared rest once)
    config = built.config
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = _layer_types(model.config, origins)
    if getattr(config, "max_window_layers", None) is not None:
        # Qwen2/3 derive layer_types from it on load; the list above is what counts, keep it in range
        config.max_window_layers = min(config.max_window_layers, len(layers))
    if info is not None:
        config.memstep_compress = info
    reindex(built)
    return built.eval()


def final_hidden(model, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """The decoder's last hidden state (after the final norm, before the LM head) for each
    batch of token ids, in float32."""
    decoder = decoder_of(model)
    with torch.inference_mode():
        return [decoder(input_ids=ids, use_cache=False).last_hidden_state.float() for ids in batches]


def _output(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


class LayerInputs:
    """One forward of the dense model on the calibration batches, keeping what each decoder
    layer received (hidden state and call arguments: masks, rotary embeddings) and what the
    last one returned. A candidate that differs from the dense model only in layers ``start``
    and above then runs just those layers from the kept input of layer ``start``."""

    def __init__(self, model, batches: list[torch.Tensor]):
        self.model, self.decoder = model, decoder_of(model)
        self.dense = list(self.decoder.layers)
        n = len(self.dense)
        self.inputs: list[list[torch.Tensor]] = []  # [batch][layer] hidden state entering the layer
        self.kwargs: list[list[dict]] = []  # [batch][layer] the layer's keyword arguments
        self.last_output: list[torch.Tensor] = []  # [batch] the last layer's output (before the norm)
        self.final: list[torch.Tensor] = []  # [batch] the last hidden state (after the norm), float32

        def before(i):
            def hook(module, args, kwargs):
                hidden = args[0] if args else kwargs["hidden_states"]
                self.inputs[-1][i] = hidden
                self.kwargs[-1][i] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            return hook

        def after(module, args, output):
            self.last_output[-1] = _output(output)

        handles = [layer.register_forward_pre_hook(before(i), with_kwargs=True) for i, layer in enumerate(self.dense)]
        handles.append(self.dense[-1].register_forward_hook(after))
        try:
            with torch.inference_mode():
                for ids in batches:
                    checkpoint()
                    self.inputs.append([None] * n)
                    self.kwargs.append([None] * n)
                    self.last_output.append(None)
                    out = self.decoder(input_ids=ids, use_cache=False).last_hidden_state
                    self.final.append(out.float())
        finally:
            for handle in handles:
                handle.remove()

    def final_hidden(self, layers: list[nn.Module], origins: list[int], start: int) -> list[torch.Tensor]:
        """Final hidden states of the model made of ``layers`` (``origins``: the original index
        of each, whose arguments it gets), running only ``layers[start:]``. The layers below
        ``start`` must be the dense model's own."""
        if any(a is not b for a, b in zip(layers[:start], self.dense[:start])):
            raise ValueError("the layers below start differ from the dense model's")
        out = []
        with torch.inference_mode():
            for b in range(len(self.inputs)):
                hidden = self.inputs[b][start] if start < len(self.dense) else self.last_output[b]
                for layer, origin in zip(layers[start:], origins[start:]):
                    hidden = _output(layer(hidden, **self.kwargs[b][origin]))
                out.append(self.decoder.norm(hidden).float())
        return out

    def influence(self, i: int) -> float:
        """ShortGPT's block influence of layer ``i``: 1 - the cosine similarity of the layer's
        input and output hidden states, averaged over all calibration tokens."""
        n = len(self.dense)
        sims = []
        for b in range(len(self.inputs)):
            x = self.inputs[b][i][0].float()
            y = (self.inputs[b][i + 1] if i + 1 < n else self.last_output[b])[0].float()
            sims.append(torch.nn.functional.cosine_similarity(x, y, dim=-1))
        return 1.0 - torch.cat(sims).mean().item()

    def block_influence(self) -> list[float]:
        """Every layer's block influence (``influence``), bottom to top."""
        return [self.influence(i) for i in range(len(self.dense))]


def mean_similarity(reference: list[torch.Tensor], candidate: list[torch.Tensor]) -> float:
    """LaCo's similarity: per calibration sentence, the cosine of the two final hidden states
    flattened into one vector (tokens x hidden), averaged over the sentences."""
    sims = [torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
            for a, b in zip(reference, candidate)]
    return sum(sims) / len(sims)


def calibration_batches(tokenizer, texts: list[str], max_tokens: int, device) -> list[torch.Tensor]:
    """One (1, tokens) id tensor per text, tokenized as the model's own inputs (the tokenizer's
    BOS/special tokens included, as LaCo's notebook calls ``tokenizer(s)``), cut to ``max_tokens``."""
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"][:max_tokens]
        if ids:
            out.append(torch.tensor([ids], device=device))
    if not out:
        raise MemstepError("the calibration text gives no tokens")
    return out


def model_costs(model) -> dict:
    """Decoder layers, parameters, weight bytes (each tensor once: tied embeddings count once)
    and KV-cache bytes per token (keys and values of every layer at the model's dtype)."""
    shape = model_shape(model)
    seen, params, weight_bytes = set(), 0, 0
    for p in model.parameters():  # parameters() already yields a tied tensor once
        if id(p) not in seen:
            seen.add(id(p))
            params += p.numel()
            weight_bytes += p.numel() * p.element_size()
    return {"layers": len(decoder_of(model).layers), "params": params, "weight_bytes": weight_bytes,
            "kv_bytes_per_token": shape.kv_bytes_per_token}
