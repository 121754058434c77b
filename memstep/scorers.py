"""Token-importance scorers: which cache entries a layer keeps when it is cut to budget.

Each scorer is a small dataclass with one ``score(layer)`` method returning a
(kv_heads, keys) float tensor, higher = keep. Selection (sinks protected, top-k per KV
head, document order) lives once, in ``select_kept``. Scorers that need attention
compute the query-key products of the one layer they score, in blocks of query rows,
so SDPA can run the model and no more than one layer's scores exist at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from memstep.errors import MemstepError
from memstep.memory import QUERY_BLOCK


@dataclass
class LayerState:
    """One layer's cache right after its attention ran on the current chunk.

    queries: (heads, chunk, head_dim) after RoPE; keys, values: (kv_heads, keys, head_dim)
    (memory entries first, then the chunk); positions: (kv_heads, keys) document positions.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    scaling: float
    layer: int = 0
    rows: int | None = None  # the chunk's query rows, when the queries are not kept (one-pass sums)
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def chunk_size(self) -> int:
        return self.rows if self.rows is not None else self.queries.shape[1]

    @property
    def memory_size(self) -> int:
        return self.keys.shape[1] - self.chunk_size

    def attention_sum(self, first_row: int = 0) -> torch.Tensor:
        """Attention each key receives, summed over the chunk's query rows from ``first_row``
        on and over the query heads of its GQA group: (kv_heads, keys), float32."""
        if first_row in self._memo:
            return self._memo[first_row]
        kv_heads, n_keys, dim = self.keys.shape
        heads, rows, _ = self.queries.shape
        device, memory = self.keys.device, self.memory_size
        # scale the queries, not the (much larger) logits
        q = (self.queries.float() * self.scaling).view(kv_heads, heads // kv_heads, rows, dim)
        k = self.keys.float().unsqueeze(1).transpose(-1, -2)  # (kv_heads, 1, dim, keys)
        chunk_index = torch.arange(rows, device=device)
        total = torch.zeros(kv_heads, n_keys, dtype=torch.float32, device=device)
        for start in range(first_row, rows, QUERY_BLOCK):
            stop = min(start + QUERY_BLOCK, rows)
            visible = memory + stop  # keys after the block's last row are hidden from all its rows
            logits = torch.matmul(q[:, :, start:stop], k[..., :visible])
            # causal: chunk row j sees the memory and chunk keys up to itself, so only the
            # block's own (rows x rows) square of chunk keys needs a mask
            future = chunk_index[None, start:stop] > chunk_index[start:stop, None]
            logits[..., memory + start:].masked_fill_(future, float("-inf"))
            total[:, :visible] += torch.softmax(logits, dim=-1).sum(dim=(1, 2))
            del logits
        self._memo[first_row] = total
        return total

    def visible_queries(self, first_row: int = 0) -> torch.Tensor:
        """How many query rows (from ``first_row`` on) see each key: (keys,)."""
        rows = self.chunk_size
        idx = torch.arange(self.keys.shape[1], device=self.keys.device)
        seen_from = (idx - self.memory_size).clamp(min=first_row)
        return (rows - seen_from).clamp(min=0).float()


@dataclass
class Scorer:
    """Base: subclasses set ``name`` and implement ``score``."""

    name: ClassVar[str] = ""
    needs_queries: ClassVar[bool] = True

    def reset(self) -> None:
        """Called at the start of every run (seeded scorers restart their stream)."""

    def attention_rows(self, chunk: int) -> tuple[int, ...]:
        """First query rows of the column sums ``score`` reads (``LayerState.attention_sum``):
        the attention pass computes them in the same pass (memstep/attention.py)."""
        return (0,) if self.needs_queries else ()

    def score(self, layer: LayerState) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class ChunkAttention(Scorer):
    """The paper's score ("Memorize Step by Step", EMNLP 2024): attention a key receives
    summed over the chunk's queries, divided by how many of those queries can see it."""

    name: ClassVar[str] = "chunk-attention"

    def score(self, layer: LayerState) -> torch.Tensor:
        return layer.attention_sum() / layer.visible_queries().clamp(min=1)


@dataclass
class Conv(Scorer):
    """The reference code's pooled score (``conv`` in "Memorize Step by Step"): the attention
    each key receives summed over the chunk's queries, average-pooled over ``kernel``
    neighbouring keys (zero padding counted, as avg_pool1d does by default), then divided by
    how many of the chunk's queries see the key."""

    name: ClassVar[str] = "conv"
    kernel: int = 5

    def score(self, layer: LayerState) -> torch.Tensor:
        pooled = pool_keys(layer.attention_sum(), self.kernel, count_padding=True)
        return pooled / layer.visible_queries().clamp(min=1)


def pool_keys(scores: torch.Tensor, kernel: int, count_padding: bool) -> torch.Tensor:
    """Average of each key's score with its ``kernel`` neighbours (kernel odd: centred)."""
    if kernel <= 1:
        return scores
    return F.avg_pool1d(scores[:, None], kernel, stride=1, padding=kernel // 2,
                        count_include_pad=count_padding)[:, 0, :scores.shape[1]]


@dataclass
class SnapKV(Scorer):
    """SnapKV (Li et al., 2024): attention from the chunk's last ``window`` queries,
    average-pooled over neighbouring keys (``kernel``); the window itself is kept."""

    name: ClassVar[str] = "snapkv"
    window: int = 32
    kernel: int = 5

    def attention_rows(self, chunk: int) -> tuple[int, ...]:
        return (chunk - min(self.window, chunk),)

    def score(self, layer: LayerState) -> torch.Tensor:
        window = min(self.window, layer.chunk_size)
        first = layer.chunk_size - window
        scores = pool_keys(layer.attention_sum(first) / window, self.kernel, count_padding=False)
        # the window outranks every other key, its most recent entries first: finite scores, so
        # select_kept can still put the sinks above it when the window exceeds the budget
        ramp = torch.arange(1, window + 1, dtype=scores.dtype, device=scores.device)
        scores[:, scores.shape[1] - window:] = scores.max() + ramp
        return scores


@dataclass
class VATP(Scorer):
    """Value-aware token pruning (Guo et al., 2024): the chunk-attention score times the
    L1 norm of the token's value vector, per KV head."""

    name: ClassVar[str] = "vatp"

    def score(self, layer: LayerState) -> torch.Tensor:
        attention = layer.attention_sum() / layer.visible_queries().clamp(min=1)
        return attention * layer.values.float().abs().sum(dim=-1)


@dataclass
class KeyNorm(Scorer):
    """Knorm (Devoto et al., 2024): keys with a low L2 norm draw attention; keep those."""

    name: ClassVar[str] = "knorm"
    needs_queries: ClassVar[bool] = False

    def score(self, layer: LayerState) -> torch.Tensor:
        return -layer.keys.float().norm(dim=-1)


@dataclass
class Recency(Scorer):
    """StreamingLLM (Xiao et al., 2024): the sinks plus the most recent tokens."""

    name: ClassVar[str] = "recency"
    needs_queries: ClassVar[bool] = False

    def score(self, layer: LayerState) -> torch.Tensor:
        return layer.positions.float()


@dataclass
class RandomScorer(Scorer):
    """Uniformly random scores from a seeded stream: the floor any scorer must beat."""

    name: ClassVar[str] = "random"
    needs_queries: ClassVar[bool] = False
    seed: int = 0
    _generator: torch.Generator | None = field(default=None, repr=False)

    def reset(self) -> None:
        self._generator = torch.Generator().manual_seed(self.seed)

    def score(self, layer: LayerState) -> torch.Tensor:
        if self._generator is None:
            self.reset()
        return torch.rand(layer.positions.shape, generator=self._generator).to(layer.keys.device)


SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls for cls in (ChunkAttention, Conv, SnapKV, VATP, KeyNorm, Recency, RandomScorer)
}


