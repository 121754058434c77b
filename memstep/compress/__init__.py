"""Compression of the model itself: layer collapse (LaCo, ``laco.py``) and pruning with
reconstruction-error minimization (``sparse``). Each method is a process of steps that yields
plain-data step records (as the prefill engine does) and ends in a model folder that
``memstep.models.load_model`` loads like any other model."""

from __future__ import annotations

from memstep.paths import compressed_root

__all__ = ["compressed_root"]
