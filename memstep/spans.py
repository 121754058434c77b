"""Span-preserving selection: keep whole pieces of the text, not scattered tokens.

A token top-k keeps a word answer's first pieces and drops the rest where the scores dip
inside it; the model then answers with another word. Here the cut ranks *spans* instead:
each entry's score (the scorer's, mixed with the question's when question-aware) is pooled
over its span (max or mean), the spans are taken whole in order of their score while they
fit the step's budget, and only the span at the budget's edge is split (its best tokens
fill what is left, so the cut keeps exactly the budget). Sinks and the first ``frozen``
entries are kept before any span, as in the token cut.

A setting is named ``<bounds>[-<pool>][-<share>]``:
- bounds: ``fixedN`` (pieces of N tokens counted from the first token after the sinks, as
  ChunkKV's fixed-length chunks), ``sentence[N]`` (sentences: a span ends after a token
  that ends in . ! ? or a line break) or ``clause[N]`` (also after , ; :); a sentence or
  clause longer than N tokens (default 48) is split into pieces of at most N;
- pool: ``max`` (a span is as strong as its strongest token; default) or ``mean``;
- share: ``head`` (each KV head ranks spans by its own scores; default), ``layer`` (the
  heads' scores averaged: one set of spans for the whole layer, as ChunkKV keeps one set
  of chunks per layer) or ``any`` (one set for the layer too, each span as strong as the
  head that wants it most: what one head reads, every head keeps).
``none`` is the token top-k.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from memstep.errors import MemstepError

SPAN_NONE = "none"
BOUNDS = ("fixed", "sentence", "clause")
POOLS = ("max", "mean")
SHARES = ("head", "layer", "any")
DEFAULT_CAP = 48  # tokens: the longest sentence or clause span before it is split
MAX_SPAN = 512
SENTENCE_END = re.compile(r"[.!?]['\"”’)\]]*\s*$|\n\s*$")
CLAUSE_END = re.compile(r"[.!?,;:]['\"”’)\]]*\s*$|\n\s*$")
_NAME = re.compile(r"^(fixed|sentence|clause)(\d*)(?:-(max|mean))?(?:-(head|layer|any))?$")


@dataclass(frozen=True)
class SpanSetting:
    bounds: str  # fixed | sentence | clause
    length: int  # fixed: the span's tokens; sentence / clause: the longest span before a split
    pool: str = "max"
    share: str = "head"

    @property
    def name(self) -> str:
        return f"{self.bounds}{self.length}-{self.pool}-{self.share}"


def parse_span(text: str | None) -> SpanSetting | None:
    """The setting named ``text`` (None or "none": the token top-k); one readable line otherwise."""
    if text is None or text.strip().lower() == SPAN_NONE:
        return None
    match = _NAME.match(text.strip().lower())
    if not match:
        raise MemstepError(f"unknown span setting '{text}': name it <bounds>[-max|-mean][-head|-layer|-any] with "
                           "bounds fixedN (N-token pieces, e.g. fixed20), sentence[N] or clause[N] (split past N "
                           f"tokens, default {DEFAULT_CAP}); e.g. fixed20-mean-layer, sentence-max-head; or none")
    bounds, digits, pool, share = match.groups()
    if bounds == "fixed" and not digits:
        raise MemstepError(f"span setting '{text}': a fixed span needs its length in tokens, e.g. fixed20")
    length = int(digits) if digits else DEFAULT_CAP
    if not 1 <= length <= MAX_SPAN:
        raise MemstepError(f"span setting '{text}': the span length must be 1 to {MAX_SPAN} tokens (got {length})")
    return SpanSetting(bounds, length, pool or "max", share or "head")


def check_span_budget(setting: SpanSetting | None, budget: int) -> None:
    """A span longer than the memory budget can never be kept whole: refused, before any model loads."""
    if setting is not None and setting.length > budget:
        raise MemstepError(f"span setting {setting.name}: its spans reach {setting.length} tokens, more than the "
                           f"memory budget M = {budget}: refused (choose spans of at most {budget} tokens)")


def split_notice(setting: SpanSetting | None, smallest_budget: int) -> str | None:
    """What the run says when some step's budget is below the longest span: those steps split spans."""
    if setting is None or setting.length <= smallest_budget:
        return None
    return (f"span setting {setting.name}: steps whose budget is below {setting.length} tokens (the smallest is "
            f"{smallest_budget}) split the span at the budget's edge: its best tokens fill the budget")


