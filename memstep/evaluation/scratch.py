"""Scratch folders under the temporary directory that a killed process cannot leave behind: each is
locked while its owner lives (a lock the kernel drops with the process, kill -9 included), and the
next one made with the same prefix removes every unlocked one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def holders(folder: Path) -> list[int]:
    """The processes with a file open under ``folder`` (Linux's /proc; none found elsewhere)."""
    found = []
    for fds in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd).startswith(str(folder) + os.sep) for fd in fds.iterdir()):
                found.append(int(fds.parent.name))
    return [pid for pid in found if pid != os.getpid()]


def clean_stale(root: Path, prefix: str) -> list[Path]:
    """Remove the ``prefix`` folders under ``root`` whose owner is gone (its lock not held), and any
    process still writing into one."""
    removed = []
    for folder in root.glob(prefix + "*"):
        if not folder.is_dir():
            continue
        try:
            with open(folder / "lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while its owner lives
                for pid in holders(folder):
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except OSError:
            continue  # a live owner's folder, or not one we may touch
    return removed


@contextlib.contextmanager
def locked_folder(root: Path, prefix: str, name: str | None = None) -> Iterator[Path]:
    """A folder ``root/prefix<name>`` (``name``: a random one when None), locked while the block runs
    and removed after it; the stale ones of its prefix go first."""
    clean_stale(root, prefix)
    making = Path(tempfile.mkdtemp(prefix="making-" + prefix, dir=root))
    lock = open(making / "lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if name is None:
            name = making.name.removeprefix("making-" + prefix)
        folder = root / f"{prefix}{name}"
        shutil.rmtree(folder, ignore_errors=True)  # (an earlier owner's of this name, already unlocked)
        making.rename(folder)  # only a locked folder ever has the name a cleaner looks for
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(making, ignore_errors=True)  # (gone already unless the rename failed)
        lock.close()
