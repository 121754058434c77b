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

    The reference code's ways, when asked: ``window`` = c counts the last c rows of the query
    block zero-padded to memory + chunk (zero rows attend uniformly to the keys up to
    themselves) instead of the chunk's own rows; ``grouping`` "strided" sums query heads
    j, j + kv_heads, ... into KV head j instead of the heads that attend through it.
    ``without_leading(n)`` is the same state without its first n entries (the sinks taken out
    before scoring): every statistic still comes from the whole attention, then is cut.
    """

    queries: torch.Tensor | None
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    scaling: float
    layer: int = 0
    rows: int | None = None  # the chunk's query rows, when the queries are not kept (one-pass sums)
    window: int | None = None  # score rows "last-c": the configured chunk c
    grouping: str = "model"
    cached_keys: torch.Tensor | None = None  # keys as the cache holds them (compact positions: before RoPE)
    budget: int | None = None  # entries the cut keeps among these (set by the engine)
    _memo: dict = field(default_factory=dict, repr=False)
    _parent: tuple | None = field(default=None, repr=False)  # (whole state, leading entries left out)

    @property
    def chunk_size(self) -> int:
        return self.rows if self.rows is not None else self.queries.shape[1]

    @property
    def memory_size(self) -> int:
        return self.keys.shape[1] - self.chunk_size

    @property
    def heads(self) -> int:
        return self.queries.shape[0] if self.queries is not None else self.keys.shape[0]

    def without_leading(self, count: int) -> LayerState:
        """This state without its first ``count`` entries (statistics cut from the whole's)."""
        part = LayerState(self.queries, self.keys[:, count:], self.values[:, count:], self.positions[:, count:],
                          self.scaling, self.layer, self.chunk_size, self.window, self.grouping,
                          None if self.cached_keys is None else self.cached_keys[:, count:])
        part._parent = (self, count)
        return part

    def first_scored_row(self, first_row: int = 0) -> int:
        """The first chunk row counted: negative when zero-padded rows before the chunk count."""
        if self.window is not None and first_row == 0:
            return self.chunk_size - self.window
        return first_row

    def attention_sum(self, first_row: int = 0) -> torch.Tensor:
        """Attention each key receives, summed over the chunk's query rows from ``first_row``
        on (with ``window``: the last c rows of the padded block) and over the query heads
        grouped into its KV head: (kv_heads, keys), float32."""
        if self._parent is not None:
            whole, count = self._parent
            return whole.attention_sum(first_row)[:, count:]
        if first_row not in self._memo:
            lo = self.first_scored_row(first_row)
            self.store_sums(first_row, self._row_sums(max(lo, 0), per_head=self.grouping != "model"), -min(lo, 0))
        return self._memo[first_row]

    def store_sums(self, first_row: int, sums: torch.Tensor, zero_rows: int = 0) -> None:
        """Keep column sums computed elsewhere (memstep's attention pass): (kv_heads, keys)
        grouped, or (kv_heads, groups, keys) per query head; plus ``zero_rows`` zero-padded
        rows right before the chunk, computed here."""
        total = self.group(sums[..., :self.keys.shape[1]])
        if zero_rows:
            total = total + self._zero_rows(zero_rows)
        self._memo[first_row] = total

    def group(self, sums: torch.Tensor) -> torch.Tensor:
        """Per-query-head sums (kv_heads, groups, keys) into KV heads, by ``grouping``."""
        if sums.dim() == 2:
            return sums
        return self.group_heads(sums.reshape(-1, sums.shape[-1]))

    def group_heads(self, per_head: torch.Tensor) -> torch.Tensor:
        """(heads, ...) in the model's head order into (kv_heads, ...): the heads that attend
        through each KV head, or (``grouping`` strided) heads j, j + kv_heads, ... as the
        reference's view(groups, kv_heads) does."""
        kv_heads = self.keys.shape[0]
        groups = per_head.shape[0] // kv_heads
        if self.grouping == "strided":
            return per_head.reshape(groups, kv_heads, *per_head.shape[1:]).sum(dim=0)
        return per_head.reshape(kv_heads, groups, *per_head.shape[1:]).sum(dim=1)

    def _zero_rows(self, count: int, power: int = 1) -> torch.Tensor:
        """What ``count`` zero query rows right before the chunk add to each key (every KV head):
        a zero row r attends 1/(r + 1) to each key up to itself, in each of the group's heads."""
        n = self.keys.shape[1]
        end = n - self.chunk_size
        start = max(end - count, 0)
        groups = self.heads // self.keys.shape[0]
        share = (groups / torch.arange(start + 1, end + 1, dtype=torch.float64)) ** power
        tail = share.flip(0).cumsum(0).flip(0)  # the rows from each one on
        out = torch.zeros(n, dtype=torch.float64)
        out[start:end] = tail
        out[:start] = tail[0] if len(tail) else 0.0
        return out.to(torch.float32).to(self.keys.device)

    def _row_sums(self, lo: int, per_head: bool, square: bool = False) -> torch.Tensor:
        """Column sums over the chunk's rows from ``lo``, recomputed from the queries: per KV
        head (kv_heads, keys), or per query head (kv_heads, groups, keys); ``square``: the
        square of the group's sum (heads grouped as ``grouping``) for each row, summed."""
        kv_heads, n_keys, dim = self.keys.shape
        heads, rows, _ = self.queries.shape
        groups = heads // kv_heads
        device, memory = self.keys.device, self.memory_size
        # scale the queries, not the (much larger) logits
        q = (self.queries.float() * self.scaling).view(kv_heads, groups, rows, dim)
        k = self.keys.float().unsqueeze(1).transpose(-1, -2)  # (kv_heads, 1, dim, keys)
        chunk_index = torch.arange(rows, device=device)
        total = torch.zeros((kv_heads, groups, n_keys) if per_head and not square else (kv_heads, n_keys),
                            dtype=torch.float32, device=device)
        for start in range(lo, rows, QUERY_BLOCK):
            stop = min(start + QUERY_BLOCK, rows)
            visible = memory + stop  # keys after the block's last row are hidden from all its rows
            logits = torch.matmul(q[:, :, start:stop], k[..., :visible])
            # causal: chunk row j sees the memory and chunk keys up to itself, so only the
            # block's own (rows x rows) square of chunk keys needs a mask
            future = chunk_index[None, start:stop] > chunk_index[start:stop, None]
            logits[..., memory + start:].masked_fill_(future, float("-inf"))
            probabilities = torch.softmax(logits, dim=-1)
            del logits
            if square:
                grouped = self.group_heads(probabilities.reshape(heads, stop - start, visible))
                total[:, :visible] += grouped.pow(2).sum(dim=1)
            elif per_head:
                total[..., :visible] += probabilities.sum(dim=2)
            else:
                total[:, :visible] += probabilities.sum(dim=(1, 2))
        return total

    def attention_square_sum(self) -> torch.Tensor:
        """Per key: the square of the attention it receives from a KV head's grouped query
        heads, summed over the counted rows (as ``attention_sum()``): (kv_heads, keys)."""
        if self._parent is not None:
            whole, count = self._parent
            return whole.attention_square_sum()[:, count:]
        if "square" not in self._memo:
            lo = self.first_scored_row(0)
            total = self._row_sums(max(lo, 0), per_head=False, square=True)
            if lo < 0:
                total = total + self._zero_rows(-lo, power=2)
            self._memo["square"] = total
        return self._memo["square"]

    def visible_queries(self, first_row: int = 0) -> torch.Tensor:
        """How many counted query rows (from ``first_row`` on; with ``window``: the last c
        rows of the padded block) see each key: (keys,)."""
        if self._parent is not None:
            whole, count = self._parent
            return whole.visible_queries(first_row)[count:]
        n = self.keys.shape[1]
        idx = torch.arange(n, device=self.keys.device)
        if self.window is not None and first_row == 0:  # rows max(n - c, 0) .. n - 1 of the padded block
            return (n - idx.clamp(min=max(n - self.window, 0))).float()
        rows = self.chunk_size
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


@dataclass
class SharedRandom(RandomScorer):
    """The reference code's ``random`` pruner: one seeded draw per layer and step, the same
    entries for every KV head (``random`` draws each KV head's own)."""

    name: ClassVar[str] = "random-shared"

    def score(self, layer: LayerState) -> torch.Tensor:
        if self._generator is None:
            self.reset()
        draw = torch.rand(layer.positions.shape[1], generator=self._generator)
        return draw.expand(layer.positions.shape[0], -1).to(layer.keys.device)


@dataclass
class ChunkPrefix(Scorer):
    """The reference code's ``chunk_prefix`` pruner: the oldest entries (right after the sinks)
    stay, whatever comes later. (Its get_indices lacks the argument its caller passes and
    raises a TypeError as written; this is what its three lines keep.)"""

    name: ClassVar[str] = "chunk-prefix"
    needs_queries: ClassVar[bool] = False

    def score(self, layer: LayerState) -> torch.Tensor:
        kv_heads, n = layer.positions.shape
        return -torch.arange(n, dtype=torch.float32, device=layer.keys.device).expand(kv_heads, -1)


@dataclass
class RoCo(Scorer):
    """RoCo (Ren & Zhu, 2024) as the reference code runs it (``roco``): the chunk-attention
    score, except that the budget // 2 keys of lowest deviation sqrt(S / n_k - score_k^2) score
    0 first, n_k the rows that see key k. The reference's S is one number, the squared
    (grouped) attention summed over every KV head, counted row and key (a torch.sum without a
    dimension), not each key's own sum of squares: memstep keeps it as written."""

    name: ClassVar[str] = "roco"

    def score(self, layer: LayerState) -> torch.Tensor:
        seen = layer.visible_queries().clamp(min=1)
        important = layer.attention_sum() / seen
        deviation = torch.sqrt(layer.attention_square_sum().sum() / seen - important ** 2)
        drop = min(max(layer.budget or 0, 0) // 2, deviation.shape[-1])
        lowest = torch.topk(deviation, drop, dim=-1, largest=False).indices
        return important.scatter(-1, lowest, 0.0)


@dataclass
class RandomQuery(Scorer):
    """The reference code's ``random_query`` pruner: ``queries`` random query vectors (standard
    normal, drawn once per run from ``seed``) attend to the keys as the cache holds them
    (before RoPE under compact positions); a key scores the attention they pay it, summed over
    them, per KV head."""

    name: ClassVar[str] = "random-query"
    needs_queries: ClassVar[bool] = False
    seed: int = 0
    queries: int = 128
    _query: torch.Tensor | None = field(default=None, repr=False)

    def reset(self) -> None:
        self._query = None

    def score(self, layer: LayerState) -> torch.Tensor:
        keys = (layer.cached_keys if layer.cached_keys is not None else layer.keys).float()
        kv_heads, _, dim = keys.shape
        if self._query is None or self._query.shape[1:] != (kv_heads, dim):
            generator = torch.Generator().manual_seed(self.seed)
            self._query = torch.randn(self.queries, kv_heads, dim, generator=generator)
        query = self._query.to(keys.device)
        logits = torch.einsum("qhd,hsd->qhs", query, keys) / dim ** 0.5
        return torch.softmax(logits, dim=-1).sum(dim=0)


SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls for cls in (ChunkAttention, Conv, SnapKV, VATP, KeyNorm, Recency, RandomScorer, SharedRandom,
                              RoCo, ChunkPrefix, RandomQuery)
}


def make_scorer(name: str, seed: int = 0, window: int = 32, kernel: int = 5) -> Scorer:
    if name not in SCORERS:
        raise MemstepError(f"unknown scorer '{name}': choose one of {', '.join(SCORERS)}")
    if name in ("random", "random-shared", "random-query"):
        return SCORERS[name](seed=seed)
    if name == "conv":
        if not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0 or kernel > 255:
            raise MemstepError(f"the conv kernel must be an odd number of keys from 1 to 255 (got {kernel})")
        return Conv(kernel=kernel)
    if name == "snapkv":
        if window < 1:
            raise MemstepError(f"the SnapKV window must be at least 1 token (got {window})")
        return SnapKV(window=window)
    return SCORERS[name]()


def select_kept(scores: torch.Tensor, positions: torch.Tensor, keep: int, sinks: int,
                frozen: int = 0) -> torch.Tensor:
    """Indices (kv_heads, keep) of the entries to keep per KV head: the sink positions and
    the first ``frozen`` entries (a fixed-incremental memory) always, then the highest
    scores; returned in cache order (document order, the sinks first)."""
    # +inf from a scorer must not tie with the sinks (topk breaks ties arbitrarily)
    scores = scores.float().nan_to_num(nan=0.0, posinf=torch.finfo(torch.float32).max)
    scores = scores.masked_fill(positions < sinks, float("inf"))
    if frozen:
        scores[:, :frozen] = float("inf")
    kept = torch.topk(scores, keep, dim=-1, sorted=False).indices
    return kept.sort(dim=-1).values
