"""Where memstep keeps what it makes: converted models and compressed models. A module of its
own so that ``models`` (which loads them) and ``compress`` (which saves them) both import it
without importing each other."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Converted models and cached answers (``$MEMSTEP_CACHE``, default ``~/.cache/memstep``)."""
    return Path(os.environ.get("MEMSTEP_CACHE", Path.home() / ".cache" / "memstep"))


def compressed_root() -> Path:
    """Where the app saves compressed models (``$MEMSTEP_COMPRESSED``, default
    ``$MEMSTEP_CACHE/compressed``). Folders under it are the only local folders a public app
    accepts besides the configured models."""
    return Path(os.environ.get("MEMSTEP_COMPRESSED", cache_root() / "compressed"))
