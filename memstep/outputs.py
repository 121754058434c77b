"""Output folders that never cost the user anything memstep did not make.

Before any work: an output folder must be new or empty (or ``--force``), its parent must
exist, and it must not be a file or a symbolic link; ``check_output_folder`` says so in one
line. The model is written into a fresh temporary sibling (``staged_folder``) and, when
complete, renamed to the output name. An existing folder (empty, or ``--force``) is replaced
whole (``_replace``): the files of the old folder that are not of a model's format are carried
into the new one first (hard links), then the old folder is renamed aside, the new one renamed
in and the old one removed; an error at any point leaves the user's folder as it was. On any
failure (disk full, permission denied, Stop) only the temporary folder made in this run is removed.

A folder memstep created gets a marker file (``MARKER``) with when and by what it was made:
the app's store of compressed models cleans up only folders that carry it (ui/compressed.py).
The temporary folder carries its own marker (``PARTIAL_MARKER``) from its first moment, locked
(flock) by the writing process until the publish ends. A save killed outright (kill -9, power
loss) leaves it behind with its lock released: the next memstep command that looks into that
parent (``sweep_partials``: every output check and save) removes it, whatever its age, after
putting back a user's folder that a publish had moved aside. Nothing without that marker is
ever removed.

A results folder (``memstep eval --output``) is checked by ``check_results_folder``: memstep
writes into it only when it is new, empty or marked as memstep's results; a folder holding files
memstep did not write is refused unless ``--force``; memstep marks only the folders it creates.
A single output file (``memstep run --output``) is written by ``write_new_file``: a new file, or
with ``--force`` a replaced one, never half-written.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from memstep.errors import MemstepError

try:
    import fcntl
except ImportError:  # not POSIX: temporary folders are judged by their PID and age
    fcntl = None

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
        sweep_partials(folder.absolute().parent)  # first: a publish killed midway puts the old folder back
        if folder.is_symlink():
            raise MemstepError(f"{option} {shown(raw)} is a symbolic link: give a folder memstep can create")
        if folder.exists():
            if not folder.is_dir():
                raise MemstepError(f"{option} {shown(raw)} is a file: give a new folder name")
            if not force and any(folder.iterdir()):
                raise MemstepError(f"{option} {shown(raw)} exists and is not empty: give a new or empty folder, "
                                   "or add --force to replace the model in it (its other files are kept)")
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
    its contents become ``target`` (``_publish``). On an error (or Stop) the temporary folder is
    removed and an OSError becomes one line (MemstepError)."""
    folder = check_output_folder(target, force)  # again: the folder may have changed during the work
    parent = folder.absolute().parent
    sweep_partials(parent)
    try:
        partial, lock = _new_partial(parent, folder.name)
    except OSError as err:
        raise MemstepError(f"cannot write {shown(target)}: {os_reason(err)}") from None
    try:
        yield partial
        _publish(partial, folder, info, force)
    except OSError as err:
        _drop(partial, folder)
        raise MemstepError(f"cannot write the model to {shown(target)}: {os_reason(err)}") from None
    except BaseException:
        _drop(partial, folder)
        raise
    finally:
        os.close(lock)  # the writer is gone: a sweep may take what is left


def _drop(partial: Path, folder: Path) -> None:
    """Remove a temporary folder after a failure; one holding the user's old folder (a publish
    interrupted between its renames) first puts that back, and where it cannot (the name was taken
    meanwhile) stays as it is: a later sweep puts it back once the name is free."""
    aside = partial / REPLACED
    if os.path.lexists(aside):
        try:
            os.rename(aside, folder)
        except OSError:
            return
    shutil.rmtree(partial, ignore_errors=True)


