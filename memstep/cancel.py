"""Cancellation of long jobs (compression, evaluation, prefills driven by the app).

A job runs inside ``with cancel_scope(flag):`` in its own thread; the loops of the library
call ``checkpoint()`` between blocks, steps and candidates. When the flag is set (Stop
pressed, the request cancelled, the visitor gone) the next checkpoint raises ``Cancelled``
and the job unwinds within one step. Outside a scope (the command line, tests, benchmarks)
``checkpoint()`` costs one attribute read and never raises: Ctrl+C stops those.

The flag is per thread on purpose: the app's jobs run in a thread the app starts (see
ui/jobs.py), so no other request's work can see or trip another's flag.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

_local = threading.local()


class Cancelled(Exception):
    """The job's flag was set: the job stops where it is (not a user error)."""


class CancelFlag:
    """Set once (by any thread); read by the job at each checkpoint."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.reason)


@contextmanager
def cancel_scope(flag: CancelFlag):
    """Make ``flag`` the one ``checkpoint()`` reads in this thread for the duration."""
    previous = getattr(_local, "flag", None)
    _local.flag = flag
    try:
        yield flag
    finally:
        _local.flag = previous


def current_flag() -> CancelFlag | None:
    return getattr(_local, "flag", None)


def checkpoint() -> None:
    """Raise Cancelled when this thread's job was cancelled; otherwise nothing."""
    flag = getattr(_local, "flag", None)
    if flag is not None and flag.cancelled:
        raise Cancelled(flag.reason)


def stop_on_cancel():
    """For ``generate(stopping_criteria=...)``: generation stops at the next token once this
    thread's job is cancelled (the caller's next checkpoint() then raises)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    flag = current_flag()

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            import torch

            stop = flag is not None and flag.cancelled
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_Stop()])
