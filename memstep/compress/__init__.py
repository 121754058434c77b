"""Compression of the model itself: layer collapse (LaCo, ``laco.py``) and pruning with
reconstruction-error minimization (``sparse``). Each method is a process of steps that yields
plain-data step records (as the prefill engine does) and ends in a model folder that
``memstep.models.load_model`` loads like any other model."""

from __future__ import annotations

import os
from pathlib import Path

from memstep.models import cache_root


def compressed_root() -> Path:
    """Where the app saves compressed models (``$MEMSTEP_CACHE/compressed``). Folders under it
    are the only local folders a public app accepts besides the configured models."""
    return Path(os.environ.get("MEMSTEP_COMPRESSED", cache_root() / "compressed"))