def make_scorer(name: str, seed: int = 0, window: int = 32, kernel: int = 5) -> Scorer:
    if name not in SCORERS:
        raise MemstepError(f"unknown scorer '{name}': choose one of {', '.join(SCORERS)}")
    if name == "random":
        return RandomScorer(seed=seed)
    if name == "conv":
        if not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0 or kernel > 255:
            raise MemstepError(f"the conv kernel must be an odd number of keys from 1 to 255 (got {kernel})")
        return Conv(kernel=kernel)
    if name == "snapkv":
        if window < 1:
            raise MemstepError(f"the SnapKV window must be at least 1 token (got {window})")
        return SnapKV(window=window)
    return SCORERS[name]()


def select_kept(scores: torch.Tensor, positions: torch.Tensor, keep: int, sinks: int) -> torch.Tensor:
    """Indices (kv_heads, keep) of the entries to keep per KV head: the sink positions
    always, then the highest scores; returned in document order."""
    # +inf from a scorer must not tie with the sinks (topk breaks ties arbitrarily)
    scores = scores.float().nan_to_num(nan=0.0, posinf=torch.finfo(torch.float32).max)
    scores = scores.masked_fill(positions < sinks, float("inf"))
    kept = torch.topk(scores, keep, dim=-1, sorted=False).indices
    return kept.sort(dim=-1).values
