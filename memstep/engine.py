"""Chunked prefill with a compressed KV memory.

Each step runs one chunk through the decoder together with the memory (the cache entries
kept from earlier chunks). Right after a layer's attention has run, a forward hook scores
that layer's cache (memory + chunk) and cuts it, per KV head, to the layer's budget plus
the sinks. Attention runs through memstep's own function (memstep/attention.py): causal
from the lower right of each layer's own cache, so layers may hold different numbers of
entries (layer-wise budgets).

RoPE positions, three modes:
- ``compact`` (the reference code's): the cache keeps keys *before* RoPE, and at every step
  each layer's attention rotates its whole cache (sinks, kept memory in document order,
  then the chunk) at contiguous positions 0..n-1, the chunk's queries at the last rows, so
  positions never exceed sinks + M + c and no rounding accumulates across steps. The
  decoder runs with position ids 0 (RoPE is the identity there); memstep's attention
  function does the rotation, and hands the rotated queries and keys to the scorer.
- ``document``: keys keep the RoPE of their true document positions (rotated once, by the
  model), and the chunk's position_ids are its true positions.
- ``shared``: as compact (keys cached before RoPE, rotated by memstep's attention), but each
  entry sits at its token's rank among the tokens the memory holds in any layer or head, so
  every head reads a token at one position (memstep/shared_positions.py).

The reference code's ways, as switches (``memstep.presets.Fidelity``): sinks taken out of the
keys and the attention's key columns before scoring (``sink_scoring``), query heads summed
into KV heads with a stride (``gqa_grouping``), the last c rows of the zero-padded query
block counted (``score_rows``), dynamic NTK RoPE once a step's positions pass the model's
trained length (``ntk``). A fixed-incremental schedule (``fim``) never scores the memory
kept from earlier steps again: only the chunk competes for the step's share.

Hybrid attention (Gemma 3, gpt-oss, ...; ``memstep.layers``): a sliding-window layer is never
scored: it keeps the last window - 1 entries it read, and its attention shows each query the
``window`` keys ending at its own, across chunk boundaries. Only the global layers follow the
schedule and the scorer. Each layer type rotates with its own RoPE base. Under compact
positions a sliding layer's cache is contiguous (nothing evicted inside the window), so
positions 0..n-1 give each query-key pair the same distance as the document's positions.

``ChunkedPrefill.run`` is a generator of StepRecord; after it finishes, ``cache``,
``positions`` (per layer, (kv_heads, entries) document positions), ``tokens_seen``,
``position`` (the RoPE position of the next token) and ``last_hidden`` hold the compressed
memory for question answering or scoring.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from memstep import heap
from memstep.attention import StepContext, switchable, use_memstep_attention
from memstep.errors import MemstepError
from memstep.layers import GLOBAL, TYPE_LABELS
from memstep.memory import DeviceMemory, ModelShape, step_bytes
from memstep.presets import ROPE_MODES, Fidelity
from memstep.question_pool import (LEND_TOP, QUESTION_POOL, SENTENCE, carry_fade, carry_kind,
                                   default_weight, fade_at, heads_at, last_at, lend_at, named_pool,
                                   parse_question_pool, spans_at, spans_need_text)
from memstep.records import StepRecord
from memstep.schedules import Schedule
from memstep.scorers import ChunkAttention, LayerState, Scorer, select_kept
from memstep.shared_positions import held_tokens, shared_positions
from memstep.spans import SpanSetting, select_spans, span_table


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


ENGINE_ATTENTIONS = ("sdpa", "padded")
def check_question_aware(scorer: Scorer, question_tokens: int, weight: float) -> None:
    if question_tokens < 1:
        raise MemstepError("question-aware compression needs a question: type one, or untick question-aware")
    if not scorer.attention_rows(1):
        raise MemstepError(f"question-aware compression adds the question's attention to an attention-based "
                           f"scorer (chunk-attention, conv, snapkv, vatp), not to '{scorer.name}'")
    if not 0 < weight <= 1:
        raise MemstepError(f"the question weight must be in (0, 1] (got {weight})")


def _share(scores: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """Scores as shares of one over the non-sink keys of each KV head."""
    scores = scores.float().clamp(min=0) * free
    return scores / scores.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)


def question_share(question: torch.Tensor, positions: torch.Tensor, sinks: int,
                   pool: str = QUESTION_POOL) -> torch.Tensor:
    """The attention the question's queries pay each key, pooled over its neighbours, as a share
    of one over the non-sink keys (the sinks are kept anyway, and draw most of it)."""
    free = positions >= sinks
    # a key the question looks at carries its neighbours (the number after "the lighthouse is"), as
    # SnapKV pools its window's scores: by default (max:15) the 7 keys on each side of it
    # (the sinks' share is taken out first: it would spill onto the keys next to them)
    question = question.float() * free
    kind, width = parse_question_pool(pool)
    if kind == "max":
        question = F.max_pool1d(question[:, None], width, stride=1, padding=width // 2)[:, 0]
    elif kind == "mean":
        question = F.avg_pool1d(question[:, None], width, stride=1, padding=width // 2,
                                count_include_pad=False)[:, 0]
    elif kind == "follow":  # the keys after a looked-at key take its attention (scores are >= 0: zero padding)
        question = F.max_pool1d(F.pad(question[:, None], (width - 1, 0)), width, stride=1)[:, 0]
    return _share(question, free)


def carry_share(share: torch.Tensor, carried: torch.Tensor | None) -> torch.Tensor:
    """``+carry``: each memory entry (the leading ``carried.shape[1]`` entries, in the order the
    memory holds them) takes the larger of this step's question share and the one it carried."""
    if carried is None:
        return share
    held = carried.shape[1]
    return torch.cat([torch.maximum(share[:, :held], carried.to(share)), share[:, held:]], dim=1)