def _new_partial(parent: Path, name: str) -> tuple[Path, int]:
    """A fresh temporary folder in ``parent`` and the open descriptor of its marker, locked
    (flock) for as long as this process writes: a sweep removes the folder once the lock is free,
    that is once the process ended, however it ended (kill -9 included). The lock is taken before
    the marker holds memstep's JSON, so a marker a sweep can read always had its lock."""
    partial = Path(tempfile.mkdtemp(prefix=f".{name[:60]}.", suffix=PARTIAL_SUFFIX, dir=parent))
    try:
        lock = os.open(partial / PARTIAL_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    locked = _lock(lock)
    os.write(lock, json.dumps({"made_by": "memstep", "partial": True, "created": time.time(), "pid": os.getpid(),
                               "host": socket.gethostname(), "target": name, "locked": locked}).encode())
    return partial, lock


def _lock(descriptor: int) -> bool:
    """Hold an exclusive flock on the marker (False where the file system has none)."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _publish(partial: Path, folder: Path, info: dict | None, force: bool) -> None:
    """``partial`` becomes ``folder``: renamed at once where the name is free; an existing folder
    (empty, or ``--force``) is replaced whole (``_replace``)."""
    if not os.path.lexists(folder):
        marker = partial / MARKER
        marker.write_text(json.dumps({"made_by": "memstep", "created": time.time(), **(info or {})}))
        os.chmod(partial, 0o755)  # mkdtemp makes it private; a model folder is an ordinary folder
        try:
            os.rename(partial, folder)  # atomic: a half-written model never carries the name
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            marker.unlink()  # someone made the folder meanwhile: it is not memstep's
        else:
            (folder / PARTIAL_MARKER).unlink(missing_ok=True)
            return
    check_output_folder(folder, force)  # a folder filled during the work is refused, as before it
    _replace(partial, folder)


# Files of a saved model's format (transformers' weights, configs and tokenizer files): a publish
# into an existing folder removes these with the old folder, so an old sharded index never sits
# beside a new single-file model. Every other file the folder held is carried into the new one.
_MODEL_FILES = re.compile(r"(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens"
                          r"|preprocessor_config|chat_template)\.json|chat_template\.jinja|vocab\.json|vocab\.txt"
                          r"|merges\.txt|tokenizer\.model|memstep_compress\.json"
                          r"|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)"
                          r"|(model\.safetensors|pytorch_model\.bin)\.index\.json")
REPLACED = ".memstep-replaced"  # inside a temporary folder: the user's old folder while a publish swaps it


def model_file(name: str) -> bool:
    """Whether ``name`` is a file of a saved model's format (its weights, configs or tokenizer)."""
    return _MODEL_FILES.fullmatch(name) is not None


def _replace(partial: Path, folder: Path) -> None:
    """Replace the existing ``folder`` by ``partial`` in three renames: the old folder into the
    temporary one (``REPLACED``), the temporary one to the folder's name, then the old one removed.
    Before the first rename the files of the old folder that are not of the model's format and
    that the new model does not write are carried into the new folder (hard links: nothing is
    copied, nothing of the user's is lost). An error before the second rename puts the old folder
    back; a process killed between them leaves a temporary folder whose lock is free, and the
    next sweep (sweep_partials) puts the old folder back too."""
    written = {p.name for p in partial.iterdir()} - {PARTIAL_MARKER}
    for name in sorted(written):
        destination = folder / name
        if destination.is_dir() and not destination.is_symlink():
            raise MemstepError(f"cannot write {name} into {shown(folder)}: a folder of that name is there "
                               "(nothing was written)")
    for entry in sorted(folder.iterdir()):
        if entry.name not in written and entry.name not in (PARTIAL_MARKER, REPLACED) and not (
                model_file(entry.name) and entry.is_file() and not entry.is_symlink()):
            _carry(entry, partial / entry.name)
    os.chmod(partial, stat.S_IMODE(folder.stat().st_mode))
    aside = partial / REPLACED
    os.rename(folder, aside)
    try:
        _rename(partial, folder)
    except BaseException:
        try:
            os.rename(aside, folder)  # the user's folder as it was
        except OSError:
            raise MemstepError(f"{shown(folder)} was taken by another program while memstep replaced it: your "
                               f"old folder is kept whole at {shown(aside)}") from None
        raise
    shutil.rmtree(folder / REPLACED, ignore_errors=True)
    (folder / PARTIAL_MARKER).unlink(missing_ok=True)


def _rename(source: Path, target: Path) -> None:
    os.rename(source, target)  # (a seam for the tests that interrupt a publish between its renames)


def _carry(source: Path, target: Path) -> None:
    """``source`` (a file, a link or a folder of them) at ``target`` too, by hard links where the
    file system has them, else copied."""
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        target.mkdir()
        for entry in source.iterdir():
            _carry(entry, target / entry.name)
        shutil.copystat(source, target)
    elif source.is_file():
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    else:
        raise MemstepError(f"cannot carry {shown(source)} into the new folder: it is not a file, a folder or a "
                           "link (nothing was written)")


def partial_info(folder: Path) -> dict | None:
    """The marker of a temporary folder memstep made (None: not one of memstep's)."""
    if not folder.name.endswith(PARTIAL_SUFFIX) or not folder.name.startswith(".") or folder.is_symlink():
        return None
    return _marker_of(folder)


def _marker_of(folder: Path) -> dict | None:
    try:
        info = json.loads((folder / PARTIAL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(info, dict) and info.get("made_by") == "memstep" and isinstance(info.get("created"), (int, float))
    return info if ok else None


def writer_gone(folder: Path, info: dict) -> bool:
    """Whether the process that wrote a temporary folder has ended: its marker's lock is free (or,
    where the file system has no locks, its PID is gone from this machine); a marker from before
    the lock: once STALE_PARTIAL_SECONDS old, by the date it holds."""
    if info.get("locked") and fcntl is not None:
        try:
            descriptor = os.open(folder / PARTIAL_MARKER, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except OSError:
            return False  # held: the writer runs
        finally:
            os.close(descriptor)
    pid = info.get("pid")
    if isinstance(pid, int) and info.get("host") == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
    return time.time() - info["created"] > STALE_PARTIAL_SECONDS


def sweep_partials(parent: Path) -> list[str]:
    """What killed saves left in ``parent``, cleaned whatever its age: each temporary folder
    memstep made whose writer is gone is removed (after putting back the user's folder a publish
    had moved into it), and a folder a publish renamed in but did not finish loses the old folder
    it still holds. Nothing without memstep's marker is touched. The names cleaned."""
    cleaned = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return cleaned
    for entry in entries:
        folder = Path(entry.path)
        try:  # (a sibling this user cannot read is none of memstep's business)
            if not entry.is_dir(follow_symlinks=False):
                continue
            partial = folder.name.endswith(PARTIAL_SUFFIX)
            info = partial_info(folder) if partial else (
                _marker_of(folder) if (folder / PARTIAL_MARKER).is_file() else None)
            if info is None or not writer_gone(folder, info):
                continue
        except OSError:
            continue
        try:
            if partial:
                old, target = folder / REPLACED, Path(parent) / str(info.get("target", ""))
                if os.path.lexists(old):
                    if os.path.lexists(target) or not info.get("target") or "/" in info["target"]:
                        continue  # the name was taken since: the user's folder stays where it is
                    os.rename(old, target)  # the publish stopped between its renames: put it back
                shutil.rmtree(folder)
            else:  # the new folder was renamed in: finish its publish
                shutil.rmtree(folder / REPLACED, ignore_errors=True)
                (folder / PARTIAL_MARKER).unlink()
        except OSError:
            continue
        cleaned.append(folder.name)
    return cleaned


# ---- results folders and single files --------------------------------------------------------------

def check_results_folder(path, writes, force: bool = False, option: str = "--output",
                         legacy=None, mark: bool = True) -> Path:
    """The results folder ``path``, checked before any work: new, empty, or memstep's own (its
    MARKER, or for a folder from before the marker ``legacy(folder)`` true) holding only the
    names in ``writes``; else refused unless ``force`` (then files of the same names are replaced,
    nothing else is touched). With ``mark``, creates the folder; only a folder memstep creates here
    is marked as memstep's (one that existed, even empty or forced, stays the user's)."""
    raw = str(path)
    if not raw.strip() or "\0" in raw:
        raise MemstepError(f"{option}: give a folder name (an empty name would write into the current folder)")
    folder = expanded(raw, option)
    try:
        sweep_partials(folder.absolute().parent)
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
        folder.mkdir(parents=True)
    except FileExistsError:
        return folder  # the user's folder: written into, never marked
    except OSError as err:
        raise MemstepError(f"{option} {shown(raw)}: {os_reason(err)}") from None
    try:
        (folder / MARKER).write_text(json.dumps({"made_by": "memstep", "created": time.time(), "results": True}))
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
        sweep_partials(target.absolute().parent)
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
    the name was taken meanwhile (a file system without hard links: the name is claimed with an
    exclusive create, then the temporary file renamed over that claim)."""
    try:
        os.link(temporary, target)
    except FileExistsError:
        raise
    except OSError:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))  # FileExistsError when taken
        os.replace(temporary, target)
        return
    temporary.unlink()


def write_new_file(path, text: str, force: bool = False, option: str = "--output") -> None:
    """Write ``text`` to the file ``path`` whole or not at all: into a temporary folder beside it
    first (memstep's, swept like a model's when a kill leaves it), then renamed (a new name; with
    ``force``, replacing the file)."""
    target = check_new_file(path, force, option)  # again: the file may have appeared during the work
    partial = None
    try:
        if target.exists() and not target.is_file():  # a device or a pipe: nothing there to keep
            target.write_text(text, encoding="utf-8")
            return
        parent = target.absolute().parent
        sweep_partials(parent)
        partial, lock = _new_partial(parent, target.name)
        temporary = partial / "content"
        try:
            temporary.write_text(text, encoding="utf-8")
            os.chmod(temporary, 0o644)
            if force:
                os.replace(temporary, target)
            else:
                _link_new(temporary, target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
            os.close(lock)
    except FileExistsError:
        raise MemstepError(f"{option} {shown(path)} exists: give a new file name, or add --force to replace it") from None
    except OSError as err:
        raise MemstepError(f"cannot write {shown(path)}: {os_reason(err)}") from None
