"""Long jobs of the app (compression) that really stop when they are stopped.

Gradio cannot interrupt a generator while it computes: a cancelled event's generator is closed
only after its current ``next()`` returns, and a LaCo probe or a pruned block takes minutes.
So the work runs in a thread of its own under a memstep.cancel flag, and the event's generator
only relays what the work yields, waking at least every ``HEARTBEAT_SECONDS``. Stop, a cancelled
request and a visitor who leaves all end in the generator being closed (or Stop setting the flag
directly): the flag is set and the work ends at its next checkpoint, within seconds.

One model-heavy job at a time in this process: a job holds ``MODEL_LOCK`` until its thread has
really ended, so the next run never shares the model with a job that is still unwinding.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from memstep.cancel import CancelFlag, Cancelled, cancel_scope
from memstep.errors import MemstepError

HEARTBEAT_SECONDS = 1.0
LOCK_SECONDS = 120  # how long a job waits for a stopped one to finish unwinding
MODEL_LOCK = threading.Lock()  # one model-heavy job (prefill, compression) at a time in this process
HEARTBEAT = object()  # what stream() yields when the work said nothing for a heartbeat

_flags: dict[str, CancelFlag] = {}  # session -> the flag of its running job (bounded: running jobs only)
_flags_lock = threading.Lock()


def session_of(request) -> str:
    """The session hash of a Gradio request ("" when there is none)."""
    return getattr(request, "session_hash", None) or ""


def stop(session: str) -> bool:
    """Stop pressed: the session's running job (if any) ends at its next checkpoint."""
    with _flags_lock:
        flag = _flags.get(session)
    if flag is not None:
        flag.cancel("stopped")
    return flag is not None


def running_jobs() -> int:
    """Job threads still alive (a test checks that a stopped job really ended)."""
    return sum(1 for t in threading.enumerate() if t.name.startswith("memstep-job") and t.is_alive())


def stream(work: Callable[[], Iterable], session: str = "", heartbeat: float = HEARTBEAT_SECONDS) -> Iterator:
    """Run ``work()`` (an iterable) in a thread under a cancel flag and yield its items, or
    HEARTBEAT when nothing came for ``heartbeat`` seconds. Raises what the work raised;
    Cancelled when it was stopped. Closing this generator cancels the work."""
    flag = CancelFlag()
    items: queue.Queue = queue.Queue()

    def run() -> None:
        with cancel_scope(flag):
            if not MODEL_LOCK.acquire(timeout=LOCK_SECONDS):
                items.put(("error", MemstepError("the model is still busy with a stopped job: try again in a "
                                                 "moment")))
                return
            try:
                for item in work():
                    flag.check()
                    items.put(("item", item))
                items.put(("done", None))
            except Cancelled:
                items.put(("cancelled", None))
            except BaseException as err:  # noqa: BLE001 - handed to the event, which reports it
                items.put(("error", err))
            finally:
                MODEL_LOCK.release()

    with _flags_lock:
        if session:
            _flags[session] = flag
    thread = threading.Thread(target=run, name=f"memstep-job-{time.monotonic_ns()}", daemon=True)
    thread.start()
    try:
        while True:
            try:
                kind, value = items.get(timeout=heartbeat)
            except queue.Empty:
                yield HEARTBEAT
                continue
            if kind == "item":
                yield value
            elif kind == "done":
                return
            elif kind == "cancelled":
                raise Cancelled(flag.reason)
            else:
                raise value
    finally:
        flag.cancel("closed")  # Stop, a cancelled request or a visitor gone: the work stops
        with _flags_lock:
            if _flags.get(session) is flag:
                del _flags[session]
