"""memstep: chunked long-context prefill under a memory budget (FM, IM, IMDC)."""

from memstep.errors import MemstepError

__all__ = ["MemstepError"]
__version__ = "0.1.0"
