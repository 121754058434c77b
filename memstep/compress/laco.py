"""LaCo: layer collapse (Yang et al., "LaCo: Large Language Model Pruning via Layer
Collapse", EMNLP 2024 Findings).

Reserving-Differences-while-Seeking-Common (RDSC) merges layers l+1..l+C-1 into layer l:

    theta_l  <-  theta_l + sum_{k=1}^{C-1} (theta_{l+k} - theta_l)

for every attention and MLP parameter (weights, and biases where the family has them: they
are part of the same affine maps, so the same argument applies); the layer norms (and
Qwen3's q/k norms) stay layer l's: a norm's gain is a scale, not a residual update, and the
paper merges only attention and MLP. The merged-away layers are removed.

With C = 2 the formula gives theta_l + (theta_{l+1} - theta_l) = theta_{l+1}: the "merged"
layer is a copy of the upper layer (with the base layer's norms), so the search drops layers
rather than merging them. A real merge needs C >= 3 (``C2_WARNING``).

``variant="notebook"`` is what the authors' released notebook computes in effect: it adds
``theta_{l+k} - theta_l`` to the already updated copy of layer l, so each step overwrites it
and the merged layer ends with layer l+C-1's attention and MLP weights (and layer l's norms).

The search (``LayerCollapse``) follows the notebook's conventions: H is the index of the
highest layer (HIGHEST_LAY, default the top layer, depth - 1) and L the lowest base (LOWEST_LAY,
default 0). It starts at l = H - C, so the first window holds layers H - C .. H - 1 (with the
default H the top layer joins a window only once a merge below has brought it within reach;
H = depth lets the first window reach it). Each step merges the candidate, compares its final
hidden states (the decoder's last hidden state, after the final norm) with the reference
model's on a few calibration sentences (tokenized as the model's own inputs, BOS/special
tokens included, as the notebook's ``tokenizer(s)``) by cosine similarity; above T the merge
is kept and l moves down by I, otherwise by 1; it stops when l < L. The reference is the dense
model, as in the paper's Algorithm 1 and the notebook (``reference="current"``: the model
collapsed so far).

Merges chain as in the paper and the notebook (``merge="chained"``): a window that takes in a
layer merged before merges that merged layer's weights. ``merge="run"`` instead builds every
candidate by one RDSC over the original layers of the whole run it would stand for, so an
accepted run l <- l+1, ..., l+m is theta_l + sum_k (theta_{l+k} - theta_l) on the dense weights;
``LacoResult.chain_difference`` measures how far the two are apart on the final groups.

Iterating yields one ``CandidateRecord`` per candidate; afterwards ``result`` holds the
plain-data outcome and ``build()`` the collapsed model.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from memstep.cancel import checkpoint
from memstep.compress.layers import LayerInputs, build_model, calibration_batches, check_decoder, mean_similarity
from memstep.errors import MemstepError

VARIANTS = ("paper", "notebook")
REFERENCES = ("dense", "current")
MERGES = ("chained", "run")
# Defaults: the notebook's L = 0, H = the top layer's index and I = 1, with C = 3 (the smallest
# window whose RDSC is a real merge) and T chosen by trying on the embedded 30-layer SmolLM2-135M
# (docs/compress.md): three-layer merges score at most 0.52 there (layers 25-27) and 0.44 elsewhere;
# T = 0.45, the notebook's value for Llama-13B, keeps that one merge (30 -> 28 layers).
DEFAULTS = dict(C=3, L=0, H=None, I=1, T=0.45, merge="chained")
CALIBRATION_SENTENCES = 6
CALIBRATION_TOKENS = 128
C2_WARNING = ("C = 2: RDSC then reduces to keeping the upper layer (theta_l + (theta_l+1 - theta_l) = "
              "theta_l+1), so the search drops layers instead of merging them; use C >= 3 for a real merge")


def settings_warnings(C: int) -> list[str]:
    """What a user should know about settings that run but do not do what LaCo means."""
    return [C2_WARNING] if C == 2 else []


def mergeable(name: str) -> bool:
    """Attention and MLP parameters are merged; norms are kept from the base layer."""
    parts = name.split(".")
    return parts[0] in ("self_attn", "mlp") and not any("norm" in part for part in parts)


def merge_layers(layers: list[nn.Module], variant: str = "paper") -> nn.Module:
    """A new layer: ``layers[0]`` with the others merged into it by RDSC (``paper``) or as
    the released notebook does (``notebook``). The given layers are not modified."""
    if variant not in VARIANTS:
        raise MemstepError(f"unknown LaCo variant '{variant}': use {' or '.join(VARIANTS)}")
    base = layers[0]
    merged = copy.deepcopy(base)
    with torch.no_grad():
        for name, param in merged.named_parameters():
            if not mergeable(name):
                continue
            if variant == "notebook":
                param.copy_(layers[-1].get_parameter(name))
                continue
            theta = base.get_parameter(name).float()  # accumulate in fp32 for bf16/fp16 models
            total = theta.clone()
            for other in layers[1:]:
                total += other.get_parameter(name).float() - theta
            param.copy_(total.to(param.dtype))
    return merged


def check_settings(C: int, L: int, H: int, I: int, T: float, layers: int) -> None:  # noqa: E741
    """One readable line for every setting that cannot run on a ``layers``-layer model
    (H: the highest layer's index as in the notebook; ``layers`` lets the first window reach the top)."""
    if C < 2:
        raise MemstepError(f"C must be at least 2 (a merge needs a base layer and one more), got {C}")
    if I < 1:
        raise MemstepError(f"I must be at least 1 (the step down after an accepted merge), got {I}")
    if not 0 < T <= 1:
        raise MemstepError(f"T must be in (0, 1] (a cosine-similarity threshold), got {T}")
    if L < 0:
        raise MemstepError(f"L must be 0 or more, got {L}")
    if H > layers:
        raise MemstepError(f"H={H} is above the model's top layer ({layers - 1}, the default): use H <= {layers} "
                           f"(H = {layers} lets the first window reach the top layer)")
    if L > H:
        raise MemstepError(f"L={L} is above H={H}: the search walks down from H - C to L")
    if H - C < L:
        raise MemstepError(f"no candidate: the search starts at H - C = {H - C}, below L = {L}; "
                           "lower C or L, or raise H")


def walk(depth: int, C: int, L: int, H: int, I: int, T: float, similarity) -> Iterator[tuple]:  # noqa: E741
    """The search's walk over a ``depth``-layer model, apart from any model: from l = H - C
    down to L, ``similarity(l, end)`` scores merging layers l..end-1 (indices in the model
    collapsed so far; the window is cut at its top, as the notebook does). Yields
    (l, end, similarity, accepted); an accepted merge removes end - l - 1 layers and moves
    l down by I, a rejected one by 1."""
    l = H - C  # noqa: E741
    while l >= L:
        end = min(l + C, depth)
        if end - l < 2:
            l -= 1  # noqa: E741
            continue
        value = similarity(l, end)
        accepted = value > T
        if accepted:
            depth -= end - l - 1
        yield l, end, value, accepted
        l -= I if accepted else 1  # noqa: E741


@dataclass
class CandidateRecord:
    """One candidate of the search, in the original model's layer numbers."""

    step: int
    index: int  # l, the base's index in the model collapsed so far
    layers: list[int]  # original index of each layer in the window (the base first)
    merged: list[int]  # every original layer the merged layer would stand for
    similarity: float
    threshold: float
    accepted: bool
    layers_after: int  # depth of the model collapsed so far, after this decision
    seconds: float

    def to_dict(self) -> dict:
        return {"event": "candidate", **asdict(self)}


@dataclass
class LacoResult:
    layers_before: int
    layers_after: int
    removed: list[int]  # original layers merged away
    groups: list[list[int]]  # per layer of the collapsed model, the original layers it stands for
    settings: dict
    candidates: list[CandidateRecord] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    chain_difference: dict[int, float] = field(default_factory=dict)  # merged base -> max |chained - one RDSC|

    @property
    def pruning_ratio(self) -> float:
        return len(self.removed) / self.layers_before

    def merges(self) -> dict[int, list[int]]:
        """Original base layer -> the original layers merged into it (only merged layers)."""
        return {g[0]: g[1:] for g in self.groups if len(g) > 1}

    def to_dict(self) -> dict:
        return {"event": "result", "layers_before": self.layers_before, "layers_after": self.layers_after,
                "removed": self.removed, "pruning_ratio": self.pruning_ratio, "groups": self.groups,
                "merges": {str(k): v for k, v in self.merges().items()}, "settings": self.settings,
                "candidates": [c.to_dict() for c in self.candidates], "seconds": self.seconds,
                "warnings": self.warnings, "chain_difference": {str(k): v for k, v in self.chain_difference.items()}}


class LayerCollapse:
    """The LaCo search on ``model`` (left untouched: candidates share its unmerged layers).
    Settings are checked on construction; iterate for one CandidateRecord per candidate."""

    def __init__(self, model, tokenizer, calibration: list[str], *, C: int = DEFAULTS["C"],  # noqa: E741
                 L: int = DEFAULTS["L"], H: int | None = None, I: int = DEFAULTS["I"],  # noqa: E741
                 T: float = DEFAULTS["T"], variant: str = "paper", reference: str = "dense",
                 merge: str = DEFAULTS["merge"], max_tokens: int = CALIBRATION_TOKENS):
        self.dense_layers = check_decoder(model)
        H = len(self.dense_layers) - 1 if H is None else H
        check_settings(C, L, H, I, T, len(self.dense_layers))
        if variant not in VARIANTS:
            raise MemstepError(f"unknown LaCo variant '{variant}': use {' or '.join(VARIANTS)}")
        if reference not in REFERENCES:
            raise MemstepError(f"unknown reference '{reference}': use {' or '.join(REFERENCES)}")
        if merge not in MERGES:
            raise MemstepError(f"unknown merge '{merge}': use {' or '.join(MERGES)}")
        if max_tokens < 2:
            raise MemstepError(f"calibration sentences need at least 2 tokens each, got {max_tokens}")
        self.model, self.tokenizer = model, tokenizer
        self.C, self.L, self.H, self.I, self.T = C, L, H, I, T
        self.variant, self.reference, self.merge = variant, reference, merge
        self.warnings = settings_warnings(C)
        device = next(model.parameters()).device
        self.batches = calibration_batches(tokenizer, calibration, max_tokens, device)
        self.layers = list(self.dense_layers)  # the model collapsed so far
        self.groups = [[i] for i in range(len(self.layers))]
        self.result: LacoResult | None = None
        self.stack: LayerInputs | None = None  # the dense model's layer inputs (also gives block influence)

    @property
    def settings(self) -> dict:
        return {"C": self.C, "L": self.L, "H": self.H, "I": self.I, "T": self.T, "variant": self.variant,
                "reference": self.reference, "merge": self.merge, "calibration_sentences": len(self.batches),
                "calibration_tokens": sum(b.shape[1] for b in self.batches)}

    def _score(self, l: int, end: int) -> float:  # noqa: E741
        """Build the candidate merging layers l..end-1 of the model so far; its similarity."""
        checkpoint()  # Stop / cancel ends the search between candidates
        started = time.perf_counter()
        group = [i for g in self.groups[l:end] for i in g]
        members = self.layers[l:end] if self.merge == "chained" else [self.dense_layers[i] for i in group]
        layers = self.layers[:l] + [merge_layers(members, self.variant)] + self.layers[end:]
        groups = self.groups[:l] + [group] + self.groups[end:]
        # the layers below l are the dense model's: only l and above run
        hidden = self.stack.final_hidden(layers, [g[0] for g in groups], start=l)
        self._candidate = (layers, groups, hidden, time.perf_counter() - started)
        return mean_similarity(self._reference, hidden)

    def __iter__(self) -> Iterator[CandidateRecord]:
        began = time.perf_counter()
        if self.stack is None:
            self.stack = LayerInputs(self.model, self.batches)
        self._reference = self.stack.final
        records = []
        for l, end, similarity, accepted in walk(len(self.layers), self.C, self.L, self.H, self.I, self.T,  # noqa: E741
                                                 self._score):
            layers, groups, hidden, seconds = self._candidate
            window = [g[0] for g in self.groups[l:end]]
            if accepted:
                self.layers, self.groups = layers, groups
                if self.reference == "current":
                    self._reference = hidden
            record = CandidateRecord(len(records), l, window, groups[l], similarity, self.T, accepted,
                                     len(self.layers), seconds)
            records.append(record)
            yield record
        self._candidate = self._reference = None
        kept = {g[0] for g in self.groups}
        self.result = LacoResult(len(self.dense_layers), len(self.layers),
                                 sorted(set(range(len(self.dense_layers))) - kept), [list(g) for g in self.groups],
                                 self.settings, records, time.perf_counter() - began, list(self.warnings),
                                 self.chain_difference())

    def chain_difference(self) -> dict[int, float]:
        """For each merged layer: the largest absolute difference, over its attention and MLP
        weights, between it and one RDSC over the original layers of its group (0 for a group
        merged at once; a chain of merges adds differences of differences)."""
        out = {}
        for layer, group in zip(self.layers, self.groups):
            if len(group) > 1:
                whole = merge_layers([self.dense_layers[i] for i in group], self.variant)
                out[group[0]] = max(((p.float() - whole.get_parameter(n).float()).abs().max().item()
                                     for n, p in layer.named_parameters() if mergeable(n)), default=0.0)
        return out

    def run(self) -> LacoResult:
        for _ in self:
            pass
        return self.result

    def build(self):
        """The collapsed model, standalone (the dense model is left as it was)."""
        if self.result is None:
            raise MemstepError("run the LaCo search before building the collapsed model")
        return build_model(self.model, self.layers, [g[0] for g in self.groups],
                           info={"method": "laco", **{k: v for k, v in self.result.to_dict().items()
                                                       if k in ("removed", "groups", "settings")}})
