"""memstep's attention function, registered with transformers' attention interface.

A chunk attends to the memory and to itself: query row i of a chunk of q rows sees the
first k - q + i + 1 of the layer's k keys, a causal mask aligned to the lower right. The
function derives that from the shapes of each layer's own keys instead of taking one mask
built for layer 0, so layers may hold different numbers of entries (layer-wise budgets),
and transformers builds no chunk x keys mask. GQA runs natively (no repeated KV heads).

Three ways to compute it, chosen per layer and step by the engine (``module.memstep``, a
``StepContext``):
- plain, when no scores are needed (no eviction in this layer and step, or a scorer that
  reads no attention): on CPU two calls of the flash kernel behind SDPA, the memory part
  (nothing hidden) and the chunk's causal square, merged by their log-sum-exp, so the hidden
  half of the square is never computed; elsewhere SDPA with a lower-right causal bias;
- one pass: when the layer is about to be cut by an attention-based scorer, each block
  of query rows computes its logits once, and from the same probabilities both the output
  and each key's column sums (what the scorers need): the query-key product is not
  computed a second time by the scorer;
- padded: the reference code's way: the queries padded with zero rows to memory + chunk and
  the full (memory + chunk)^2 maps materialized; its column sums may count the zero rows
  (a row range that starts before the chunk) and group the query heads as the reference does.

``use_memstep_attention(model)`` switches a model that runs SDPA to it for the span of a
with-block; a model loaded with another implementation (eager, to read attention maps)
keeps it, and then every layer must hold the same number of entries.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from memstep.memory import ONE_PASS_BLOCKS, QUERY_BLOCK

NAME = "memstep"

try:  # torch >= 2.3: a lower-right causal bias that SDPA understands without a materialized mask
    from torch.nn.attention.bias import causal_lower_right
except ImportError:  # pragma: no cover - older torch: an explicit boolean mask
    causal_lower_right = None

# The CPU flash kernel behind SDPA, called directly because it also returns each row's
# log-sum-exp, which lets two attention calls be merged exactly (split_lower_right).
_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
FLASH_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class StepContext:
    """What the engine tells the attention of one layer in one step (attribute ``memstep``
    of the attention module). The defaults: plain attention, no scores."""

    padded = False

    def rotate(self, module, query, key):
        """Queries and keys as attention must see them (compact positions rotate here)."""
        return query, key

    def score_rows(self, module, rows: int, keys: int) -> tuple[tuple[int, int], ...]:
        """Ranges [start, stop) of query rows whose column sums are wanted (empty: none). A
        negative start counts zero-padded rows before the chunk (padded attention only; the
        other ways sum the chunk's rows from 0 and the engine adds the rest)."""
        return ()

    def score_grouping(self, module) -> str:
        """How query heads are summed into KV heads: "model" (the heads that attend through
        it) or "strided" (heads j, j + kv_heads, ...: the one pass then returns per-head sums)."""
        return "model"

    def keep(self, module, query, key, sums: dict[tuple[int, int], torch.Tensor]) -> None:
        """Receives the rotated queries and keys, and the column sums by row range."""


def lower_right_mask(rows: int, keys: int, device, prefer_bias: bool = True):
    """Row i sees keys 0 .. keys - rows + i: a CausalBias where torch has one, else a boolean mask."""
    if prefer_bias and causal_lower_right is not None:
        return causal_lower_right(rows, keys)
    return torch.ones(rows, keys, dtype=torch.bool, device=device).tril(keys - rows)


def split_lower_right(query, key, value, scaling):
    """Lower-right causal attention as two calls of the CPU flash kernel, merged by their
    log-sum-exp: the chunk's rows over the memory (all visible, no mask) and over the chunk's
    own keys (top-left causal, which the kernel computes without the hidden half). SDPA with a
    lower-right bias on CPU instead materializes the rows x keys mask and computes the whole
    rectangle: about 12% more attention work at c = 512 than one causal forward (measured).
    None where the kernel is missing or refuses the inputs (the caller takes SDPA)."""
    if _flash_cpu is None or query.device.type != "cpu" or query.dtype not in FLASH_CPU_DTYPES:
        return None
    batch, heads, rows, dim = query.shape
    kv_heads, memory = key.shape[1], key.shape[2] - rows
    try:
        # over the memory every row is independent: the rows of a KV group's query heads run as
        # one longer query (the kernel takes bigger blocks of rows from 768 on: faster)
        folded = query.reshape(batch, kv_heads, heads // kv_heads * rows, dim)
        past, past_lse = _flash_cpu(folded, key[:, :, :memory], value[:, :, :memory], 0.0, False, scale=scaling)
        past, past_lse = past.reshape(batch, heads, rows, dim), past_lse.reshape(batch, heads, rows)
        own, own_lse = _flash_cpu(query, key[:, :, memory:], value[:, :, memory:], 0.0, True, scale=scaling)
    except (RuntimeError, TypeError):
        return None
    # the memory's share of each row's probability mass: exp(past) / (exp(past) + exp(own))
    share = torch.sigmoid(past_lse - own_lse)[..., None]  # (batch, heads, rows, 1), float32
    return torch.lerp(own.float(), past.float(), share).to(query.dtype)


def sdpa_lower_right(query, key, value, scaling, prefer_bias: bool = True):
    """(batch, heads, rows, dim) output of causal attention aligned to the lower right, with
    native GQA: on CPU the split flash calls, elsewhere SDPA with a lower-right causal bias
    (CUDA runs it without a mask), falling back to an explicit mask and repeated KV heads
    where the backend lacks either."""
    rows, keys = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    if rows == keys:
        return F.scaled_dot_product_attention(query, key, value, is_causal=rows > 1, scale=scaling, enable_gqa=gqa)
    if rows > 1 and prefer_bias:
        out = split_lower_right(query, key, value, scaling)
        if out is not None:
            return out
    mask = None if rows == 1 else lower_right_mask(rows, keys, query.device, prefer_bias)
    try:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    except (RuntimeError, TypeError):  # a backend without the bias or native GQA: the plain way
        mask = None if rows == 1 else lower_right_mask(rows, keys, query.device, prefer_bias=False)
        if gqa:
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)


def one_pass_attention(query, key, value, scaling: float, ranges=((0, None),), block: int | None = None,
                       per_head: bool = False):
    """Attention output and column sums in one pass over blocks of query rows.

    query (1, heads, rows, dim), key/value (1, kv_heads, keys, dim), the query rows' own keys
    last. Returns the output (1, heads, rows, dim) in the query's dtype and, for each row
    range (start, stop) in ``ranges`` (stop None: the last row; a negative start counts from
    row 0), the attention each key receives summed over those rows and over the query heads
    of its KV group: (kv_heads, keys), float32, keyed by the range as given (``per_head``:
    not summed over the group, (kv_heads, groups, keys)). Logits, softmax and sums are
    float32 (bf16 inputs are accumulated in float32); one block of logits exists at a time."""
    _, heads, rows, dim = query.shape
    kv_heads, n = key.shape[1], key.shape[2]
    groups, memory = heads // kv_heads, n - rows
    block = block or ONE_PASS_BLOCKS.get(query.device.type, QUERY_BLOCK)  # the memory model counts it
    q = (query[0].float() * scaling).view(kv_heads, groups, rows, dim)  # scale the queries, not the logits
    k, v = key[0].float(), value[0].float()  # (kv_heads, keys, dim)
    out = torch.empty(kv_heads, groups, rows, dim, dtype=torch.float32, device=query.device)
    shape, summed = ((kv_heads, groups, n), (2,)) if per_head else ((kv_heads, n), (1, 2))
    sums = {r: torch.zeros(shape, dtype=torch.float32, device=query.device) for r in ranges}
    index = torch.arange(rows, device=query.device)
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        width, visible = stop - start, memory + stop  # keys after the block's last row are hidden from all its rows
        # a KV group's query heads as one matrix of rows: one GEMM per KV head, no repeated keys
        rows_q = q[:, :, start:stop].reshape(kv_heads, groups * width, dim)
        logits = torch.matmul(rows_q, k[:, :visible].transpose(-1, -2)).view(kv_heads, groups, width, visible)
        # causal: only the block's own square of chunk keys needs a mask
        logits[..., memory + start:].masked_fill_(index[None, start:stop] > index[start:stop, None], float("-inf"))
        probabilities = torch.softmax(logits, dim=-1)
        del logits
        out[:, :, start:stop] = torch.matmul(probabilities.view(kv_heads, groups * width, visible),
                                             v[:, :visible]).view(kv_heads, groups, width, dim)
        for (lo, hi), total in sums.items():
            lo, hi = max(lo - start, 0), min((rows if hi is None else hi) - start, width)
            if lo < hi:
                total[..., :visible] += probabilities[:, :, lo:hi].sum(dim=summed)
        del probabilities
    return out.view(1, heads, rows, dim).to(query.dtype), sums


def padded_attention(query, key, value, scaling: float, ranges=((0, None),), grouping: str | None = None):
    """The reference code's attention: the chunk's queries padded with zero rows to memory +
    chunk, the full (memory + chunk)^2 maps materialized (the model's dtype, softmax in
    float32 as eager attention does), the chunk's rows returned. Column sums as
    ``one_pass_attention``; a range may start before the chunk (negative: the zero rows
    count, as the reference's last c rows do). ``grouping`` ("model" or "strided"): the query
    heads summed into KV heads first, then the rows, the reference's order of sums."""
    _, heads, rows, dim = query.shape
    kv_heads, n = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    padded = query.new_zeros(1, heads, n, dim)
    padded[:, :, n - rows:] = query
    keys = key.repeat_interleave(groups, 1)
    values = value.repeat_interleave(groups, 1)
    logits = torch.matmul(padded, keys.transpose(-1, -2)) * scaling
    causal = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
    logits = logits.masked_fill(~causal, float("-inf"))
    probabilities = torch.softmax(logits.float(), dim=-1).to(query.dtype)
    del logits
    out = torch.matmul(probabilities, values)[:, :, n - rows:]
    if grouping is None:
        chunk_rows = probabilities[0, :, n - rows:].float().view(kv_heads, groups, rows, n)
        return out, {(lo, hi): chunk_rows[:, :, lo:hi].sum(dim=(1, 2)) for lo, hi in ranges}
    # the reference's order: view(b, groups, kv_heads, ...) (strided) summed over the groups, then the rows
    maps = probabilities[0].float()
    grouped = maps.view(groups, kv_heads, n, n).sum(dim=0) if grouping == "strided" \
        else maps.view(kv_heads, groups, n, n).sum(dim=1)
    first = n - rows  # the chunk's first row in the padded block
    return out, {(lo, hi): grouped[:, max(first + lo, 0):first + (rows if hi is None else hi)].sum(dim=1)
                 for lo, hi in ranges}


def memstep_attention(module, query, key, value, attention_mask=None, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs):
    """Causal attention of a chunk over the layer's cache (memory + chunk); transformers'
    attention-function signature; returns (output (batch, rows, heads, dim), None)."""
    if kwargs.get("softcap") is not None:
        raise ValueError("memstep attention does not support logit soft-capping")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    context = getattr(module, "memstep", None) or DEFAULT_CONTEXT
    query, key = context.rotate(module, query, key)
    rows, keys = query.shape[2], key.shape[2]
    ranges = context.score_rows(module, rows, keys)
    grouping = context.score_grouping(module) if ranges else "model"
    if context.padded and rows > 1:
        exact = grouping != "model" or any(lo < 0 for lo, _ in ranges)
        out, sums = padded_attention(query, key, value, scaling, ranges, grouping if exact else None)
    elif ranges:
        out, sums = one_pass_attention(query, key, value, scaling, ranges, per_head=grouping != "model")
    else:
        out, sums = sdpa_lower_right(query, key, value, scaling), {}
    context.keep(module, query, key, sums)
    return out.transpose(1, 2).contiguous(), None


DEFAULT_CONTEXT = StepContext()
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
