"""Uploads on a public app: read one at a time per visitor, bounded per visitor, never kept.

- Reads: a visitor (the client's address, ui/visitors.py) reads one upload at a time, and the app
  reads ``UPLOAD_CONCURRENCY`` at a time in all: one visitor's slow read holds one slot at most,
  so another visitor's upload always finds the other (and every read ends within the CPU its
  text allows: memstep.read_budget).
- Bytes: an ASGI middleware (``UploadBudget``) counts the bytes each address sends to Gradio's
  upload route; past ``UPLOAD_VISITOR_BYTES`` within ``UPLOAD_KEEP_SECONDS`` the upload is refused
  with status 429 before it is stored. An upload read into a visitor's document gives its bytes
  back (the file is gone: see below).
- Files: an upload is deleted as soon as it is read, whether it was read or refused (its text
  lives in the visitor's document state). Uploads never read (a script posting files, a page
  closed before its upload event) go with Gradio's own sweep of its cache (``delete_cache`` in
  ui/layout.py): every ``sweep_seconds()`` the files older than ``DOCUMENT_STATE_SECONDS`` go, when
  the document state of the visitor who could have read them has expired too.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from memstep.documents import DEFAULT_MAX_BYTES
from memstep.errors import MemstepError
from ui.visitors import visitor_key

MAX_UPLOAD_BYTES = int(os.environ.get("MEMSTEP_MAX_UPLOAD_BYTES", str(DEFAULT_MAX_BYTES)))
UPLOAD_CONCURRENCY = max(1, int(os.environ.get("MEMSTEP_UPLOAD_CONCURRENCY", "2")))
UPLOAD_WAIT_SECONDS = 15
# A session's document (the Run tab's state) is dropped this long after it was last set: Gradio drops a
# closed page's state, but a raw API client never sends the heartbeat that tells it a page closed.
# An upload nobody read is deleted as old (Gradio's cache sweep), and a visitor's upload bytes are
# counted over the same window: what one address holds on disk stays under its share.
DOCUMENT_STATE_SECONDS = int(os.environ.get("MEMSTEP_DOCUMENT_STATE_SECONDS", str(6 * 3600)))
UPLOAD_KEEP_SECONDS = DOCUMENT_STATE_SECONDS
UPLOAD_VISITOR_BYTES = int(float(os.environ.get("MEMSTEP_UPLOAD_VISITOR_MB", str(4 * MAX_UPLOAD_BYTES / 2**20)))
                           * 2**20)

_slots = threading.BoundedSemaphore(UPLOAD_CONCURRENCY)
_visitors: dict[str, list] = {}  # visitor -> [its lock, reads waiting or running] (only while it reads)
_visitors_lock = threading.Lock()


def sweep_seconds() -> int:
    """How often Gradio's cache sweep runs: a tenth of the keep time, between 1 s and a minute."""
    return max(1, min(60, UPLOAD_KEEP_SECONDS // 10))


@contextmanager
def reading_slot(visitor: str | None = None):
    """Hold a reading slot for ``visitor`` (by default the visitor of the request this thread
    serves): its earlier read first ends, then one of the app's slots is taken. A wait over
    UPLOAD_WAIT_SECONDS is refused in one line. Calls from inside the server (no visitor) only
    share the slots."""
    visitor = visitor_key() if visitor is None else visitor
    own = _enter(visitor) if visitor else None
    try:
        if own is not None and not own.acquire(timeout=UPLOAD_WAIT_SECONDS):
            own = None
            raise MemstepError("Your previous upload is still being read. Try this one again in a moment.")
        if not _slots.acquire(timeout=UPLOAD_WAIT_SECONDS):
            raise MemstepError("The server is busy reading other documents. Try the upload again in a moment.")
        try:
            yield
        finally:
            _slots.release()
    finally:
        _leave(visitor, own)


def _enter(visitor: str) -> threading.Lock:
    with _visitors_lock:
        entry = _visitors.setdefault(visitor, [threading.Lock(), 0])
        entry[1] += 1
        return entry[0]


def _leave(visitor: str, held: threading.Lock | None) -> None:
    if not visitor:
        return
    if held is not None:
        held.release()
    with _visitors_lock:
        entry = _visitors.get(visitor)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _visitors[visitor]  # the dict holds only visitors reading now


def visitors_reading() -> int:
    with _visitors_lock:
        return len(_visitors)


def discard(path: Path, upload_folder: Path, visitor: str | None = None) -> None:
    """Delete an upload that was read (only inside Gradio's upload folder: never a bundled example),
    with its folder when empty, and give its bytes back to the visitor's share."""
    try:
        if not path.resolve().is_relative_to(upload_folder):
            return
        size = path.stat().st_size
        path.unlink()
    except (OSError, ValueError):
        return
    try:
        path.parent.rmdir()  # Gradio keeps each upload in a folder of its own
    except OSError:
        pass
    LEDGER.give_back(visitor_key() if visitor is None else visitor, size)


class _Ledger:
    """Bytes each visitor uploaded over the last UPLOAD_KEEP_SECONDS."""

    def __init__(self):
        self._sent: dict[str, collections.deque] = {}
        self._lock = threading.Lock()

    def _purge(self, visitor: str, now: float) -> int:
        entries = self._sent.get(visitor)
        while entries and now - entries[0][0] > UPLOAD_KEEP_SECONDS:
            entries.popleft()
        if entries is not None and not entries:
            del self._sent[visitor]
            return 0
        return sum(n for _, n in entries) if entries else 0

    def charge(self, visitor: str, size: int) -> bool:
        """Count ``size`` bytes more for ``visitor``; False (nothing counted) when over its share."""
        now = time.monotonic()
        with self._lock:
            if self._purge(visitor, now) + size > UPLOAD_VISITOR_BYTES:
                return False
            self._sent.setdefault(visitor, collections.deque()).append([now, size])
            return True

    def give_back(self, visitor: str, size: int) -> None:
        """An upload of ``visitor`` that no longer takes disk space: its bytes leave the count."""
        with self._lock:
            for entry in reversed(self._sent.get(visitor, ())):
                taken = min(entry[1], size)
                entry[1] -= taken
                size -= taken
                if size <= 0:
                    break
            self._purge(visitor, time.monotonic())

    def used(self, visitor: str) -> int:
        with self._lock:
            return self._purge(visitor, time.monotonic())

    def clear(self) -> None:
        with self._lock:
            self._sent.clear()


LEDGER = _Ledger()


def over_share_message() -> str:
    share, hours = UPLOAD_VISITOR_BYTES / 2**20, UPLOAD_KEEP_SECONDS / 3600
    return (f"memstep: this upload would take your address past the {share:,.{0 if share >= 10 else 1}f} MiB one "
            f"visitor may upload in {hours:g} hours (uploads already read into a document do not count): try again "
            "later, or upload a smaller file")


class UploadBudget:
    """ASGI middleware: each address's bytes to Gradio's upload route, counted in LEDGER, are refused
    past its share (status 429) before Gradio stores them. A body sent without a Content-Length is
    counted as it arrives and cut off where it goes over; an upload Gradio refuses gives them back."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or \
                not scope.get("path", "").rstrip("/").endswith("/upload"):
            return await self.app(scope, receive, send)
        visitor = visitor_key(_ScopeRequest(scope))
        if not visitor:
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        charged = [0]

        async def answered(message):  # an upload Gradio did not store (too big, malformed): its bytes back
            if message.get("type") == "http.response.start" and message.get("status") != 200:
                LEDGER.give_back(visitor, charged[0])
            await send(message)

        if declared is not None:
            if not LEDGER.charge(visitor, declared):
                return await _refuse(send)
            charged[0] = declared
            return await self.app(scope, receive, answered)

        async def counted():
            message = await receive()
            if message.get("type") == "http.request":
                if not LEDGER.charge(visitor, len(message.get("body", b""))):
                    return {"type": "http.disconnect"}
                charged[0] += len(message.get("body", b""))
            return message

        return await self.app(scope, counted, answered)


class _ScopeRequest:
    """What ui.visitors reads from a request, from an ASGI scope (the address uvicorn gives it, and
    the headers a trusted proxy added)."""

    def __init__(self, scope):
        from starlette.datastructures import Headers

        client = scope.get("client")
        self.client = {"host": client[0]} if client else None
        self.headers = Headers(scope=scope)


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return max(0, int(value))
            except ValueError:
                return None
    return None


async def _refuse(send) -> None:
    body = over_share_message().encode("utf-8")
    await send({"type": "http.response.start", "status": 429,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