def fade_share(carried: torch.Tensor, fade: float, carried_for: torch.Tensor | None, after: int) -> torch.Tensor:
    """``+fade:F``: each carried share worth ``fade`` of itself one step on; ``+fade:F/K``: only the
    shares already carried through ``after`` cuts (``carried_for``, in the order of ``carried``)."""
    if not after:
        return carried * fade
    if carried_for is None:  # the first cut: nothing has been carried through one yet
        return carried
    return torch.where(carried_for >= after, carried * fade, carried)


def share_over_heads(share: torch.Tensor, positions: torch.Tensor, weight: float = 1.0) -> torch.Tensor:
    """``+heads``: each entry takes the strongest share any KV head gives the same document position
    (heads hold different memories: matched by position, not by index); ``+heads/W`` (weight W < 1):
    the larger of its own share and W times that. share, positions: (kv_heads, entries)."""
    where = positions.long()
    best = share.new_zeros(int(where.max()) + 1).scatter_reduce(0, where.flatten(), share.flatten(), reduce="amax",
                                                                 include_self=False)
    return best[where] if weight >= 1 else torch.maximum(share, weight * best[where])


def lend_over_heads(share: torch.Tensor, positions: torch.Tensor, spread: float, top: int) -> torch.Tensor:
    """``+lend:C`` (``spread`` C): a KV head whose ``top`` largest shares sum to less than C times the
    largest such sum among the layer's heads takes the strongest share any head gives each position
    (share_over_heads); every other head keeps its own. share, positions: (kv_heads, entries)."""
    focus = share.topk(min(top, share.shape[1]), dim=1).values.sum(dim=1)
    thin = focus < spread * focus.max()
    if not bool(thin.any()):
        return share
    return torch.where(thin[:, None], share_over_heads(share, positions), share)


def spans_over_heads(share: torch.Tensor, positions: torch.Tensor, sinks: int, count: int,
                     length: int | str, sentences: torch.Tensor | None = None) -> torch.Tensor:
    """``+spans:KxL`` (``count`` K, ``length`` L): which entries (kv_heads, entries) lie in the layer's K
    spans of L positions (from the first position after the sinks; L "sentence": the sentences of
    ``sentences``, a span id per position) that hold the most question share summed over its KV heads
    (heads hold different memories: summed by position, not by index)."""
    where = positions.long()
    free = where >= sinks
    if length == SENTENCE:
        span = sentences[where].clamp(min=0)
    else:
        span = (where - sinks).clamp(min=0) // length
    total = share.new_zeros(int(span.max()) + 1).scatter_add(0, span.flatten(), (share * free).flatten())
    strongest = total.topk(min(count, total.numel())).indices
    return torch.isin(span, strongest) & free


def question_mix(base: torch.Tensor, question: torch.Tensor, positions: torch.Tensor, sinks: int,
                 weight: float, pool: str = QUESTION_POOL, share: torch.Tensor | None = None) -> torch.Tensor:
    """A question-aware score: (1 - weight) x the scorer's score + weight x the question's share
    (``question_share``, or ``share`` when given), each a share of one over the non-sink keys."""
    share = question_share(question, positions, sinks, pool) if share is None else share
    return (1 - weight) * _share(base, positions >= sinks) + weight * share


