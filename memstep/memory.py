"""Bytes: measured on the device where it can measure, modeled everywhere.

The model here is the one formula the engine reports per step and the planner uses for
big models and GPUs. No torch import at module level: the planner must stay instant.

Peak bytes of one prefill step, with b cache entries per layer before the step, a chunk
of c tokens and a entries kept after it (sinks included), k = b + c keys:

- weights:          parameter bytes.
- KV of memory / KV of chunk: the engine evicts each layer right after its attention runs,
  so while layer l runs, layers < l hold a entries, layer l holds b + c and layers > l
  hold b. The largest total over l is (b + c) + (layers - 1) * max(a, b) entries per
  layer-slot; "KV of chunk" is the c entries of the running layer, "KV of memory" the rest.
  This equals the bytes of the real cache tensors (tested). A reference implementation
  that evicts after the whole forward (``evict_per_layer=False``) holds layers * (b + c).
  With layer-wise budgets (b_l, a_l per layer) the peak is the largest over l of
  sum_{j<l} a_j + (b_l + c) + sum_{j>l} b_j; the working sets below take the widest layer.
- attention working set of one layer, by implementation:
    sdpa:   memstep's attention: the output heads*c*d; no mask is materialized (CPU splits the
            step into the memory part and the causal square, CUDA takes a lower-right bias) and
            GQA runs natively (no score matrix). A step that cuts the layer runs one pass in
            blocks of query rows (the scorer's working set below)
    eager:  scores and probabilities 2*heads*c*k (float32) + mask + K/V repeated to every
            query head 2*heads*k*d + output
    padded: the seed paper's reference code pads to (b + c)^2 per head:
            2*heads*(b + c)^2 + repeated K/V + output
  plus the cache copy that concatenation and eviction make: one layer's max(a, b) entries.
- scorer working set (only when the step evicts): the one-pass attention's rotated queries
  heads*c*d, and per query block of q rows (the device's block, ``ONE_PASS_BLOCKS``; the
  recomputing scorer of an eager model: 256), logits and probabilities 2*heads*q*k float32,
  plus per-head column sums kv_heads*k float32.
- activations: MLP gate, up and product 3*c*intermediate + hidden-state copies 4*c*hidden.

Hybrid attention (``memstep.layers``): a sliding-window layer holds at most window - 1
entries between steps whatever the budget, so its KV is bounded by its window; the per-layer
formulas above take each layer's own before/after (``LayerKinds.apply``), and only the
global layers' cuts count as evictions (a sliding layer drops its oldest entries unscored).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memstep.layers import GLOBAL, TYPE_LABELS, LayerKinds

ATTENTIONS = ("sdpa", "eager", "padded")
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
SCORE_BYTES = 4  # scorers work in float32 whatever the model dtype
QUERY_BLOCK = 256  # the recomputing scorer's query rows per block (eager models): bounds its working set
# query rows per block of memstep's one-pass attention, by device (memstep/attention.py): on
# CPU a block of a KV group's logits stays in the core's L2 at c = M = 512 (measured fastest);
# on a GPU 256 rows keep the float32 block small (Llama-2-7B, 2052 keys: 134 MiB) while
# still filling the device (not measured: no GPU was lent)
ONE_PASS_BLOCKS = {"cpu": 32, "cuda": 256, "mps": 256}
PLANNED_DEVICE = "cuda"  # the planner plans GPUs


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory and time depend on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: int
    dtype_bytes: int = 4
    max_positions: int | None = None
    name: str = "model"
    kinds: LayerKinds = field(default=None, compare=False)  # each layer's attention type (all global if None)

    def __post_init__(self):
        if self.kinds is None:
            object.__setattr__(self, "kinds", LayerKinds.uniform(self.layers))

    @classmethod
    def from_config(cls, config, dtype_bytes: int = 4, params: int | None = None, name: str | None = None):
        """From a transformers config object or a plain config.json dict."""
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else (
            lambda k, d=None: getattr(config, k, d))
        if get("text_config") is not None:  # multimodal wrappers keep the LM in text_config
            return cls.from_config(get("text_config"), dtype_bytes, params, name)
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        layers = get("num_hidden_layers")
        if not all(isinstance(v, int) and v > 0 for v in (hidden, heads, layers)):
            raise ValueError("config needs positive hidden_size, num_attention_heads and num_hidden_layers")
        head_dim = get("head_dim") or hidden // heads
        kv_heads = get("num_key_value_heads") or heads
        intermediate = get("intermediate_size") or 4 * hidden
        vocab = get("vocab_size") or 32000
        experts, active = get("num_local_experts") or 1, get("num_experts_per_tok") or get("experts_per_token") or 1
        if params is None:  # a mixture of experts holds every expert's MLP and a router
            router = layers * hidden * experts if experts > 1 else 0
            params = estimate_params(layers, hidden, heads, kv_heads, head_dim, intermediate * experts, vocab,
                                     bool(get("tie_word_embeddings", False))) + router
        kinds = LayerKinds.from_config(get, layers)
        # FLOPs and activations follow the experts a token runs through (the active MLP width)
        return cls(layers, hidden, heads, kv_heads, head_dim, intermediate * min(active, experts), vocab, params,
                   dtype_bytes, get("max_position_embeddings"),
                   name or get("_name_or_path") or get("model_type") or "model", kinds)

    @property
    def kv_bytes_per_entry(self) -> int:
        """Bytes of one cache entry (key and value) in one layer, all KV heads."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's keys and values across all layers."""
        return self.layers * self.kv_bytes_per_entry

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    def kv_bytes_by_type(self, entries) -> dict[str, int]:
        """KV bytes by layer type ("global", "sliding") of ``entries`` per layer (a number or a list)."""
        out = {TYPE_LABELS[t]: 0 for t in self.kinds.counts()}
        for kind, n in zip(self.kinds.types, _per_layer(entries, self.layers)):
            out[TYPE_LABELS[kind]] += n * self.kv_bytes_per_entry
        return out


