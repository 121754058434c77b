"""What it takes: the fewest GPUs of a kind that hold a plan, the longest context one GPU
holds, and how int8 or int4 weights change both.

Quantized weights are counted in bytes only (1 or 1/2 byte per parameter, quantization
scales and zero points not counted): the KV cache, activations and the time of a step stay
at the model's dtype, since dequantizing kernels differ too much between libraries to model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from memstep.errors import MemstepError
from memstep.memory import ModelShape
from memstep.planner.catalogue import RESERVED_BYTES, Gpu
from memstep.planner.plans import plan
from memstep.planner.search import Longest, longest_context

# weights option -> bits per parameter (None: the model's dtype)
WEIGHT_FORMATS = {"dtype": None, "int8": 8, "int4": 4}
WEIGHT_LABELS = {"dtype": "as the dtype", "int8": "int8 weights (bytes only)", "int4": "int4 weights (bytes only)"}


@dataclass(frozen=True)
class QuantizedShape(ModelShape):
    """A model whose weights are stored in ``weight_bits`` bits per parameter; everything else
    (KV cache, activations, the step's arithmetic) keeps ``dtype_bytes``."""

    weight_bits: int = 16

    @property
    def weight_bytes(self) -> int:
        return math.ceil(self.params * self.weight_bits / 8)


def with_weights(shape: ModelShape, weights: str | None) -> ModelShape:
    """``shape`` with its weights as the dtype (``dtype``/None), int8 or int4."""
    key = (weights or "dtype").lower()
    if key not in WEIGHT_FORMATS:
        raise MemstepError(f"unknown weights '{weights}': choose one of {', '.join(WEIGHT_FORMATS)}")
    bits = WEIGHT_FORMATS[key]
    base = {f.name: getattr(shape, f.name) for f in dataclasses.fields(ModelShape)}
    if bits is None:
        return ModelShape(**base)
    return QuantizedShape(**base, weight_bits=bits)


@dataclass(frozen=True)
class Need:
    """For one schedule and weight format: GPUs of the chosen kind whose memory together
    holds the plan's peak (an even split: a lower bound for sharding), the peak, and the
    longest context a single GPU holds."""

    schedule: str
    weights: str
    gpus: int
    peak_bytes: int
    longest: Longest
    longest_split: Longest | None = None  # on ``gpus`` GPUs (an even split), when one is not enough


def pooled(gpu: Gpu, count: int) -> Gpu:
    """``count`` GPUs as one whose usable memory is theirs together (weights and working set
    split evenly: the ideal a sharded run approaches)."""
    if count <= 1:
        return gpu
    return dataclasses.replace(gpu, name=f"{count} x {gpu.name}",
                               memory_bytes=count * gpu.memory_bytes - (count - 1) * RESERVED_BYTES)


def what_it_takes(shape: ModelShape, gpu: Gpu, schedules, settings: dict,
                  formats=tuple(WEIGHT_FORMATS)) -> list[Need]:
    """One Need per schedule and weight format, for the settings of a plan (tokens included)."""
    rest = {k: v for k, v in settings.items() if k != "tokens"}
    out = []
    for name in schedules:
        for weights in formats:
            quantized = with_weights(shape, weights)
            planned = plan(quantized, gpu, schedule=name, **settings)
            count = planned.gpus_needed
            split = longest_context(quantized, pooled(gpu, count), name, **rest) if count > 1 else None
            out.append(Need(name, weights, count, planned.peak_bytes, longest_context(quantized, gpu, name, **rest),
                            split))
    return out