def ntk_factor(last_position: int, limit: int) -> int:
    """The reference's dynamic NTK factor for a step whose last position is ``last_position``
    (Qwen's rule): 1 up to the model's trained length, then 3, 7, 15, ... as it doubles."""
    if last_position <= 0:
        return 1
    return max(2 ** math.ceil(math.log(last_position / limit, 2) + 1) - 1, 1)


def ntk_settings(model, decoder, rope: str) -> dict:
    """What dynamic NTK needs of the model (plain RoPE, compact positions), or a refusal."""
    if rope != "compact":
        raise MemstepError("dynamic NTK rescales the compact positions, as the reference code does: use rope "
                           "compact, or ntk none with document or shared positions")
    config = model.config
    parameters = getattr(config, "rope_parameters", None) or {}
    kind = parameters.get("rope_type") or getattr(decoder.rotary_emb, "rope_type", "default")
    base = parameters.get("rope_theta", getattr(config, "rope_theta", None))
    limit = getattr(config, "max_position_embeddings", None)
    if kind != "default" or base is None or not limit:
        raise MemstepError(f"dynamic NTK applies to plain RoPE (this model's is '{kind}'): use ntk none")
    dim = decoder.rotary_emb.inv_freq.shape[0] * 2
    return {"base": float(base), "dim": dim, "limit": int(limit)}


def check_rope(rope: str) -> str:
    if rope not in ROPE_MODES:
        raise MemstepError(f"unknown RoPE position mode '{rope}': choose compact (contiguous positions, as the "
                           "reference code), document (true document positions) or shared (compact positions "
                           "every layer and head agree on)")
    return rope


def cache_keyword(decoder) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; accept either."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


