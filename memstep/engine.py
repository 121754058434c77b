"""Chunked prefill with a compressed KV memory.

Each step runs one chunk through the decoder together with the memory (the cache entries
kept from earlier chunks). Right after a layer's attention has run, a forward hook scores
that layer's cache (memory + chunk) and cuts it, per KV head, to the step's budget plus
the sinks. Keys keep the RoPE of their true document positions; the chunk's position_ids
are its true positions too, while the causal mask is built over the compressed cache.

``ChunkedPrefill.run`` is a generator of StepRecord; after it finishes, ``cache``,
``positions`` (per layer, (kv_heads, entries) document positions), ``tokens_seen`` and
``last_hidden`` hold the compressed memory for question answering or scoring.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from memstep.errors import MemstepError
from memstep.memory import DeviceMemory, ModelShape, step_bytes
from memstep.records import StepRecord
from memstep.schedules import Schedule
from memstep.scorers import ChunkAttention, LayerState, Scorer, select_kept


def decoder_of(model):
    """The decoder stack (embeddings + layers + final norm) of a causal LM, without the LM head."""
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers"):
        raise MemstepError(
            f"{type(model).__name__} has no decoder layer stack at .model.layers: "
            "memstep supports Llama-style causal LMs (Llama, Mistral, Qwen2/3, Gemma)"
        )
    return decoder


def model_shape(model) -> ModelShape:
    """The model's sizes as the memory model needs them, with its real parameter count."""
    param = next(model.parameters())
    params = sum(p.numel() for p in model.parameters())
    return ModelShape.from_config(model.config, dtype_bytes=param.element_size(), params=params,
                                  name=getattr(model, "name_or_path", None) or None)


def cache_keyword(decoder) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; accept either."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


class ChunkedPrefill:
    def __init__(self, model, scorer: Scorer | None = None, sinks: int = 4, attention: str = "sdpa",
                 collect_hidden: bool = False):
        if sinks < 0:
            raise MemstepError(f"sinks must be 0 or more (got {sinks})")
        self.model = model
        self.decoder = decoder_of(model)
        self.scorer = scorer or ChunkAttention()
        self.sinks = sinks
        self.attention = attention
        self.collect_hidden = collect_hidden
        self.shape = model_shape(model)
        self.device = self.decoder.embed_tokens.weight.device
        self._cache_kw = cache_keyword(self.decoder)
        self._rope = sys.modules[type(self.decoder.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self.reset()

    def reset(self) -> None:
        self.cache = None
        self.positions: list[torch.Tensor] = []
        self.tokens_seen = 0
        self.last_hidden: torch.Tensor | None = None
        self.hidden_chunks: list[torch.Tensor] = []

    # ---- hooks -------------------------------------------------------------------------
    def _remember_queries(self, module, args, output):
        self._queries = output

    def _after_attention(self, module, args, kwargs, output):
        idx = module.layer_idx
        layer = self.cache.layers[idx]
        keys, values = layer.keys, layer.values
        chunk_positions = self._chunk_positions.to(keys.device).expand(keys.shape[1], -1)
        positions = torch.cat([self.positions[idx].to(keys.device), chunk_positions], dim=1)
        self._kv_peak = max(self._kv_peak, sum(
            l.keys.nbytes + l.values.nbytes for l in self.cache.layers if l.keys is not None))
        self._memory.sample()
        if positions.shape[1] > self._keep:
            state = LayerState(self._layer_queries(module, kwargs) if self.scorer.needs_queries else None,
                               keys[0], values[0], positions, module.scaling, idx)
            kept = select_kept(self.scorer.score(state), positions, self._keep, self.sinks)
            index = kept[None, :, :, None].expand(1, -1, -1, keys.shape[-1])
            layer.keys = keys.gather(2, index)
            layer.values = values.gather(2, index)
            positions = positions.gather(1, kept)
            del state
        self.positions[idx] = positions
        self._queries = None

    def _layer_queries(self, module, kwargs) -> torch.Tensor:
        """The chunk's queries after RoPE (heads, chunk, head_dim), rebuilt from q_proj's output."""
        q = self._queries
        q = q.view(*q.shape[:-1], -1, module.head_dim)
        if hasattr(module, "q_norm"):  # Qwen3 / Gemma3 normalize queries before RoPE
            q = module.q_norm(q)
        q = q.transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        q, _ = self._rope(q, q[:, :1], cos, sin)
        return q[0]

    def _install_hooks(self) -> list:
        handles = []
        for layer in self.decoder.layers:
            attn = layer.self_attn
            if self.scorer.needs_queries:
                handles.append(attn.q_proj.register_forward_hook(self._remember_queries))
            handles.append(attn.register_forward_hook(self._after_attention, with_kwargs=True))
        return handles

    # ---- the prefill -------------------------------------------------------------------
    def run(self, input_ids: Sequence[int] | torch.Tensor, schedule: Schedule) -> Iterator[StepRecord]:
        ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
        if ids.numel() != schedule.tokens:
            raise MemstepError(f"the schedule covers {schedule.tokens} tokens but the input has {ids.numel()}")
        self.reset()
        self.scorer.reset()
        # Plain full-attention layers: a config-built cache gives sliding-window models (Mistral)
        # layers that size the mask by tokens seen, which breaks once entries are evicted.
        self.cache = DynamicCache()
        kv_heads = self.shape.kv_heads
        self.positions = [torch.zeros(kv_heads, 0, dtype=torch.long, device=self.device)
                          for _ in self.decoder.layers]
        self._memory = DeviceMemory(self.device)
        scoring = schedule.name != "full"
        handles = self._install_hooks()
        try:
            before = 0
            for step, (start, size, budget) in enumerate(
                    zip(schedule.chunk_starts, schedule.chunk_sizes, schedule.memory_sizes)):
                self._keep = min(budget + self.sinks, start + size)
                self._chunk_positions = torch.arange(start, start + size, device=self.device)[None]
                self._kv_peak = 0
                self._memory.start()
                began = time.perf_counter()
                with torch.inference_mode():
                    out = self.decoder(input_ids=ids[None, start:start + size].to(self.device),
                                       position_ids=self._chunk_positions, use_cache=True,
                                       **{self._cache_kw: self.cache})
                    hidden = out.last_hidden_state
                    self.last_hidden = hidden[:, -1]
                    if self.collect_hidden:
                        self.hidden_chunks.append(hidden[0])
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                seconds = time.perf_counter() - began
                self.tokens_seen = start + size
                after = self.positions[0].shape[1]
                parts = step_bytes(self.shape, before, size, after, attention=self.attention, scoring=scoring)
                yield StepRecord(
                    step=step, steps=schedule.steps, chunk_start=start, chunk_size=size,
                    memory_before=before, memory_budget=budget, memory_after=after, seconds=seconds,
                    bytes_measured=self._memory.peak(), bytes_modeled=parts.pop("total"),
                    bytes_modeled_parts=parts, kv_bytes_actual=self._kv_peak,
                    kept_positions=np.stack([p.cpu().numpy() for p in self.positions]),
                    evicted=before + size > after,
                )
                before = after
        finally:
            for handle in handles:
                handle.remove()

    def cache_bytes(self) -> int:
        """Bytes of the real cache tensors now."""
        return sum(l.keys.nbytes + l.values.nbytes for l in self.cache.layers if l.keys is not None)
