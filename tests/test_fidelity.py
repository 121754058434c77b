"""memstep against an independent port of the reference code's prefill step.

The port below is written from the description of "Memorize Step by Step"'s reference code
(RESOURCES.md), not from memstep's engine: it keeps every layer's keys *before* RoPE, and
at every step rotates the whole cache (sinks, then the kept memory in document order, then
the chunk) at contiguous positions 0..n-1, attends the chunk's queries (positions m..n-1)
to it, scores each key by the chunk's attention summed over query rows and over the query
heads of its KV group, average-pooled over 5 keys with zero padding counted, divided by how
many chunk queries see it, and keeps the sinks plus the top-k per KV head, in order.

It differs from the reference only where memstep deliberately differs (README, "memstep and
the reference code"): heads are grouped as the model groups them, the score sums the
chunk's real rows (no zero rows), the queries are not padded, and it runs in float32.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_model

from memstep.engine import ChunkedPrefill
from memstep.schedules import make_schedule
from memstep.scorers import make_scorer

SINKS = 4


# ---- the independent port ------------------------------------------------------------------
def rms_norm(x, norm):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight


def rotate(x, positions, theta, dim):
    """Llama RoPE of x (..., n, dim) at integer positions (n,): pairs (i, i + dim/2) rotate."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = dim // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated_half * sin


class ReferencePort:
    """The reference step, for a Llama model, with pre-RoPE key caches."""

    def __init__(self, model, sinks=SINKS, kernel=5):
        self.model, self.sinks, self.kernel = model, sinks, kernel
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.dim = config.head_dim
        self.theta = config.rope_parameters["rope_theta"]
        layers = len(model.model.layers)
        self.keys = [torch.zeros(self.kv_heads, 0, self.dim) for _ in range(layers)]  # before RoPE
        self.values = [torch.zeros(self.kv_heads, 0, self.dim) for _ in range(layers)]
        self.positions = [torch.zeros(self.kv_heads, 0, dtype=torch.long) for _ in range(layers)]

    def score(self, probabilities, memory, chunk):
        """probabilities (heads, chunk, keys) -> (kv_heads, keys)."""
        group = self.heads // self.kv_heads
        summed = probabilities.sum(dim=1).reshape(self.kv_heads, group, -1).sum(dim=1)
        pooled = F.avg_pool1d(summed[:, None], self.kernel, stride=1, padding=self.kernel // 2)[:, 0]
        seen_by = torch.tensor([chunk] * memory + [chunk - j for j in range(chunk)], dtype=torch.float32)
        return pooled / seen_by

    def step(self, ids, first, keep_per_layer):
        """One chunk (document positions first..first+c-1); returns its final hidden states."""
        model = self.model.model
        chunk = ids.shape[0]
        hidden = model.embed_tokens(ids)
        for idx, layer in enumerate(model.layers):
            attn = layer.self_attn
            x = rms_norm(hidden, layer.input_layernorm)
            q = attn.q_proj(x).view(chunk, self.heads, self.dim).transpose(0, 1)
            k = attn.k_proj(x).view(chunk, self.kv_heads, self.dim).transpose(0, 1)
            v = attn.v_proj(x).view(chunk, self.kv_heads, self.dim).transpose(0, 1)
            keys = torch.cat([self.keys[idx], k], dim=1)
            values = torch.cat([self.values[idx], v], dim=1)
            doc = torch.cat([self.positions[idx], torch.arange(first, first + chunk).expand(self.kv_heads, -1)], 1)
            n = keys.shape[1]
            memory = n - chunk
            contiguous = torch.arange(n)
            k_rot = rotate(keys, contiguous, self.theta, self.dim)
            q_rot = rotate(q, contiguous[memory:], self.theta, self.dim)
            group = self.heads // self.kv_heads
            k_all = k_rot.repeat_interleave(group, 0)
            v_all = values.repeat_interleave(group, 0)
            logits = q_rot @ k_all.transpose(1, 2) / math.sqrt(self.dim)
            visible = torch.arange(n)[None, :] <= (memory + torch.arange(chunk))[:, None]
            probabilities = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
            out = (probabilities @ v_all).transpose(0, 1).reshape(chunk, -1)
            hidden = hidden + attn.o_proj(out)
            x = rms_norm(hidden, layer.post_attention_layernorm)
            hidden = hidden + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x))
            keep = keep_per_layer[idx]
            if n > keep:
                scores = self.score(probabilities, memory, chunk)
                scores = scores.masked_fill(doc < self.sinks, float("inf"))
                kept = torch.topk(scores, keep, dim=-1).indices.sort(dim=-1).values
                keys = keys.gather(1, kept[..., None].expand(-1, -1, self.dim))
                values = values.gather(1, kept[..., None].expand(-1, -1, self.dim))
                doc = doc.gather(1, kept)
            self.keys[idx], self.values[idx], self.positions[idx] = keys, values, doc
        return rms_norm(hidden, model.norm)

    def run(self, ids, schedule):
        layers = len(self.model.model.layers)
        hidden, kept = [], []
        with torch.inference_mode():
            for step, (start, size) in enumerate(zip(schedule.chunk_starts, schedule.chunk_sizes)):
                keep = [b + self.sinks for b in schedule.layer_budgets(step, layers)]
                hidden.append(self.step(ids[start:start + size], start, keep))
                kept.append([p.clone() for p in self.positions])
        return hidden, kept


# ---- engine vs port ------------------------------------------------------------------------
SCHEDULES = [("fm", "linear"), ("im", "linear"), ("imdc", "linear"), ("imdc", "square"), ("im", "square-sqrt"),
             ("imdc", "double-inverse")]


@pytest.fixture(scope="module")
def gqa_model():
    return make_tiny_model("llama", layers=3, seed=11)


@pytest.mark.parametrize("name,growth", SCHEDULES, ids=[f"{n}-{g}" for n, g in SCHEDULES])
def test_engine_matches_the_reference_port(gqa_model, name, growth):
    tokens = 300
    ids = torch.randint(0, 128, (tokens,), generator=torch.Generator().manual_seed(12))
    schedule = make_schedule(name, tokens, 64, 56, growth, layers=3)
    port_hidden, port_kept = ReferencePort(gqa_model).run(ids, schedule)
    engine = ChunkedPrefill(gqa_model, make_scorer("conv"), sinks=SINKS, rope="compact", collect_hidden=True)
    records = list(engine.run(ids, schedule))
    assert sum(r.evicted for r in records) >= 3
    for step, record in enumerate(records):
        for layer, entries in enumerate(record.layer_entries):
            ours = record.kept_positions[layer][:, :entries]
            assert np.array_equal(ours, port_kept[step][layer].numpy()), (step, layer)
        torch.testing.assert_close(engine.hidden_chunks[step], port_hidden[step], rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"step {step}: {m}")
    # positions never exceed sinks + M + c, the point of compact positions
    assert max(r.first_position + r.chunk_size for r in records) <= SINKS + 56 + max(schedule.chunk_sizes)


def test_document_positions_differ_from_the_reference(gqa_model):
    """The port is sensitive to positions: document mode (true positions) does not match it."""
    ids = torch.randint(0, 128, (300,), generator=torch.Generator().manual_seed(12))
    schedule = make_schedule("fm", 300, 64, 56)
    port_hidden, _ = ReferencePort(gqa_model).run(ids, schedule)
    engine = ChunkedPrefill(gqa_model, make_scorer("conv"), sinks=SINKS, rope="document", collect_hidden=True)
    list(engine.run(ids, schedule))
    assert not torch.allclose(engine.hidden_chunks[-1], port_hidden[-1], atol=1e-3)
