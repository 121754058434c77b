"""Layer dropping by block influence (ShortGPT: Men et al., "ShortGPT: Layers in Large Language
Models are More Redundant Than You Expect", 2024).

A layer's block influence is 1 - the cosine similarity of its input and output hidden states,
averaged over the calibration tokens: a layer that barely turns the hidden state does little.
One forward of the dense model on the calibration sentences scores every layer; the ``remove``
layers with the lowest influence are dropped at once (the paper's one-shot removal; ties: the
lower layer first). The result is a shallower model built like LaCo's (config, layer indices,
cache layout), saved as a model folder.

Iterating ``BlockInfluenceDrop`` yields one ``influence`` event per layer (bottom to top),
then one ``drop`` event per removed layer in the order of removal (lowest influence first);
``DropRun`` adds the measurements (dense model, the dropped model, uniform removal at the same
count) on one probe and the save, as ``collapse_run.CollapseRun`` does for LaCo.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memstep.cancel import checkpoint
from memstep.compress.baselines import ranking, remove_layers, uniform_layers
from memstep.compress.data import save_model
from memstep.compress.guard import KEEP_FLAG, check_limit, findings, kept_anyway, refusal
from memstep.compress.laco import CALIBRATION_TOKENS
from memstep.compress.layers import LayerInputs, calibration_batches, check_decoder
from memstep.compress.quality import Probe, make_check_probe, measure, relative
from memstep.errors import MemstepError
from memstep.models import LoadedModel

REMOVE_FRACTION = 0.25  # ShortGPT removes about a quarter of the layers (9 of 32 on Llama-2-7B, 10 of 40 on 13B)
LABELS = {"dense": "dense", "block-influence": "block influence (ShortGPT)", "uniform": "uniform removal"}


def default_remove(depth: int) -> int:
    """A quarter of the layers, at least one."""
    return max(1, round(REMOVE_FRACTION * depth))


@dataclass
class DropResult:
    layers_before: int
    layers_after: int
    removed: list[int]  # in layer order
    order: list[int]  # removed layers in the order they were chosen (lowest influence first)
    influence: list[float]  # every layer's block influence
    settings: dict
    seconds: float = 0.0

    @property
    def pruning_ratio(self) -> float:
        return len(self.removed) / self.layers_before

    def to_dict(self) -> dict:
        return {"event": "result", **asdict(self), "pruning_ratio": self.pruning_ratio}


class BlockInfluenceDrop:
    """Score every layer of ``model`` (left untouched) by block influence on the calibration
    sentences and choose the ``remove`` lowest. Settings are checked on construction."""

    def __init__(self, model, tokenizer, calibration: list[str], *, remove: int | None = None,
                 max_tokens: int = CALIBRATION_TOKENS):
        self.dense_layers = check_decoder(model)
        depth = len(self.dense_layers)
        remove = default_remove(depth) if remove is None else remove
        if isinstance(remove, bool) or not isinstance(remove, int) or not 1 <= remove < depth:
            raise MemstepError(f"the number of layers to drop must be between 1 and {depth - 1} for this "
                               f"{depth}-layer model (got {remove})")
        if max_tokens < 2:
            raise MemstepError(f"calibration sentences need at least 2 tokens each, got {max_tokens}")
        self.model, self.tokenizer, self.remove = model, tokenizer, remove
        self.batches = calibration_batches(tokenizer, calibration, max_tokens, next(model.parameters()).device)
        self.result: DropResult | None = None

    @property
    def settings(self) -> dict:
        return {"remove": self.remove, "calibration_sentences": len(self.batches),
                "calibration_tokens": sum(b.shape[1] for b in self.batches)}

    def __iter__(self) -> Iterator[dict]:
        began = time.perf_counter()
        stack = LayerInputs(self.model, self.batches)
        depth, scores = len(self.dense_layers), []
        for i in range(depth):
            checkpoint()
            scores.append(stack.influence(i))
            yield {"event": "influence", "step": i, "layer": i, "influence": scores[-1], "layers": depth}
        order = ranking(scores)[:self.remove]
        for k, layer in enumerate(order):
            yield {"event": "drop", "step": k, "layer": layer, "influence": scores[layer], "rank": k + 1,
                   "layers_after": depth - k - 1}
        self.result = DropResult(depth, depth - self.remove, sorted(order), order, scores, self.settings,
                                 time.perf_counter() - began)
        yield self.result.to_dict()

    def build(self):
        """The model without the chosen layers, standalone (the dense model is left as it was)."""
        if self.result is None:
            raise MemstepError("score the layers before building the shallower model")
        return remove_layers(self.model, self.result.removed,
                             info={"method": "block-influence", "removed": self.result.removed,
                                   "influence": self.result.influence, "settings": self.result.settings})


@dataclass
class DropRun:
    """The drop as users see it: the scoring events, then (with a ``probe``) the dense model,
    the dropped model and uniform removal at the same count measured (not on a check probe),
    then the save: refused when the perplexity ratio passes ``guard`` unless ``keep_worse``
    (a limit without a probe measures a check probe first)."""

    lm: LoadedModel
    calibration: list[str]
    remove: int | None = None
    probe: Probe | None = None
    baselines: bool = True
    output: str | Path | None = None
    repeats: int = 1
    guard: float | None = None
    max_tokens: int = CALIBRATION_TOKENS
    keep_worse: bool = False
    keep_name: str = KEEP_FLAG
    report: dict = field(default_factory=dict)

    def __post_init__(self):
        self.guard = check_limit(self.guard)
        if self.guard is not None and self.probe is None:  # a limit is never left unchecked
            self.probe = make_check_probe(self.lm.tokenizer)
        self.baselines = self.baselines and not (self.probe and self.probe.check_only)
        self.search = BlockInfluenceDrop(self.lm.model, self.lm.tokenizer, self.calibration, remove=self.remove,
                                         max_tokens=self.max_tokens)
        self.output = Path(self.output) if self.output else None
        self.report = {"model": self.lm.name, "method": "block-influence", "search": None, "models": {},
                       "probe": self.probe.to_dict() if self.probe else None, "saved": None, "refused": None,
                       "kept_worse": None, "guard_limit": self.guard, "keep_worse": self.keep_worse}

    def _measure(self, key: str, model) -> dict:
        began = time.perf_counter()
        row = measure(LoadedModel(model, self.lm.tokenizer, LABELS[key], self.lm.device, self.lm.dtype), self.probe,
                      self.repeats)
        row["label"], row["seconds_measuring"] = LABELS[key], time.perf_counter() - began
        self.report["models"][key] = row
        return {"event": "model", "key": key, **row}

    def _save(self, model) -> dict:
        self.report["saved"] = str(save_model(model, self.lm.tokenizer, self.output,
                                              info=model.config.memstep_compress))
        return {"event": "saved", "folder": self.report["saved"]}

    def __iter__(self) -> Iterator[dict]:
        yield from self.search
        result = self.search.result
        self.report["search"] = result.to_dict()
        dropped = self.search.build()
        if self.probe is None:
            if self.output:
                yield self._save(dropped)
            return
        yield self._measure("dense", self.lm.model)
        event = self._measure("block-influence", dropped)
        self.report["models"]["block-influence"]["removed"] = event["removed"] = result.removed
        yield event
        if self.baselines:
            layers = uniform_layers(result.layers_before, len(result.removed))
            model = remove_layers(self.lm.model, layers, info={"method": "uniform", "removed": layers})
            event = self._measure("uniform", model)
            self.report["models"]["uniform"]["removed"] = event["removed"] = layers
            del model
            yield event
        dense = self.report["models"]["dense"]
        for row in self.report["models"].values():
            row.update(relative(row, dense))
        if self.output:  # the save waits for the check
            found = findings(self.report["models"]["block-influence"], dense, None, self.guard)
            self.report["refused"] = refusal(found, self.keep_worse, self.keep_name)
            if self.report["refused"]:
                yield {"event": "refused", "message": self.report["refused"]}
            else:
                self.report["kept_worse"] = kept_anyway(found, self.keep_name)
                yield {**self._save(dropped), "kept_worse": self.report["kept_worse"]}
        yield {"event": "done", **self.report}