class ChunkedPrefill(StepContext):
    def __init__(self, model, scorer: Scorer | None = None, sinks: int = 4, attention: str = "sdpa",
                 collect_hidden: bool = False, rope: str = "compact", question_ids: Sequence[int] | None = None,
                 question_weight: float | None = None, fidelity: Fidelity | None = None,
                 question_pool: str = QUESTION_POOL, span: SpanSetting | None = None):
        if sinks < 0:
            raise MemstepError(f"sinks must be 0 or more (got {sinks})")
        if attention not in ENGINE_ATTENTIONS:
            raise MemstepError(f"unknown attention '{attention}': choose sdpa (memstep's: fused where no score is "
                               "needed, one pass where one is) or padded (the reference code's (m + c)^2 maps)")
        self.model = model
        self.decoder = decoder_of(model)
        self.scorer = scorer or ChunkAttention()
        self.sinks = sinks
        self.attention = attention
        self.collect_hidden = collect_hidden
        self.rope = check_rope(rope)
        self.question_ids = torch.as_tensor(list(question_ids or []), dtype=torch.long)
        self.question_pool = question_pool = named_pool(question_pool)  # 'tuned': the recipe it names
        # None: the pool's own (the tuned recipe's 0.75, else QUESTION_WEIGHT)
        self.question_weight = float(default_weight(question_pool) if question_weight is None else question_weight)
        parse_question_pool(question_pool)
        self.question_carry = carry_kind(question_pool)  # None, "carry" or "fade"
        self.question_fade = carry_fade(question_pool)[0]  # what is left of a carried share one step on
        self._count_cuts = bool(fade_at(question_pool, 0))  # +fade:F/K: some step fades only votes K cuts old
        self.span = span  # span-preserving selection (memstep.spans); None: the token top-k
        self.span_table: torch.Tensor | None = None  # span id per position (sentence / clause: set by the caller)
        self.sentence_table: torch.Tensor | None = None  # sentence id per position (+spans:Kxsentence: the caller's)
        if question_ids is not None:
            check_question_aware(self.scorer, self.question_ids.numel(), self.question_weight)
            if not switchable(model):
                raise MemstepError("question-aware compression needs the model loaded with SDPA attention")
        self.fidelity = fidelity or Fidelity()
        self.shape = model_shape(model)
        self.kinds = self.shape.kinds
        if self.kinds.hybrid and not switchable(model):
            raise MemstepError("sliding-window layers need the model loaded with SDPA attention "
                               f"(it runs '{model.config._attn_implementation}')")
        if self.kinds.hybrid and self.fidelity.ntk == "dynamic":
            raise MemstepError("dynamic NTK rescales one RoPE base; this model has one per layer type: use ntk none")
        self.device = self.decoder.embed_tokens.weight.device
        self._cache_kw = cache_keyword(self.decoder)
        self._rope = sys.modules[type(self.decoder.layers[0].self_attn).__module__].apply_rotary_pos_emb
        if self.fidelity.ntk == "dynamic":
            self._ntk = ntk_settings(model, self.decoder, self.rope)
        self.reset()

    def reset(self) -> None:
        self.cache = None
        self.positions: list[torch.Tensor] = []
        self.tokens_seen = 0
        self.position = 0  # RoPE position of the next token
        self.last_hidden: torch.Tensor | None = None
        self.hidden_chunks: list[torch.Tensor] = []
        self._rope_tables: dict[str, tuple] = {}
        self._held: torch.Tensor | None = None  # shared positions: the tokens the memory holds anywhere
        self._ntk_tables: dict[int, tuple] = {}
        self._window: int | None = None  # score rows "last-c": the configured chunk c
        self._frozen = False  # fixed-incremental: the memory from earlier steps is never scored again
        self._steps_left = 0  # steps of the schedule after the current one (+last)
        self._read_through = 0  # the furthest document position read so far, plus one
        self._attended = self._queries = None
        self._prefilling = self._padded_run = False
        self._question_step: list[int] = []  # question tokens carried by the current step
        self._question_rows = None
        self._carried: dict[int, torch.Tensor] = {}  # +carry: each layer's memory entries' question shares
        self._carried_for: dict[int, torch.Tensor] = {}  # +fade:F/K: the cuts each of those shares has been carried through

    # ---- hooks -------------------------------------------------------------------------
    def _remember_queries(self, module, args, output):
        self._queries = output

    def _after_attention(self, module, args, kwargs, output):
        idx = module.layer_idx
        layer = self.cache.layers[idx]
        keys, values = layer.keys, layer.values
        chunk_positions = self._chunk_positions.to(keys.device).expand(keys.shape[1], -1)
        positions = torch.cat([self.positions[idx].to(keys.device), chunk_positions], dim=1)
        self._kv_peak = max(self._kv_peak, self.cache_bytes())
        self._memory.sample()
        keep = self._keep[idx]
        entries = positions.shape[1]  # memory + chunk: the question's own entries (after them) never stay
        if keys.shape[2] > entries:
            keys, values = keys[:, :, :entries], values[:, :, :entries]
            layer.keys, layer.values = keys, values
        if self.kinds.sliding(idx):  # the model's window: the last entries read, never scored
            if entries > keep:
                layer.keys, layer.values = keys[:, :, entries - keep:], values[:, :, entries - keep:]
                positions = positions[:, entries - keep:]
        elif entries > keep:
            state = self._layer_state(module, kwargs, keys, values, positions)
            frozen = self._before[idx] if self._frozen else 0
            scores = self._score(state, positions, keep, frozen)
            share = None
            per_head = keep - self.sinks  # the entries this cut keeps per head besides the sinks (+fade@N, +heads@N)
            if self._question_rows:
                question = state.group(self._attended[2][self._question_rows][..., :entries])
                share = question_share(question, positions, self.sinks, self.question_pool)
                if self.question_carry:
                    carried = self._carried.get(idx)
                    after = fade_at(self.question_pool, per_head) if self.question_fade < 1 else None
                    if carried is not None and after is not None:
                        carried = fade_share(carried, self.question_fade, self._carried_for.get(idx), after)
                    share = carry_share(share, carried)
                spread = lend_at(self.question_pool, per_head)  # +lend:C: heads spread thin take the others' finds
                if spread is not None:
                    share = lend_over_heads(share, positions, spread, max(1, per_head // LEND_TOP))
                weight = heads_at(self.question_pool, per_head)  # +heads: 1, W, or None in this step
                if weight is not None:
                    share = share_over_heads(share, positions, weight)
                last = None if self._steps_left else last_at(self.question_pool, per_head)  # +last
                mix = self.question_weight if last is None else last
                scores = question_mix(scores, question, positions, self.sinks, mix, share=share)
                spans = None if self._steps_left else spans_at(self.question_pool, per_head)  # +spans: the last cut
                if spans is not None:
                    first = spans_over_heads(share, positions, self.sinks, *spans, self.sentence_table)
                    scores = torch.where(first, scores + scores.amax(dim=1, keepdim=True) + 1, scores)
            if self.span is None:
                kept = select_kept(scores, positions, keep, self.sinks, frozen)
            else:
                kept = select_spans(scores, positions, keep, self.sinks, self.span_table, self.span, frozen)
            index = kept[None, :, :, None].expand(1, -1, -1, keys.shape[-1])
            layer.keys = keys.gather(2, index)
            layer.values = values.gather(2, index)
            positions = positions.gather(1, kept)
            if self.question_carry and share is not None:  # in the order the memory now holds its entries
                self._carried[idx] = share.gather(1, kept)
                if self._count_cuts:  # the chunk's entries join at 0 cuts; every kept entry has been through one more
                    since = self._carried_for.get(idx, share.new_zeros(share.shape[0], 0, dtype=torch.int32))
                    self._carried_for[idx] = F.pad(since, (0, entries - since.shape[1])).gather(1, kept) + 1
            else:  # a cut without the question's vote: nothing carried lines up with the new memory
                self._carried.pop(idx, None)
                self._carried_for.pop(idx, None)
            del state
        elif self.question_carry and idx in self._carried:  # no cut: the chunk joins with nothing carried yet
            self._carried[idx] = F.pad(self._carried[idx], (0, entries - self._carried[idx].shape[1]))
            if idx in self._carried_for:
                self._carried_for[idx] = F.pad(self._carried_for[idx], (0, entries - self._carried_for[idx].shape[1]))
        self.positions[idx] = positions
        self._queries = self._attended = None

    def _score(self, state: LayerState, positions: torch.Tensor, keep: int, frozen: int) -> torch.Tensor:
        """The scorer's scores (kv_heads, entries). The leading entries that are kept anyway
        are left out of the scoring when the reference does so (the sinks, under sink scoring
        "strip"; a fixed-incremental memory, always): their scores are 0 (select_kept keeps
        them), and pooling sees the first scored key as the first key."""
        sinks = min(self.sinks, self._read_through)  # the sinks read so far lead every KV head (always kept)
        state.budget = keep - sinks
        skip = max(frozen, sinks if self.fidelity.sink_scoring == "strip" else 0)
        if not skip:
            return self.scorer.score(state)
        part = state.without_leading(skip)
        part.budget = keep - skip
        scores = self.scorer.score(part)
        return torch.cat([scores.new_zeros(scores.shape[0], skip), scores], dim=1)

    def _layer_state(self, module, kwargs, keys, values, positions) -> LayerState:
        """The layer's cache for the scorer: from the attention call that just ran (rotated keys
        and, for attention-based scorers, the column sums of its one pass), or, for a model
        that keeps its own attention (eager), with the queries rebuilt from q_proj's output."""
        rows = self._chunk_positions.shape[1]
        entries = positions.shape[1]
        grouping = self.fidelity.gqa_grouping
        if self._attended is not None:
            query, rotated, sums = self._attended
            state = LayerState(query[0, :, :rows], rotated[0, :, :entries], values[0], positions, module.scaling,
                               module.layer_idx, rows=rows, window=self._window, grouping=grouping,
                               cached_keys=keys[0])
            for first, (lo, hi) in self._scored_rows(rows).items():
                # zero-padded rows before the chunk: in padded attention's sums, else added here
                state.store_sums(first, sums[(lo, hi)], 0 if self.padded else -min(lo, 0))
            return state
        queries = self._layer_queries(module, kwargs) if self.scorer.needs_queries else None
        return LayerState(queries, keys[0], values[0], positions, module.scaling, module.layer_idx, rows=rows,
                          window=self._window, grouping=grouping, cached_keys=keys[0])

    def _scored_rows(self, chunk: int) -> dict[int, tuple[int, int]]:
        """The row range [lo, chunk) the attention sums for each first row the scorer reads;
        with the reference's rows (score rows "last-c"), its default rows are the last c of the
        padded block (lo below 0: zero rows before the chunk count)."""
        return {first: ((chunk - self._window) if self._window is not None and first == 0 else first, chunk)
                for first in self.scorer.attention_rows(chunk)}

    # what memstep/attention.py asks of the engine, layer by layer (StepContext)
    @property
    def padded(self) -> bool:
        return self._padded_run and self._prefilling

    def rotate(self, module, query, key):
        """Compact positions: keys at 0..n-1, the query rows at the last positions (the cache
        holds keys before RoPE). Document positions: the model has rotated them already."""
        if self.rope == "document":
            return query, key
        rows, n = query.shape[2], key.shape[2]
        if self.rope == "shared":
            return self._rotate_shared(module, query, key)
        factor = ntk_factor(n - 1, self._ntk["limit"]) if self.fidelity.ntk == "dynamic" else 1
        cos, sin = self._contiguous_rope(n, key.device, getattr(module, "layer_type", None)) if factor == 1 \
            else self._ntk_rope(n, factor, key.device)
        q, _ = self._rope(query.float(), query[:, :1, :1].float(), cos[:, n - rows:], sin[:, n - rows:])
        k, _ = self._rope(key.float(), key[:, :1, :1].float(), cos, sin)
        return q.to(query.dtype), k.to(key.dtype)

    def _rotate_shared(self, module, query, key):
        """Shared positions (memstep/shared_positions.py): each KV head's keys at their token's rank
        among the tokens the memory holds anywhere, the rows read after the memory right after."""
        if self._held is None:  # once per forward, before any layer of it is cut
            self._held = held_tokens(self.positions)
        memory = self.positions[module.layer_idx].to(key.device)
        positions = shared_positions(self._held, memory, key.shape[2] - memory.shape[1])
        cos, sin = self._contiguous_rope(int(positions.max()) + 1, key.device, getattr(module, "layer_type", None))
        rows = positions[0, -query.shape[2]:]  # every head reads the same rows after the memory
        q, _ = self._rope(query.float(), query[:, :1, :1].float(), cos[:, rows], sin[:, rows])
        k, _ = self._rope(key.float(), key[:, :1, :1].float(), cos[0][positions], sin[0][positions], unsqueeze_dim=0)
        return q.to(query.dtype), k.to(key.dtype)

    def _position_after(self, read: int, entries) -> int:
        """The RoPE position right after the memory: after the ``read`` tokens read (document), after
        the tokens the memory holds anywhere (shared), after the longest layer's ``entries`` (compact)."""
        if self.rope == "document":
            return read
        return len(held_tokens(self.positions)) if self.rope == "shared" else max(entries)

    def score_rows(self, module, rows: int, keys: int) -> tuple[tuple[int, int], ...]:
        """Column sums the scorer will read, when this layer is cut in this step: over the
        chunk's rows from the scorer's first rows, and over the question's rows when the
        step carries the question (question-aware)."""
        question = len(self._question_step)
        chunk = rows - question
        if not self._prefilling or keys - question <= self._keep[module.layer_idx] \
                or self.kinds.sliding(module.layer_idx):
            return ()
        ranges = tuple(self._scored_rows(chunk).values())
        return ranges + (((chunk, rows),) if question else ())

    def score_grouping(self, module) -> str:
        return self.fidelity.gqa_grouping

    def keep(self, module, query, key, sums) -> None:
        if self._prefilling and key.shape[2] - len(self._question_step) > self._keep[module.layer_idx]:
            self._attended = (query, key, sums)

    def window(self, module) -> int | None:
        return self.kinds.window if self.kinds.sliding(module.layer_idx) else None

    def _contiguous_rope(self, n: int, device, layer_type: str | None = None):
        """cos, sin (1, n, dim) in float32 for positions 0..n-1 (one table per layer type, grown on
        demand): models with per-type RoPE (Gemma 3: a local base for sliding layers, a global one
        for full attention) take the layer's type."""
        rotary = self.decoder.rotary_emb
        per_type = hasattr(rotary, "layer_types") and layer_type is not None
        table = self._rope_tables.get(layer_type if per_type else None)
        if table is None or table[0].shape[1] < n:
            have = table[0].shape[1] if table is not None else 0
            x = torch.zeros(1, dtype=torch.float32, device=device)
            positions = torch.arange(max(n, 2 * have), device=device)[None]
            cos, sin = rotary(x, positions, layer_type) if per_type else rotary(x, positions)
            scale = getattr(rotary, f"{layer_type}_attention_scaling" if per_type else "attention_scaling", 1.0) or 1.0
            # the decoder's identity rotation at position 0 already scaled q and k once
            table = self._rope_tables[layer_type if per_type else None] = (cos.float() / scale, sin.float() / scale)
        cos, sin = table
        return cos[:, :n], sin[:, :n]

    def _ntk_rope(self, n: int, factor: int, device):
        """cos, sin (1, n, dim) for positions 0..n-1 with dynamic NTK: the reference's
        base * factor^(dim / (dim - 2)), its float32 frequencies."""
        table = self._ntk_tables.get(factor)
        if table is None or table[0].shape[1] < n:
            dim, base = self._ntk["dim"], self._ntk["base"]
            alpha = base * factor ** (dim / (dim - 2))
            frequencies = 1.0 / (alpha ** (torch.arange(0, dim, 2, device=device) / dim)).float()
            angles = torch.arange(max(n, 2 * (table[0].shape[1] if table else 0)), device=device).float()[:, None] \
                * frequencies[None]
            angles = torch.cat([angles, angles], dim=-1)[None]
            table = self._ntk_tables[factor] = (angles.cos(), angles.sin())
        cos, sin = table
        return cos[:, :n], sin[:, :n]

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
            if self.scorer.needs_queries and not switchable(self.model):  # eager: queries rebuilt
                handles.append(attn.q_proj.register_forward_hook(self._remember_queries))
            handles.append(attn.register_forward_hook(self._after_attention, with_kwargs=True))
        return handles

    @contextlib.contextmanager
    def _attention_context(self):
        """Hand each attention module this engine as its StepContext (memstep/attention.py)."""
        if not switchable(self.model):
            if self.rope != "document":
                raise MemstepError(f"{self.rope} RoPE positions need the model loaded with SDPA attention "
                                   f"(it runs '{self.model.config._attn_implementation}'): use rope 'document'")
            if self.attention == "padded":
                raise MemstepError("padded attention needs the model loaded with SDPA attention")
        attentions = [layer.self_attn for layer in self.decoder.layers]
        for attn in attentions:
            attn.memstep = self
        try:
            with use_memstep_attention(self.model):
                yield
        finally:
            for attn in attentions:
                attn.__dict__.pop("memstep", None)

    # ---- the prefill -------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, position: int, scoring: bool = False) -> torch.Tensor:
        """Run token ids (1, n) after the cache: at RoPE positions position..position+n-1
        (document), or right after each layer's cache (compact: ``position`` only counts).
        ``scoring``: a prefill step (layers are cut; padded attention applies)."""
        n = ids.shape[1]
        if self.rope != "document":  # the identity rotation in the model; memstep's attention rotates
            positions = torch.zeros(1, n, dtype=torch.long, device=self.device)
            self._held = None  # shared: the memory's tokens, read again before this forward's first layer
        else:
            positions = torch.arange(position, position + n, device=self.device)[None]
        self._prefilling = scoring
        try:
            with torch.inference_mode(), self._attention_context():
                out = self.decoder(input_ids=ids.to(self.device), position_ids=positions, use_cache=True,
                                   **{self._cache_kw: self.cache})
        finally:
            self._prefilling = False
        return out.last_hidden_state

    def run(self, input_ids: Sequence[int] | torch.Tensor, schedule: Schedule) -> Iterator[StepRecord]:
        ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
        if ids.numel() != schedule.tokens:
            raise MemstepError(f"the schedule covers {schedule.tokens} tokens but the input has {ids.numel()}")
        self.reset()
        self.scorer.reset()
        if self.span is not None and (self.span_table is None or self.span_table.numel() < ids.numel()):
            if self.span.bounds != "fixed":
                raise MemstepError(f"span setting {self.span.name} needs the text's sentence breaks: run it through "
                                   "DocumentRun (which reads them from the tokenizer)")
            self.span_table = span_table(self.span, [""] * ids.numel(), self.sinks)
        if self.question_ids.numel() and spans_need_text(self.question_pool) and \
                (self.sentence_table is None or self.sentence_table.numel() < ids.numel()):
            raise MemstepError(f"question pool {self.question_pool} shares sentences and needs the text's sentence "
                               "breaks: run it through DocumentRun (which reads them from the tokenizer)")
        if self.sentence_table is not None:  # once per document, not once per layer in the last cut
            self.sentence_table = self.sentence_table.to(self.device)
        # Plain full-attention layers: a config-built cache gives sliding-window models (Mistral)
        # layers that size the mask by tokens seen, which breaks once entries are evicted.
        self.cache = DynamicCache()
        kv_heads, layers = self.shape.kv_heads, len(self.decoder.layers)
        self.positions = [torch.zeros(kv_heads, 0, dtype=torch.long, device=self.device)
                          for _ in self.decoder.layers]
        self._memory = DeviceMemory(self.device)
        scoring = schedule.name != "full"
        self._padded_run = self.attention == "padded" and scoring
        self._frozen = schedule.name == "fim"
        if self.fidelity.score_rows == "last-c" and scoring:
            if "chunk" not in schedule.settings:
                raise MemstepError("score rows 'last-c' count the last c rows of the configured chunk c: a custom "
                                   "schedule has none (use score rows 'chunk')")
            self._window = int(schedule.settings["chunk"])
        lengths = self._layer_lengths(schedule, layers)
        per_layer = schedule.layerwise or self.kinds.hybrid  # records carry each layer's budget and entries
        handles = self._install_hooks()
        try:
            for step, ((before, after), start, size, budget) in enumerate(
                    zip(lengths, schedule.chunk_starts, schedule.chunk_sizes, schedule.memory_sizes)):
                self._before, self._keep = before, after
                self._steps_left = schedule.steps - 1 - step
                self._start_position = self._position_after(start, before)
                self._chunk_positions = torch.arange(start, start + size, device=self.device)[None]
                self._read_through = max(self.tokens_seen, start + size)
                # question-aware: the question's tokens ride after the chunk, their attention scores it
                question = self.question_ids if self.question_ids.numel() and scoring else self.question_ids[:0]
                self._question_step = question.tolist()
                self._question_rows = (size, size + question.numel()) if question.numel() else None
                self._kv_peak = 0
                self._memory.start()
                began = time.perf_counter()
                step_ids = torch.cat([ids[start:start + size], question])[None]
                hidden = self.forward(step_ids, self._start_position, scoring=True)[:, :size]
                self.last_hidden = hidden[:, -1]
                if self.collect_hidden:
                    self.hidden_chunks.append(hidden[0])
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                seconds = time.perf_counter() - began
                heap.trim()  # what this step's tensors freed goes back now: flat memory over 100+ steps
                self.tokens_seen = max(self.tokens_seen, start + size)  # a review re-reads a chunk
                self.position = self._position_after(start + size, after)
                real = [p.shape[1] for p in self.positions]
                if real != list(after):  # the schedule's arithmetic and the cache must agree
                    raise MemstepError(f"step {step}: cache holds {real} entries per layer, expected {after}")
                # the question's tokens are read with the chunk: they count in every step's bytes
                parts = step_bytes(self.shape, before, size + question.numel(), after, attention=self.attention,
                                   scoring=scoring, device=self.device.type)
                yield StepRecord(
                    step=step, steps=schedule.steps, chunk_start=start, chunk_size=size,
                    memory_before=self.kinds.widest_global(before), memory_budget=budget,
                    memory_after=self.kinds.widest_global(after), seconds=seconds,
                    bytes_measured=self._memory.peak(), bytes_modeled=parts.pop("total"),
                    bytes_modeled_parts=parts, kv_bytes_actual=self._kv_peak,
                    kept_positions=_stack_padded(self.positions),
                    evicted=any(b + size > a for b, a, s in zip(before, after, self.kinds.types) if s == GLOBAL),
                    layer_memory_after=list(after) if per_layer else None,
                    layer_budgets=self.kinds.budgets(schedule.layer_budgets(step, layers)) if per_layer else None,
                    kv_bytes_by_type=self.cache_bytes_by_type() if self.kinds.hybrid else None,
                    layer_types=tuple(TYPE_LABELS[t] for t in self.kinds.types) if self.kinds.hybrid else None,
                    first_position=self._start_position, question_tokens=question.numel(),
                    tokens_read=self.tokens_seen if schedule.starts is not None else None,
                )
        finally:
            self._question_step, self._question_rows = [], None
            for handle in handles:
                handle.remove()

    def _layer_lengths(self, schedule: Schedule, layers: int) -> list[tuple[list[int], list[int]]]:
        if schedule.layerwise and len(schedule.layer_memory_sizes[0]) != layers:
            raise MemstepError(f"the layer-wise schedule was made for {len(schedule.layer_memory_sizes[0])} "
                               f"layers but the model has {layers}")
        if schedule.layerwise:
            if not switchable(self.model):
                raise MemstepError("layer-wise budgets need the model loaded with SDPA attention "
                                   f"(it runs '{self.model.config._attn_implementation}')")
            return self.kinds.apply(schedule.layer_cache_lengths(self.sinks), schedule.chunk_sizes)
        return self.kinds.apply([([b] * layers, [a] * layers) for b, a in schedule.cache_lengths(self.sinks)],
                                schedule.chunk_sizes)

    def cache_bytes(self) -> int:
        """Bytes of the real cache tensors now."""
        return sum(l.keys.nbytes + l.values.nbytes for l in self.cache.layers if l.keys is not None)

    def cache_bytes_by_type(self) -> dict[str, int]:
        """Bytes of the real cache tensors now, by layer type ("global", "sliding")."""
        out = {TYPE_LABELS[t]: 0 for t in self.kinds.counts()}
        for layer, kind in zip(self.cache.layers, self.kinds.types):
            if layer.keys is not None:
                out[TYPE_LABELS[kind]] += layer.keys.nbytes + layer.values.nbytes
        return out


def _stack_padded(positions: list[torch.Tensor]) -> np.ndarray:
    """(layers, kv_heads, entries) positions as int32; layers holding fewer entries are padded with -1.
    A run keeps one such array per step for its report (a 128k-token run has 129 of them):
    int32 holds any position (at most 2^30 tokens) in half the bytes of the engine's int64."""
    width = max(p.shape[1] for p in positions)
    stacked = torch.stack([F.pad(p.to(torch.int32), (0, width - p.shape[1]), value=-1) for p in positions])
    return stacked.cpu().numpy()
