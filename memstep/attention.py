"""memstep's attention function, registered with transformers' attention interface.

A chunk attends to the memory and to itself: query row i of a chunk of q rows sees the
first k - q + i + 1 of the layer's k keys, a causal mask aligned to the lower right. The
function derives that from the shapes of each layer's own keys instead of taking one mask
built for layer 0, so layers may hold different numbers of entries (layer-wise budgets),
and no chunk x keys mask is built by transformers. GQA runs natively (no repeated KV heads).

``use_memstep_attention(model)`` switches a model that runs SDPA to it for the span of a
with-block; a model loaded with another implementation (eager, to read attention maps)
keeps it, and then every layer must hold the same number of entries.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

NAME = "memstep"

try:  # torch >= 2.3: a lower-right causal bias that SDPA understands without a materialized mask
    from torch.nn.attention.bias import causal_lower_right
except ImportError:  # pragma: no cover - older torch: an explicit boolean mask
    causal_lower_right = None


def lower_right_mask(rows: int, keys: int, device, prefer_bias: bool = True):
    """Row i sees keys 0 .. keys - rows + i: a CausalBias where torch has one, else a boolean mask."""
    if prefer_bias and causal_lower_right is not None:
        return causal_lower_right(rows, keys)
    return torch.ones(rows, keys, dtype=torch.bool, device=device).tril(keys - rows)


def memstep_attention(module, query, key, value, attention_mask=None, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs):
    """Causal attention of a chunk over the layer's cache (memory + chunk); transformers'
    attention-function signature; returns (output (batch, rows, heads, dim), None)."""
    if kwargs.get("softcap") is not None:
        raise ValueError("memstep attention does not support logit soft-capping")
    rope = getattr(module, "memstep_rope", None)
    if rope is not None:  # compact positions: the cache holds keys before RoPE (memstep/engine.py)
        query, key = rope(module, query, key)
    rows, keys = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    if rows == keys:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=rows > 1, scale=scaling, enable_gqa=gqa)
    else:
        mask = None if rows == 1 else lower_right_mask(rows, keys, query.device)
        try:
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
        except (RuntimeError, TypeError):  # a backend without the bias or native GQA: the plain way
            mask = None if rows == 1 else lower_right_mask(rows, keys, query.device, prefer_bias=False)
            if gqa:
                groups = query.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, memstep_attention)


SWITCHABLE = ("sdpa", None, NAME)


def switchable(model) -> bool:
    """Whether the model runs SDPA (and so memstep's attention during a run)."""
    return all(c._attn_implementation in SWITCHABLE for c in _configs(model))


def _configs(model):
    seen, out = set(), []
    for sub in model.modules():
        config = getattr(sub, "config", None)
        if config is not None and id(config) not in seen and hasattr(config, "_attn_implementation"):
            seen.add(id(config))
            out.append(config)
    return out


@contextlib.contextmanager
def use_memstep_attention(model):
    """Run ``model`` with memstep's attention inside the block; restore its own afterwards."""
    configs = [c for c in _configs(model) if c._attn_implementation in SWITCHABLE]
    saved = [c._attn_implementation for c in configs]
    try:
        for c in configs:
            c._attn_implementation = NAME
        yield model
    finally:
        for c, name in zip(configs, saved):
            c._attn_implementation = name
