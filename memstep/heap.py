"""Hand the process's freed heap memory back to the operating system between prefill steps.

Every step of a long run allocates tensors of new sizes (the memory grows a few entries
per step, the chunk may shrink), and glibc keeps what they free in its heap, in pieces the
next step's sizes may not fit, so the resident memory of a long run creeps up while what it
holds stays flat (a 128k-token run of a small model ended 28 MB lower with the trim).
``malloc_trim(0)`` returns the free pages (well under a millisecond here; a step of a real
model takes seconds). Elsewhere (macOS, musl, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim() -> bool:
    """Return freed heap memory to the system; False where the C library has no way to."""
    call = _malloc_trim()
    if call is None:
        return False
    call(0)  # 1 if it released memory, 0 if there was none to release
    return True