def span_table(setting: SpanSetting, token_texts: list[str], sinks: int) -> torch.Tensor:
    """The span id of every position (the sinks: -1), non-decreasing along the document."""
    n = len(token_texts)
    ids = torch.full((n,), -1, dtype=torch.long)
    if setting.bounds == "fixed":
        ids[sinks:] = torch.arange(n - sinks).clamp(min=0) // setting.length
        return ids
    end = SENTENCE_END if setting.bounds == "sentence" else CLAUSE_END
    span, run = 0, 0
    for i in range(sinks, n):
        ids[i] = span
        run += 1
        if run >= setting.length or end.search(token_texts[i]):
            span, run = span + 1, 0
    return ids


def token_texts(tokenizer, ids) -> list[str]:
    """Each token's text (decoded one id at a time, each distinct id once)."""
    ids = [int(i) for i in ids]
    text = {i: tokenizer.decode([i]) for i in set(ids)}
    return [text[i] for i in ids]


def span_scores(scores: torch.Tensor, spans: torch.Tensor, pool: str, per_span: bool = False) -> torch.Tensor:
    """The score of each span among the entries present: the max or mean of the entries'
    scores over each (KV head, span) group. scores, spans: (kv_heads, entries). Per entry
    (its span's score), or with ``per_span`` per span id from the lowest present: (kv_heads, spans)."""
    local = spans - spans.min()
    width = int(local.max()) + 1
    pooled = torch.zeros((scores.shape[0], width), dtype=scores.dtype, device=scores.device)
    pooled = pooled.scatter_reduce(1, local, scores, reduce="amax" if pool == "max" else "mean",
                                   include_self=False)
    return pooled if per_span else pooled.gather(1, local)


def select_spans(scores: torch.Tensor, positions: torch.Tensor, keep: int, sinks: int, table: torch.Tensor,
                 setting: SpanSetting, frozen: int = 0) -> torch.Tensor:
    """Indices (kv_heads, keep) of the entries to keep, in cache order: the sinks and the first
    ``frozen`` entries, then whole spans in order of their pooled score while they fit, then
    the best tokens of the next span for what is left (the one span the cut splits)."""
    scores = scores.float().nan_to_num(nan=0.0, posinf=torch.finfo(torch.float32).max,
                                       neginf=-torch.finfo(torch.float32).max)
    if setting.share == "layer":  # one ranking for the layer: every head keeps the same spans
        scores = scores.mean(dim=0, keepdim=True).expand_as(scores)
    elif setting.share == "any":  # one ranking for the layer, by the head that scores an entry highest
        scores = scores.amax(dim=0, keepdim=True).expand_as(scores)
    heads, n = scores.shape
    protected = positions < sinks
    if frozen:
        protected[:, :frozen] = True
    spans = table.to(positions.device)[positions.clamp(min=0, max=table.numel() - 1)]
    spans = torch.where(protected, -1, spans)  # kept anyway: a span of their own, ranked first
    local = spans - spans.min()
    width = int(local.max()) + 1
    sizes = torch.zeros(heads, width, dtype=torch.long, device=scores.device).scatter_add_(
        1, local, torch.ones_like(local))
    level = span_scores(scores, spans, setting.pool, per_span=True)  # (heads, width)
    level = torch.where(sizes > 0, level, float("-inf"))  # spans with no entry here come last
    if bool(protected.any()):
        level[:, 0] = float("inf")
    order = torch.argsort(level, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(width, device=order.device).expand(heads, -1))
    # whole spans while their sizes fit: the rest of the budget goes to the next span's best tokens
    token = torch.argsort(torch.argsort(scores, dim=1, descending=True, stable=True), dim=1)
    priority = -rank.gather(1, local).float() + 0.5 * (1.0 - token.float() / n)
    priority = torch.where(protected, float("inf"), priority)
    kept = torch.topk(priority, keep, dim=-1, sorted=False).indices
    return kept.sort(dim=-1).values


def kept_whole(kept_positions, table: torch.Tensor, sinks: int) -> dict:
    """Per (layer, KV head) of a finished run: how many spans the memory holds whole and how
    many in part (a span is counted where any of its tokens is held; -1 pads a layer)."""
    import numpy as np

    table_np = table.cpu().numpy()
    sizes = np.bincount(table_np[table_np >= 0])
    whole, partial = [], []
    for layer in kept_positions:
        row_whole, row_part = [], []
        for head in layer:
            held = head[(head >= sinks) & (head < len(table_np))]
            counts = np.bincount(table_np[held], minlength=len(sizes)) if len(held) else np.zeros(len(sizes), int)
            present = counts > 0
            full = present & (counts == sizes)
            row_whole.append(int(full.sum()))
            row_part.append(int((present & ~full).sum()))
        whole.append(row_whole)
        partial.append(row_part)
    return {"whole": whole, "partial": partial}
