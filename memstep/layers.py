"""Layer types: which layers follow the memory schedule and which keep a sliding window.

Hybrid-attention models (Gemma 2 and 3, gpt-oss, ...) mix global layers, whose queries see
every earlier token, with sliding-window layers, whose queries see only the last ``window``
tokens (their own included). A memory budget concerns the global layers only: a sliding
layer keeps exactly what the model's window needs, the last ``window - 1`` tokens read
(the next token is the window's last key), whatever the schedule says. Pure arithmetic, no
torch: the engine, the memory model and the planner count with the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from memstep.errors import MemstepError

GLOBAL = "full_attention"
SLIDING = "sliding_attention"
LAYER_TYPES = (GLOBAL, SLIDING)
TYPE_LABELS = {GLOBAL: "global", SLIDING: "sliding"}


@dataclass(frozen=True)
class LayerKinds:
    """Each layer's attention type and the sliding layers' window (tokens a query sees)."""

    types: tuple[str, ...]
    window: int | None = None

    @classmethod
    def uniform(cls, layers: int) -> LayerKinds:
        return cls((GLOBAL,) * layers)

    @classmethod
    def from_config(cls, get, layers: int) -> LayerKinds:
        """From a config getter (``get(key, default)``): ``layer_types`` when the config lists
        them, else Gemma 3's published ``sliding_window_pattern`` (every n-th layer global), else
        every layer global. An unknown type is refused with one line naming it."""
        types = get("layer_types", None)
        window = get("sliding_window", None)
        pattern = get("sliding_window_pattern", None)
        if types is None and isinstance(pattern, int) and pattern > 0 and window:
            types = [GLOBAL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]
        if types is None:
            return cls.uniform(layers)
        types = tuple(types)
        for kind in types:
            if kind not in LAYER_TYPES:
                raise MemstepError(f"layer type '{str(kind)[:60]}' is not supported: memstep runs "
                                   f"{' and '.join(LAYER_TYPES)} layers")
        if len(types) != layers:
            raise MemstepError(f"the config lists {len(types)} layer types for {layers} layers")
        if SLIDING in types and not (isinstance(window, int) and not isinstance(window, bool) and window >= 1):
            raise MemstepError(f"the config has sliding_attention layers but no usable sliding_window ({window!r})")
        return cls(types, int(window) if SLIDING in types else None)

    @property
    def hybrid(self) -> bool:
        return SLIDING in self.types

    def sliding(self, layer: int) -> bool:
        return self.types[layer] == SLIDING

    @property
    def memory_limit(self) -> int | None:
        """Entries a sliding layer keeps between chunks: the window's earlier tokens."""
        return None if self.window is None else self.window - 1

    def counts(self) -> dict[str, int]:
        return {kind: self.types.count(kind) for kind in LAYER_TYPES if kind in self.types}

    def apply(self, lengths: list[tuple[list[int], list[int]]], chunks) -> list[tuple[list[int], list[int]]]:
        """Per step (entries before, entries after) of every layer: the schedule's numbers for
        the global layers; a sliding layer's memory is its last window - 1 tokens read."""
        if not self.hybrid:
            return lengths
        limit, held, out = self.memory_limit, 0, []
        for (before, after), chunk in zip(lengths, chunks):
            kept = min(limit, held + chunk)
            out.append(([held if s else b for s, b in zip(self._flags, before)],
                        [kept if s else a for s, a in zip(self._flags, after)]))
            held = kept
        return out

    def widest_global(self, entries) -> int:
        """The most entries a global layer holds (what the schedule sets; sliding layers hold
        their window). A number passes through; a model without global layers: the widest layer."""
        if isinstance(entries, int):
            return entries
        kept = [n for n, t in zip(entries, self.types) if t == GLOBAL] or list(entries)
        return max(kept)

    def budgets(self, budgets: list[int]) -> list[int]:
        """Each layer's budget: the schedule's for global layers, the window for sliding ones."""
        return [self.window if s else b for s, b in zip(self._flags, budgets)]

    @property
    def _flags(self) -> list[bool]:
        return [t == SLIDING for t in self.types]

    def to_dict(self) -> dict:
        return {"layer_types": [TYPE_LABELS[t] for t in self.types], "window": self.window,
                "layers_by_type": {TYPE_LABELS[k]: n for k, n in self.counts().items()}}
