"""Read a document in a child process that a CPU limit, a memory limit and a Stop all end.

pypdf's parsing and decompression cannot be interrupted from outside, and a crafted file can
make them cost minutes (a page whose content stream inflates to megabytes of operators). So
the extraction (memstep.documents.read_document_bytes, under its ReadLimits) runs in a child
Python: its work and CPU follow the text it yields (memstep.read_budget: counted by the parsers,
and a watchdog thread that interrupts the read when its CPU is over what its text allows), with
``resource.setrlimit`` under that: RLIMIT_CPU at the most the text it may yield allows, RLIMIT_AS
for its memory. The parent polls it every ``POLL_SECONDS`` so a Stop, a closed page or a
cancelled request (``should_stop``, or this thread's memstep.cancel flag) kills it at once, and
a wall-clock bound ends it on a machine too loaded to reach the CPU limit in time.
Whatever the child allocated is gone with it: a read leaves nothing behind in the parent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import BinaryIO
from pathlib import Path

from memstep.cancel import current_flag
from memstep.documents import DEFAULT_MAX_BYTES, ReadLimits, check_extension, too_big, read_document_bytes
from memstep.read_budget import Watchdog
from memstep.errors import MemstepError

POLL_SECONDS = 0.1
WALL_FACTOR = 4  # a loaded machine gives the child a share of a core: its wall-clock bound...
WALL_EXTRA_SECONDS = 10  # ...plus its start
_ROOT = str(Path(__file__).resolve().parent.parent)  # where the child imports memstep from
_TEXT, _ERROR, _MEMORY = b"T", b"E", b"M"
SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []  # not the current folder first: memstep from _ROOT


def read_document(path_or_dash: str | Path, *, stdin: BinaryIO | None = None,
                  max_bytes: int = DEFAULT_MAX_BYTES, limits: ReadLimits | None = None) -> str:
    """Text of a .txt/.md/.pdf/.html/.htm file, or of standard input for "-" (read as text),
    extracted in a child process under ``limits`` (memstep.reading).

    `stdin` replaces sys.stdin (a binary or text stream), for tests and embedding."""
    limits = limits or ReadLimits()
    if str(path_or_dash) == "-":
        stream = stdin if stdin is not None else sys.stdin
        stream = getattr(stream, "buffer", stream)  # sys.stdin is text; read its bytes
        data = stream.read(max_bytes + 1)  # one byte more is enough to detect "too big"
        if isinstance(data, str):
            data = data.encode("utf-8")
        return read_isolated(data, "stdin.txt", max_bytes=max_bytes, limits=limits)

    path = Path(path_or_dash)
    if not path.exists():
        raise MemstepError(f"File not found: {path}. Check the path and try again.")
    if not path.is_file():
        raise MemstepError(f"{path} is not a file. Pass a document file, or '-' for stdin.")
    check_extension(path.name)
    size = path.stat().st_size  # check before reading, so a huge file is never loaded
    if size > max_bytes:
        raise MemstepError(too_big(path.name, size, max_bytes))
    try:
        data = path.read_bytes()
    except OSError as err:
        raise MemstepError(f"Cannot read {path}: {err.strerror}. Check its permissions.")
    return read_isolated(data, path.name, max_bytes=max_bytes, limits=limits)


def read_isolated(data: bytes, filename: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                  limits: ReadLimits | None = None, should_stop: Callable[[], bool] | None = None) -> str:
    """The text of ``data`` (a file named ``filename``), as read_document_bytes reads it, in a
    child process; MemstepError with one line when a limit ends it or it was stopped."""
    limits = limits or ReadLimits()
    if len(data) > max_bytes or not _can_isolate():
        return read_document_bytes(data, filename, max_bytes=max_bytes, limits=limits)  # (refused at once)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile() as source:  # (a pipe would need a writer thread: communicate()
        source.write(data)                     # cannot resume sending input after a timeout)
        source.seek(0)
        child = subprocess.Popen([sys.executable, *SAFE_PATH, "-m", "memstep.reading", filename,
                                  json.dumps({**dataclasses.asdict(limits), "max_bytes": max_bytes})],
                                 stdin=source, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    started = time.monotonic()
    deadline = started + WALL_FACTOR * limits.hard_cpu_seconds() + WALL_EXTRA_SECONDS
    flag = current_flag()
    try:
        while True:
            try:
                out, _ = child.communicate(timeout=POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                pass
            if (flag is not None and flag.cancelled) or (should_stop is not None and should_stop()):
                raise MemstepError(f"reading {filename} was stopped")
            if time.monotonic() > deadline:  # a machine so loaded the CPU limit is not reached in time
                raise MemstepError(f"{filename}: reading it took over {deadline - started:.0f} seconds of wall-clock "
                                   f"time (the time limit per document: {WALL_FACTOR} x its "
                                   f"{limits.hard_cpu_seconds()} CPU seconds + {WALL_EXTRA_SECONDS:g}) on a machine "
                                   "this loaded: try again when it is less busy, or upload a .txt version")
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    if out.startswith(_TEXT):
        return out[1:].decode("utf-8", "surrogatepass")
    if out.startswith(_ERROR):
        raise MemstepError(out[1:].decode("utf-8", "replace"))
    if out.startswith(_MEMORY):
        raise MemstepError(f"{filename}: reading it needs over {limits.memory_bytes / 2**30:g} GiB of memory (the "
                           "memory limit per document): upload an excerpt or a .txt version")
    if child.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise _over_cpu(filename, limits)
    raise MemstepError(f"cannot read {filename}: the reading process ended with code {child.returncode}; "
                       "convert it to .txt")


def _over_cpu(filename: str, limits: ReadLimits) -> MemstepError:
    return MemstepError(f"{filename}: reading it took over {limits.hard_cpu_seconds()} CPU seconds, its process's "
                        "start included (the hard CPU limit of the reading process): upload an excerpt or a .txt "
                        "version")


def _can_isolate() -> bool:
    try:
        import resource  # noqa: F401  (POSIX only: elsewhere the limits of ReadLimits still hold)
    except ImportError:
        return False
    return bool(sys.executable)


def _child(filename: str, settings: str) -> None:
    import resource

    options = json.loads(settings)
    max_bytes = options.pop("max_bytes")
    limits = ReadLimits(**options)
    cpu = limits.hard_cpu_seconds()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL at the hard
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    data = sys.stdin.buffer.read()
    watchdog = Watchdog()
    try:
        with watchdog:
            text = read_document_bytes(data, filename, max_bytes=max_bytes, limits=limits, watchdog=watchdog)
        out = _TEXT + text.encode("utf-8", "surrogatepass")
    except KeyboardInterrupt:  # the watchdog's, just as the read ended
        out = _ERROR + (watchdog.fired or f"reading {filename} was interrupted").encode("utf-8", "surrogatepass")
    except MemstepError as err:
        out = _ERROR + str(err).encode("utf-8", "surrogatepass")
    except MemoryError:
        out = _MEMORY
    except Exception as err:  # noqa: BLE001 - a parser's failure on a crafted file: one line for the parent
        out = _ERROR + f"cannot read {filename} ({type(err).__name__}): convert it to .txt".encode(
            "utf-8", "surrogatepass")
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