def estimate_params(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied) -> int:
    """Parameters of a Llama-style decoder (gated MLP, RMSNorm, no biases)."""
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * intermediate
    norms = 2 * hidden
    embeddings = vocab * hidden * (1 if tied else 2)
    return layers * (attention + mlp + norms) + embeddings + hidden


def _per_layer(value, layers: int) -> list[int]:
    return [value] * layers if isinstance(value, int) else list(value)


def kv_peak_entries(shape: ModelShape, before, chunk: int, after, evict_per_layer: bool = True) -> int:
    """Largest number of cache entries (summed over layers) during one step; ``before`` and
    ``after`` are entries per layer, one number for all layers or a list (layer-wise budgets)."""
    if isinstance(before, int) and isinstance(after, int):
        if not evict_per_layer:
            return shape.layers * (before + chunk)
        return (before + chunk) + (shape.layers - 1) * max(after, before)
    b, a = _per_layer(before, shape.layers), _per_layer(after, shape.layers)
    if not evict_per_layer:
        return sum(b) + shape.layers * chunk
    # while layer l runs: the layers below hold what they kept, l holds memory + chunk, the rest their memory
    return max(sum(a[:l]) + b[l] + chunk + sum(b[l + 1:]) for l in range(shape.layers))


def _widest(before, after) -> tuple[int, int]:
    """(before, after) of the layer whose working set is largest (the most memory entries)."""
    if isinstance(before, int) and isinstance(after, int):
        return before, after
    return max(_as_list(before)), max(_as_list(after))


def _as_list(value) -> list[int]:
    return [value] if isinstance(value, int) else list(value)


def attention_bytes(shape: ModelShape, before: int, chunk: int, after: int, attention: str = "sdpa") -> int:
    """Working set of one layer's attention, including the cache copy of concat/eviction."""
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention '{attention}': choose one of {', '.join(ATTENTIONS)}")
    before, after = _widest(before, after)
    keys = before + chunk
    item = shape.dtype_bytes
    # memstep's attention builds no mask; transformers' eager mask is chunk x keys in the model's
    # dtype at every step (it never skips to is_causal); the padded code's is a (memory + chunk)^2
    # boolean tril at every step, the first included
    mask = {"sdpa": 0, "eager": chunk * keys * item, "padded": keys * keys}[attention]
    # memstep's SDPA runs GQA natively; eager and the padded reference repeat K/V to every query head
    repeated = 2 * shape.heads * keys * shape.head_dim * item if shape.heads != shape.kv_heads and \
        attention != "sdpa" else 0
    output = shape.heads * chunk * shape.head_dim * item
    if attention == "sdpa":
        scores = 0
    elif attention == "eager":
        scores = 2 * shape.heads * chunk * keys * SCORE_BYTES
    else:  # padded: memory + chunk squared, as the reference code does
        scores = 2 * shape.heads * keys * keys * item
    copy = max(after, before) * shape.kv_bytes_per_entry
    return mask + repeated + output + scores + copy


