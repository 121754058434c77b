"""Plain data the engine yields: one StepRecord per chunk, one RunResult per run.

The CLI, the UI figures, the planner checks and the benchmarks all read these; nobody
re-derives what the engine knows. Arrays are numpy (no torch) so records can cross
process boundaries (ZeroGPU workers) and be turned into JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepRecord:
    """What happened in one prefill step (one chunk)."""

    step: int
    steps: int  # total steps in the schedule
    chunk_start: int  # document position of the chunk's first token
    chunk_size: int
    memory_before: int  # cache entries per layer before the step (sinks included; the widest global layer)
    memory_budget: int  # the schedule's budget after the step (sinks not included; layer average)
    memory_after: int  # cache entries per layer after the step: min(budget + sinks, before + chunk)
    seconds: float
    bytes_measured: int | None  # device peak during the step (CUDA/MPS); None on CPU
    bytes_modeled: int  # modeled peak during the step (memory.step_bytes)
    bytes_modeled_parts: dict[str, int]  # the modeled peak by component
    kv_bytes_actual: int  # largest total size of the real cache tensors during the step
    kept_positions: np.ndarray  # (layers, kv_heads, memory_after) document positions, sorted; -1 pads
    evicted: bool  # whether any entry was dropped in this step
    # layer-wise budgets or hybrid attention: each layer's entries after the step, and its budget
    # (a sliding-window layer's is its window: its queries see window keys, window - 1 of them kept)
    layer_memory_after: list[int] | None = None
    layer_budgets: list[int] | None = None
    kv_bytes_by_type: dict[str, int] | None = None  # hybrid attention: real cache bytes after the step by layer type
    layer_types: tuple[str, ...] | None = None  # hybrid attention: "global" or "sliding" for each layer
    first_position: int | None = None  # RoPE position of the chunk's first token
    question_tokens: int = 0  # question-aware: the question's tokens read after the chunk (then dropped)
    tokens_read: int | None = None  # a review (a chunk read again): the furthest position read so far

    @property
    def layer_entries(self) -> list[int]:
        """Entries each layer holds after the step."""
        return self.layer_memory_after or [self.memory_after] * self.kept_positions.shape[0]

    @property
    def tokens_seen(self) -> int:
        return self.tokens_read if self.tokens_read is not None else self.chunk_start + self.chunk_size

    @property
    def global_layers(self) -> list[int]:
        """The layers that follow the schedule (all of them unless the model mixes in sliding ones)."""
        if not self.layer_types:
            return list(range(self.kept_positions.shape[0]))
        return [i for i, kind in enumerate(self.layer_types) if kind == "global"]

    def global_kept_fraction(self) -> np.ndarray:
        """kept_fraction over the global layers only: a sliding layer keeps its window whatever
        the schedule, so what the schedule and scorer kept shows in the global layers."""
        return self.kept_fraction(self.global_layers if self.layer_types else None)

    def kept_fraction(self, layers_subset: list[int] | None = None) -> np.ndarray:
        """Per position seen so far: the fraction of (layer, KV head) slots that keep it (of the
        layers in ``layers_subset``, all when None)."""
        positions = self.kept_positions if layers_subset is None else self.kept_positions[layers_subset]
        layers, heads, width = positions.shape
        flat = positions.reshape(-1)
        if self.tokens_read is not None:  # a re-read chunk may sit twice in one slot: count it once
            slots = np.repeat(np.arange(layers * heads), width)
            keep = flat >= 0
            flat = np.unique(slots[keep] * (self.tokens_seen + 1) + flat[keep]) % (self.tokens_seen + 1)
        counts = np.bincount(flat[flat >= 0], minlength=self.tokens_seen)
        return counts[: self.tokens_seen] / float(layers * heads)

    def to_dict(self, with_positions: bool = False) -> dict:
        out = {
            "step": self.step,
            "chunk_start": self.chunk_start,
            "chunk_size": self.chunk_size,
            "memory_before": self.memory_before,
            "memory_budget": self.memory_budget,
            "memory_after": self.memory_after,
            "seconds": round(self.seconds, 6),
            "bytes_measured": self.bytes_measured,
            "bytes_modeled": self.bytes_modeled,
            "bytes_modeled_parts": dict(self.bytes_modeled_parts),
            "kv_bytes_actual": self.kv_bytes_actual,
            "evicted": self.evicted,
            "first_position": self.first_position,
            "question_tokens": self.question_tokens,
        }
        if self.layer_memory_after is not None:
            out["layer_budgets"] = list(self.layer_budgets or [])
            out["layer_memory_after"] = list(self.layer_memory_after)
        if self.kv_bytes_by_type is not None:
            out["kv_bytes_by_type"] = dict(self.kv_bytes_by_type)
        if with_positions:
            out["kept_positions"] = [layer[:, :n].tolist() for layer, n in zip(self.kept_positions, self.layer_entries)]
        return out


def rounded_list(fractions: np.ndarray, places: int = 4) -> list[float]:
    """``fractions`` rounded for JSON, one entry per position. A kept fraction takes few distinct
    values (k / slots), so the list refers to one float object per distinct value rather than
    one per position (a 131,072-token run: 1 MB of references instead of 4 MB of floats)."""
    distinct, index = np.unique(fractions, return_inverse=True)
    objects = [round(float(x), places) for x in distinct]
    return [objects[i] for i in index.reshape(-1).tolist()]


@dataclass
class RunResult:
    """A whole run: settings, the step records and what was asked afterwards."""

    model: str
    tokens: int  # tokens prefilled (prompt head + document)
    prefix_tokens: int  # chat-template tokens before the document (positions < this are not document)
    schedule: dict
    scorer: str
    sinks: int
    device: str
    dtype: str
    steps: list[StepRecord] = field(default_factory=list)
    seconds: float = 0.0
    answer: str | None = None
    question: str | None = None
    continuation_nll: float | None = None
    continuation_tokens: int = 0
    notices: list[str] = field(default_factory=list)
    rope: str = "compact"  # RoPE positions used: compact (contiguous, as the reference), document or shared
    attention: str = "sdpa"  # sdpa (memstep's) or padded (the reference code's (m + c)^2 maps)
    question_aware: bool = False  # the question's attention also scored every step
    question_weight: float | None = None
    question_pool: str | None = None
    fidelity: dict = field(default_factory=dict)  # the reference switches (memstep.presets.SWITCHES)
    prompt_question_tokens: int = 0  # question place "prompt": the question's tokens at the prompt's end
    prompt_form: str = "chat"  # how the document and question were framed: "chat" (template) or "completion"
    layers: dict = field(default_factory=dict)  # layer types and window (memstep.layers.LayerKinds.to_dict)

    @property
    def peak_bytes_measured(self) -> int | None:
        values = [s.bytes_measured for s in self.steps if s.bytes_measured is not None]
        return max(values) if values else None

    @property
    def peak_bytes_modeled(self) -> int:
        return max((s.bytes_modeled for s in self.steps), default=0)

    def kept_fraction(self) -> np.ndarray:
        return self.steps[-1].kept_fraction() if self.steps else np.zeros(0)

    def to_dict(self, with_positions: bool = False) -> dict:
        return {
            "model": self.model,
            "tokens": self.tokens,
            "prefix_tokens": self.prefix_tokens,
            "schedule": self.schedule,
            "scorer": self.scorer,
            "rope": self.rope,
            "attention": self.attention,
            "question_aware": self.question_aware,
            "question_weight": self.question_weight,
            "question_pool": self.question_pool,
            "fidelity": dict(self.fidelity),
            "prompt_question_tokens": self.prompt_question_tokens,
            "prompt_form": self.prompt_form,
            "layers": dict(self.layers),
            "sinks": self.sinks,
            "device": self.device,
            "dtype": self.dtype,
            "steps": [s.to_dict(with_positions) for s in self.steps],
            "kept_fraction": rounded_list(self.kept_fraction()),
            **({"global_kept_fraction": rounded_list(self.steps[-1].global_kept_fraction())}
               if self.steps and self.steps[-1].layer_types else {}),
            "question": self.question,
            "answer": self.answer,
            "continuation_tokens": self.continuation_tokens,
            "continuation_nll": self.continuation_nll,
            "seconds": round(self.seconds, 6),
            "peak_bytes_measured": self.peak_bytes_measured,
            "peak_bytes_modeled": self.peak_bytes_modeled,
            "notices": list(self.notices),
        }
