"""Output folders that never cost the user anything memstep did not make.

Before any work: an output folder must be new or empty (or ``--force``), its parent must
exist, and it must not be a file or a symbolic link; ``check_output_folder`` says so in one
line. The model is written into a fresh temporary sibling (``staged_folder``) and, when
complete, renamed to the output name; into an existing folder (empty, or ``--force``) its
files are moved one by one, replacing only files of the same names. On any failure (disk
full, permission denied, Stop) only the temporary folder memstep made in this run is removed.

A folder memstep created gets a marker file (``MARKER``) with when and by what it was made:
the app's store of compressed models cleans up only folders that carry it (ui/space.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from memstep.errors import MemstepError

MARKER = ".memstep-output.json"
PARTIAL_SUFFIX = ".memstep-partial"
_local = threading.local()

_REASONS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
            errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.ENAMETOOLONG: "the file name is too long", errno.EROFS: "the file system is read-only",
            errno.ENOENT: "no such file or folder", errno.ENOTDIR: "a part of the path is not a folder",
            errno.EISDIR: "it is a folder", errno.ELOOP: "too many symbolic links",
            errno.ENOTEMPTY: "the folder is not empty", errno.EEXIST: "it exists already"}


def os_reason(err: OSError) -> str:
    """A short reason for an OS error, without the path (the caller names what failed)."""
    return _REASONS.get(err.errno) or (err.strerror or type(err).__name__).lower()


def shown(path) -> str:
    """A path as a message shows it: whole when short, else its start and end."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}…{text[-40:]}"


@contextmanager
def forced(path):
    """The command line's ``--force``: inside this block (this thread), an existing non-empty
    ``path`` may be written into. None: nothing is forced."""
    previous = getattr(_local, "forced", None)
    _local.forced = None if path is None else _key(path)
    try:
        yield
    finally:
        _local.forced = previous


def _key(path) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def _is_forced(path: Path) -> bool:
    return getattr(_local, "forced", None) == _key(path)


def check_output_folder(path, force: bool = False, option: str = "--output") -> Path:
    """The output folder ``path``, checked before any work; MemstepError with one line when it
    exists and is not empty (unless ``force``), is a file or a link, or its parent is missing
    or not writable."""
    raw = str(path)
    if not raw.strip() or "\0" in raw:
        raise MemstepError(f"{option}: give a folder name")
    folder = Path(raw).expanduser()
    force = force or _is_forced(folder)
    try:
        if folder.is_symlink():
            raise MemstepError(f"{option} {shown(raw)} is a symbolic link: give a folder memstep can create")
        if folder.exists():
            if not folder.is_dir():
                raise MemstepError(f"{option} {shown(raw)} is a file: give a new folder name")
            if not force and any(folder.iterdir()):
                raise MemstepError(f"{option} {shown(raw)} exists and is not empty: give a new or empty folder, "
                                   "or add --force to write the model's files into it (nothing else in it is "
                                   "removed)")
        parent = folder.absolute().parent
        if parent.exists() and not parent.is_dir():
            raise MemstepError(f"{option} {shown(raw)}: {shown(parent)} is a file, not a folder")
        if not parent.is_dir():
            raise MemstepError(f"{option} {shown(raw)}: the folder {shown(parent)} does not exist; create it first")
        if not os.access(parent, os.W_OK | os.X_OK) or (folder.exists() and not os.access(folder, os.W_OK | os.X_OK)):
            raise MemstepError(f"{option} {shown(raw)}: permission denied")
    except OSError as err:  # a name too long, a path through a file, ...
        raise MemstepError(f"{option} {shown(raw)}: {os_reason(err)}") from None
    if len(folder.name.encode("utf-8", "surrogateescape")) > 200:  # room for the temporary sibling's name
        raise MemstepError(f"{option} {shown(raw)}: the folder name is too long (at most 200 bytes)")
    return folder


def check_free_space(folder, needed_bytes: int, option: str = "--output") -> None:
    """Refuse, before the work, an output that cannot fit on its disk."""
    parent = Path(folder).expanduser().absolute().parent
    try:
        free = shutil.disk_usage(parent).free
    except OSError:
        return  # the save itself will say why
    if free < needed_bytes:
        raise MemstepError(f"{option} {shown(folder)}: the disk has {free / 2**20:,.0f} MiB free, the model needs "
                           f"about {needed_bytes / 2**20:,.0f} MiB")


@contextmanager
def staged_folder(target, info: dict | None = None, force: bool = False):
    """Yield a fresh temporary folder beside ``target``; when the block ends without an error
    its contents become ``target``. On an error (or Stop) the temporary folder is removed and
    an OSError becomes one line (MemstepError)."""
    folder = check_output_folder(target, force)  # again: the folder may have changed during the work
    try:
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name[:60]}.", suffix=PARTIAL_SUFFIX,
                                        dir=folder.absolute().parent))
    except OSError as err:
        raise MemstepError(f"cannot write {shown(target)}: {os_reason(err)}") from None
    try:
        yield partial
        _publish(partial, folder, info, force)
    except OSError as err:
        shutil.rmtree(partial, ignore_errors=True)
        raise MemstepError(f"cannot write the model to {shown(target)}: {os_reason(err)}") from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _publish(partial: Path, folder: Path, info: dict | None, force: bool) -> None:
    if not folder.exists():
        (partial / MARKER).write_text(json.dumps({"made_by": "memstep", "created": time.time(), **(info or {})}))
        os.chmod(partial, 0o755)  # mkdtemp makes it private; a model folder is an ordinary folder
        try:
            os.rename(partial, folder)  # atomic: a half-written model never carries the name
            return
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            (partial / MARKER).unlink()  # someone made the folder meanwhile: it is not memstep's
    check_output_folder(folder, force)  # a folder filled during the work is refused, as before it
    # an existing folder (empty, or --force): memstep's files replace files of the same names only
    for item in partial.iterdir():
        destination = folder / item.name
        if destination.is_dir() and not destination.is_symlink():
            raise MemstepError(f"cannot write {item.name} into {shown(folder)}: a folder of that name is there")
        os.replace(item, destination)
    partial.rmdir()
