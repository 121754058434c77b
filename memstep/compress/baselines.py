"""Layer-removal baselines at a given number of removed layers: block influence (ShortGPT:
Men et al., "ShortGPT: Layers in Large Language Models are More Redundant Than You Expect",
2024) and uniformly spaced layers."""

from __future__ import annotations

from memstep.compress.layers import build_model, check_decoder
from memstep.errors import MemstepError

BASELINES = ("block-influence", "uniform")


def ranking(scores: list[float]) -> list[int]:
    """Layers from the lowest block influence to the highest (ties: the lower layer first)."""
    return sorted(range(len(scores)), key=lambda i: (scores[i], i))


def lowest_influence(scores: list[float], n: int) -> list[int]:
    """The ``n`` layers with the lowest block influence, in layer order (``ranking``'s first ``n``)."""
    return sorted(ranking(scores)[:n])


def uniform_layers(depth: int, n: int) -> list[int]:
    """``n`` layers spread evenly over ``depth``: the middle layer of each of n equal bands."""
    if not 0 <= n < depth:
        raise MemstepError(f"cannot remove {n} of {depth} layers")
    return [int((k + 0.5) * depth / n) for k in range(n)]


def remove_layers(model, removed: list[int], info: dict | None = None):
    """A standalone copy of ``model`` without the ``removed`` decoder layers."""
    layers = check_decoder(model)
    kept = [i for i in range(len(layers)) if i not in set(removed)]
    if not kept:
        raise MemstepError("cannot remove every layer")
    return build_model(model, [layers[i] for i in kept], kept, info)