def query_block(attention: str, device: str = PLANNED_DEVICE) -> int:
    """Query rows per block of the pass that yields the scores."""
    return ONE_PASS_BLOCKS.get(device, QUERY_BLOCK) if attention == "sdpa" else QUERY_BLOCK


def scorer_bytes(shape: ModelShape, before: int, chunk: int, evicts: bool, block: int = QUERY_BLOCK) -> int:
    """Working set of scoring one layer's cache (zero when the step evicts nothing)."""
    if not evicts:
        return 0
    keys = max(_as_list(before)) + chunk
    rows = min(chunk, block)
    queries = shape.heads * chunk * shape.head_dim * shape.dtype_bytes
    return queries + 2 * shape.heads * rows * keys * SCORE_BYTES + shape.kv_heads * keys * SCORE_BYTES


def activation_bytes(shape: ModelShape, chunk: int) -> int:
    return chunk * (3 * shape.intermediate + 4 * shape.hidden) * shape.dtype_bytes


def step_bytes(shape: ModelShape, before: int, chunk: int, after: int, *, attention: str = "sdpa",
               evict_per_layer: bool = True, scoring: bool = True, device: str = PLANNED_DEVICE) -> dict[str, int]:
    """Modeled peak bytes of one step by component; ``total`` is their sum. ``device``: the
    device type the step runs on (its one-pass block)."""
    evicts = scoring and any(b + chunk > a for b, a, kind in zip(_per_layer(before, shape.layers),
                                                               _per_layer(after, shape.layers), shape.kinds.types)
                             if kind == GLOBAL)
    kv_entries = kv_peak_entries(shape, before, chunk, after, evict_per_layer)
    kv_chunk = chunk * shape.kv_bytes_per_entry * (1 if evict_per_layer else shape.layers)
    parts = {
        "weights": shape.weight_bytes,
        "kv_memory": kv_entries * shape.kv_bytes_per_entry - kv_chunk,
        "kv_chunk": kv_chunk,
        "attention": attention_bytes(shape, before, chunk, after, attention)
        + scorer_bytes(shape, before, chunk, evicts, query_block(attention, device)),
        "activations": activation_bytes(shape, chunk),
    }
    parts["total"] = sum(parts.values())
    return parts


PARTS = ("weights", "kv_memory", "kv_chunk", "attention", "activations")
PART_LABELS = {
    "weights": "weights",
    "kv_memory": "KV of memory",
    "kv_chunk": "KV of chunk",
    "attention": "attention + scorer working set",
    "activations": "activations",
}


def format_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class DeviceMemory:
    """Peak bytes allocated on the device during a span: CUDA exactly, MPS by sampling,
    None on CPU (process RSS mixes in the allocator's caches and is not comparable)."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.kind = device.type if hasattr(device, "type") else str(device)
        self.device = device
        self._peak = 0

    @property
    def measurable(self) -> bool:
        return self.kind in ("cuda", "mps")

    def start(self) -> None:
        if self.kind == "cuda":
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind == "mps":
            self._peak = self.torch.mps.current_allocated_memory()

    def sample(self) -> None:
        if self.kind == "mps":
            self._peak = max(self._peak, self.torch.mps.current_allocated_memory())

    def peak(self) -> int | None:
        if self.kind == "cuda":
            self.torch.cuda.synchronize(self.device)
            return int(self.torch.cuda.max_memory_allocated(self.device))
        if self.kind == "mps":
            self.sample()
            return int(self._peak)
        return None
