"""Output folders that never cost the user anything memstep did not make.

Before any work: an output folder must be new or empty (or ``--force``), its parent must
exist, and it must not be a file or a symbolic link; ``check_output_folder`` says so in one
line. The model is written into a fresh temporary sibling (``staged_folder``) and, when
complete, renamed to the output name; into an existing folder (empty, or ``--force``) its
files are moved one by one, replacing only files of the same names. On any failure (disk
full, permission denied, Stop) only the temporary folder memstep made in this run is removed.

A folder memstep created gets a marker file (``MARKER``) with when and by what it was made:
the app's store of compressed models cleans up only folders that carry it (ui/compressed.py).
The temporary folder carries its own marker (``PARTIAL_MARKER``) from its first moment: a save
killed outright (kill -9, power loss) leaves it behind, and the next save beside it removes
such folders once they are ``STALE_PARTIAL_SECONDS`` old, by the date the marker holds. Nothing
without that marker is ever removed.

A results folder (``memstep eval --output``) is checked by ``check_results_folder``: memstep
writes into it only when it is new, empty or marked as memstep's results; a folder holding files
memstep did not write is refused unless ``--force``. A single output file (``memstep run
--output``) is written by ``write_new_file``: a new file, or with ``--force`` a replaced one,
never half-written.
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
PARTIAL_MARKER = ".memstep-partial.json"  # inside a temporary folder, from its creation to its rename
STALE_PARTIAL_SECONDS = 6 * 3600  # a save takes minutes: a temporary folder this old was left by a killed one
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
        raise MemstepError(f"{option}: give a folder name (an empty name would write nowhere)")
    folder = expanded(raw, option)
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
    parent = expanded(str(folder), option).absolute().parent
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
    sweep_stale_partials(folder.absolute().parent)
    try:
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name[:60]}.", suffix=PARTIAL_SUFFIX,
                                        dir=folder.absolute().parent))
        (partial / PARTIAL_MARKER).write_text(json.dumps({"made_by": "memstep", "partial": True,
                                                          "created": time.time(), "pid": os.getpid()}))
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
    (partial / PARTIAL_MARKER).unlink(missing_ok=True)
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
    # An existing folder (empty, or --force): memstep's files replace files of the same names only.
    # Every destination is checked before the first file moves, so a refusal leaves it as it was.
    items = sorted(partial.iterdir())
    for item in items:
        destination = folder / item.name
        if destination.is_dir() and not destination.is_symlink():
            raise MemstepError(f"cannot write {item.name} into {shown(folder)}: a folder of that name is there "
                               "(nothing was written)")
    for item in items:
        os.replace(item, folder / item.name)
    partial.rmdir()


def partial_info(folder: Path) -> dict | None:
    """The marker of a temporary folder memstep made (None: not one of memstep's)."""
    if not folder.name.endswith(PARTIAL_SUFFIX) or not folder.name.startswith(".") or folder.is_symlink():
        return None
    try:
        info = json.loads((folder / PARTIAL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(info, dict) and info.get("made_by") == "memstep" and isinstance(info.get("created"), (int, float))
    return info if ok else None


def sweep_stale_partials(parent: Path, older_than: float = STALE_PARTIAL_SECONDS) -> list[str]:
    """Remove, in ``parent``, the temporary folders memstep's killed saves left behind (marked by
    PARTIAL_MARKER, created over ``older_than`` seconds ago by the date it holds); their names."""
    removed = []
    try:
        candidates = [p for p in Path(parent).iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    except OSError:
        return removed
    for folder in candidates:
        info = partial_info(folder)
        if info is not None and time.time() - info["created"] > older_than:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


# ---- results folders and single files --------------------------------------------------------------

def check_results_folder(path, writes, force: bool = False, option: str = "--output",
                         legacy=None, mark: bool = True) -> Path:
    """The results folder ``path``, checked before any work: new, empty, or memstep's own (its
    MARKER, or for a folder from before the marker ``legacy(folder)`` true) holding only the
    names in ``writes``; else refused unless ``force`` (then files of the same names are replaced,
    nothing else is touched). With ``mark``, creates the folder and marks it as memstep's."""
    raw = str(path)
    if not raw.strip() or "\0" in raw:
        raise MemstepError(f"{option}: give a folder name (an empty name would write into the current folder)")
    folder = expanded(raw, option)
    try:
        if folder.is_symlink():
            raise MemstepError(f"{option} {shown(raw)} is a symbolic link: give a folder memstep can create")
        if folder.exists() and not folder.is_dir():
            raise MemstepError(f"{option} {shown(raw)} is a file: give a folder name")
        entries = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    except OSError as err:
        raise MemstepError(f"{option} {shown(raw)}: {os_reason(err)}") from None
    own = not entries or _marked(folder) or (legacy is not None and legacy(folder))
    foreign = [name for name in entries if name != MARKER and (not own or name not in writes)]
    if foreign and not force:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise MemstepError(f"{option} {shown(raw)} holds files memstep did not write there ({listed}): give a new "
                           "or empty folder, or add --force to write beside them (files of the same names are "
                           "replaced)")
    if not mark:
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not _marked(folder):
            (folder / MARKER).write_text(json.dumps({"made_by": "memstep", "created": time.time(),
                                                     "results": True}))
    except OSError as err:
        raise MemstepError(f"{option} {shown(raw)}: {os_reason(err)}") from None
    return folder


def _marked(folder: Path) -> bool:
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("made_by") == "memstep"


def expanded(raw: str, option: str) -> Path:
    """``raw`` with a leading ~ or ~user expanded; ~name of no user on this machine is refused in one line
    (pathlib raises a RuntimeError for it)."""
    try:
        return Path(raw).expanduser()
    except RuntimeError:
        raise MemstepError(f"{option} {shown(raw)}: no user '{raw.split('/')[0][1:]}' on this machine for "
                           f"'{raw.split('/')[0]}': give the path without it") from None


def check_new_file(path, force: bool = False, option: str = "--output") -> Path:
    """An output file, checked before any work: a name, in an existing folder, not a folder or a
    link, and new unless ``force``."""
    raw = "" if path is None else str(path)
    if not raw.strip() or "\0" in raw:
        raise MemstepError(f"{option}: give a file name")
    target = expanded(raw, option)
    try:
        if target.is_symlink():
            raise MemstepError(f"{option} {shown(raw)} is a symbolic link: give a new file name")
        if target.is_dir():
            raise MemstepError(f"{option} {shown(raw)} is a folder: give a file name")
        if not target.absolute().parent.is_dir():
            raise MemstepError(f"{option} {shown(raw)}: the folder {shown(target.absolute().parent)} does not exist; "
                               "create it first")
        if target.is_file() and not force:  # (a device or a pipe, /dev/null or /dev/stdout, is written into)
            raise MemstepError(f"{option} {shown(raw)} exists: give a new file name, or add --force to replace it")
    except OSError as err:
        raise MemstepError(f"{option} {shown(raw)}: {os_reason(err)}") from None
    return target


def _link_new(temporary: Path, target: Path) -> None:
    """``temporary`` becomes ``target``, which must not exist: a hard link fails atomically when
    the name was taken meanwhile (a file system without hard links: checked, then renamed)."""
    try:
        os.link(temporary, target)
    except FileExistsError:
        raise
    except OSError:
        if target.exists():
            raise FileExistsError(target) from None
        os.replace(temporary, target)
        return
    temporary.unlink()


def write_new_file(path, text: str, force: bool = False, option: str = "--output") -> None:
    """Write ``text`` to the file ``path`` whole or not at all: into a temporary sibling first,
    then renamed (a new name; with ``force``, replacing the file)."""
    target = check_new_file(path, force, option)  # again: the file may have appeared during the work
    temporary = None
    try:
        if target.exists() and not target.is_file():  # a device or a pipe: nothing there to keep
            target.write_text(text, encoding="utf-8")
            return
        handle, name = tempfile.mkstemp(prefix=f".{target.name[:60]}.", suffix=".memstep-partial",
                                        dir=target.absolute().parent)
        temporary = Path(name)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        if force:
            os.replace(temporary, target)
        else:
            _link_new(temporary, target)
        temporary = None
    except FileExistsError:
        raise MemstepError(f"{option} {shown(path)} exists: give a new file name, or add --force to replace it") from None
    except OSError as err:
        raise MemstepError(f"cannot write {shown(path)}: {os_reason(err)}") from None
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
