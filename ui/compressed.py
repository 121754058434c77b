"""Where the app keeps the models its Compress tab makes, and who may load them.

- Locally (the default) the app compresses into ``memstep.paths.compressed_root()`` and the
  Run tab loads a compressed model by its folder, like any model.
- In a public app (a Hugging Face Space, or any app with MEMSTEP_ALLOWED_MODELS) compression is
  off unless ``MEMSTEP_SPACE_COMPRESS=1``. When on, each session compresses into a folder of its
  own, ``compressed_root()/sessions/<id>``, where the id is a keyed hash of the session; the Run
  tab names such a model by a token, ``compressed:<id>/<name>``, which loads only for the session
  whose id it carries. Messages name the model, never a server path.
- Locally, the models memstep made there (marked by memstep.outputs.MARKER) share a disk quota
  (``MEMSTEP_COMPRESS_QUOTA_MB``, default 4096): before a run, the oldest are removed until the
  new one fits. In a public app each visitor has a share of it
  (``MEMSTEP_COMPRESS_VISITOR_QUOTA_MB``, default 1024), keyed by the client's address
  (ui/visitors.py), never by the session hash the client sends: however many sessions one
  address makes up, together they hold at most that share, and a run removes only that visitor's
  older models: one visitor never evicts another's. Another visitor's models go only once they
  are ``MEMSTEP_COMPRESS_TTL_HOURS`` old (default 24, by the date in their marker); when the
  app's whole quota is still taken, the run is refused. Nothing without the marker is ever
  removed (temporary folders: their own marker, memstep.outputs.PARTIAL_MARKER, removed once
  the process writing them is gone).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import threading
import time
from pathlib import Path

from memstep.errors import MemstepError
from memstep.models import allowed_models
from memstep.outputs import MARKER, partial_info, writer_gone
from memstep.paths import compressed_root
from ui.visitors import visitor_key

TOKEN_PREFIX = "compressed:"
QUOTA_BYTES = int(float(os.environ.get("MEMSTEP_COMPRESS_QUOTA_MB", "4096")) * 2**20)
# (MEMSTEP_COMPRESS_SESSION_QUOTA_MB: this setting's name before it was keyed by the visitor's address)
VISITOR_QUOTA_BYTES = int(float(os.environ.get("MEMSTEP_COMPRESS_VISITOR_QUOTA_MB",
                                               os.environ.get("MEMSTEP_COMPRESS_SESSION_QUOTA_MB", "1024"))) * 2**20)
MODEL_TTL_SECONDS = float(os.environ.get("MEMSTEP_COMPRESS_TTL_HOURS", "24")) * 3600
_SECRET = secrets.token_bytes(32)  # session ids are keyed: one cannot be derived from a session hash alone
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$")
_lock = threading.Lock()  # one cleanup or reservation at a time
_in_use: set[Path] = set()  # folders a running job writes: never cleaned up


def public_app() -> bool:
    """A Space or an app restricted to a model list: every visitor is a stranger."""
    return allowed_models() is not None


def compress_enabled() -> bool:
    """Compression runs in a public app only when its operator turns it on."""
    if not public_app():
        return True
    return os.environ.get("MEMSTEP_SPACE_COMPRESS", "").strip().lower() in ("1", "true", "yes", "on")


DISABLED = ("Compression is off in this public app: it holds the only run slot for minutes. Run memstep "
            "locally, or set MEMSTEP_SPACE_COMPRESS=1 on your own Space to turn it on.")


def check_enabled() -> None:
    if not compress_enabled():
        raise MemstepError(DISABLED)


def session_id(session: str | None) -> str:
    """The folder id of a session (empty: no session, so no folder of its own)."""
    if not session:
        return ""
    return hmac.new(_SECRET, session.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:24]


VISITOR_FILE = ".memstep-visitor.json"  # in a session's folder: the visitor (address key) it belongs to


def store_folder(session: str | None, visitor: str | None = None) -> Path:
    """Where this session's compressed models go (created on first use, recording in a public app
    the visitor it belongs to: ``visitor``, else the visitor of the request this thread serves)."""
    root = compressed_root()
    if public_app():
        sid = session_id(session)
        if not sid:
            raise MemstepError("compression needs a browser session: open the app's page")
        root = root / "sessions" / sid
        root.mkdir(parents=True, exist_ok=True)
        if folder_visitor(root) is None:  # a session stays with the visitor that opened it
            (root / VISITOR_FILE).write_text(json.dumps({"made_by": "memstep", "visitor": _visitor(visitor, session)}))
        return root
    root.mkdir(parents=True, exist_ok=True)
    return root


def _visitor(visitor: str | None, session: str | None) -> str:
    """The visitor a quota counts: the given key, else the address of the request this thread
    serves; a call from inside the server (no address) counts as its session."""
    return visitor or visitor_key() or f"session:{session_id(session)}"


def folder_visitor(session_folder: Path) -> str | None:
    """The visitor a session's folder belongs to (None: not recorded)."""
    try:
        info = json.loads((session_folder / VISITOR_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info.get("visitor") if isinstance(info, dict) and isinstance(info.get("visitor"), str) else None


def made_by_memstep(folder: Path) -> dict | None:
    """The marker memstep wrote in a folder it created (None: not memstep's)."""
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("made_by") == "memstep" else None


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            pass
    return total


def _managed() -> list[tuple[float, Path, int]]:
    """(created, folder, bytes) of every folder memstep made in the store, oldest first, and
    the temporary folders whose writing process is gone (memstep.outputs.writer_gone)."""
    root = compressed_root()
    found = []
    for folder in [*root.glob("*"), *root.glob("sessions/*/*")]:
        if not folder.is_dir() or folder.is_symlink():
            continue
        info = made_by_memstep(folder)
        if info is not None:
            found.append((float(info.get("created", 0)), folder, _size(folder)))
        elif (partial := partial_info(folder)) is not None and writer_gone(folder, partial):
            found.append((float(partial["created"]), folder, _size(folder)))
    return sorted(set(found), key=lambda row: row[0])


def make_room(needed_bytes: int, quota_bytes: int | None = None, session: str | None = None,
              visitor: str | None = None) -> list[str]:
    """Make room for ``needed_bytes`` more; the names of the folders removed. Locally: the oldest
    models memstep made in the store go until the new one fits the quota. In a public app: only
    the visitor's own older models (in any of its sessions) go to fit its VISITOR_QUOTA_BYTES;
    other visitors' models go only once past MODEL_TTL_SECONDS; a run that still does not fit is
    refused. ``visitor``: the visitor's key (ui/visitors.py), by default that of the request this
    thread serves."""
    quota = QUOTA_BYTES if quota_bytes is None else quota_bytes
    if needed_bytes > quota:
        raise MemstepError(f"this model needs about {needed_bytes / 2**20:,.0f} MiB, over the app's "
                           f"{quota / 2**20:,.0f} MiB for compressed models")
    if not public_app():
        with _lock:
            rows = [row for row in _managed() if row[1] not in _in_use]
            used = sum(size for _, _, size in rows) + sum(_size(f) for f in _in_use if f.exists())
            return _remove_oldest(rows, used, needed_bytes, quota)
    own_quota = min(VISITOR_QUOTA_BYTES, quota)
    if needed_bytes > own_quota:
        raise MemstepError(f"this model needs about {needed_bytes / 2**20:,.0f} MiB, over the "
                           f"{own_quota / 2**20:,.0f} MiB this app keeps per visitor for compressed models")
    visitor = _visitor(visitor, session)
    store_folder(session, visitor)
    with _lock:
        owners: dict[Path, str | None] = {}

        def mine(folder: Path) -> bool:
            if folder.parent not in owners:
                owners[folder.parent] = folder_visitor(folder.parent)
            return owners[folder.parent] == visitor

        rows = [row for row in _managed() if row[1] not in _in_use]
        busy = sum(_size(f) for f in _in_use if f.exists())
        own = [row for row in rows if mine(row[1])]
        own_busy = sum(_size(f) for f in _in_use if f.exists() and mine(f))
        own_used = sum(size for _, _, size in own) + own_busy
        removed = _remove_oldest(own, own_used, needed_bytes, own_quota)
        own_used = sum(size for _, folder, size in own if folder.exists()) + own_busy
        if own_used + needed_bytes > own_quota:  # the rest is in use by this visitor's running jobs
            raise MemstepError(f"your compressed models take {own_used / 2**20:,.0f} MiB of the "
                               f"{own_quota / 2**20:,.0f} MiB this app keeps per visitor, and the ones left are in "
                               "use: wait for your running compression to end")
        rows = [row for row in rows if row[1].exists()]
        expired = [row for row in rows if not mine(row[1])
                   and (time.time() - row[0] > MODEL_TTL_SECONDS or partial_info(row[1]) is not None)]
        removed += _remove_oldest(expired, sum(size for _, _, size in rows) + busy, needed_bytes, quota)
        used = sum(size for _, folder, size in rows if folder.exists()) + busy
        if used + needed_bytes > quota:
            raise MemstepError(f"the app's {quota / 2**20:,.0f} MiB for compressed models are taken by other "
                               f"visitors' models (each kept {MODEL_TTL_SECONDS / 3600:g} h): try again later, or "
                               "run memstep locally")
    return removed


def _remove_oldest(rows, used: int, needed_bytes: int, quota: int) -> list[str]:
    """Remove ``rows`` (oldest first) until ``used`` + ``needed_bytes`` fit ``quota``; their names."""
    removed = []
    for _, folder, size in rows:
        if used + needed_bytes <= quota:
            break
        shutil.rmtree(folder, ignore_errors=True)
        used -= size
        removed.append(folder.name)
    return removed


class Reservation:
    """A folder name in the store for one run: an earlier model of the same name (memstep's,
    from an earlier run) is replaced; anything else keeps its name and the run takes another."""

    def __init__(self, session: str | None, name: str, needed_bytes: int, visitor: str | None = None):
        if not _NAME.match(name):
            raise MemstepError(f"not a folder name for a compressed model: {name[:80]!r}")
        visitor = _visitor(visitor, session) if public_app() else visitor
        folder = store_folder(session, visitor)
        self.removed = make_room(needed_bytes, session=session, visitor=visitor)
        with _lock:
            path, n = folder / name, 1
            while path.exists() or path in _in_use:
                if made_by_memstep(path) is not None and path not in _in_use:
                    shutil.rmtree(path, ignore_errors=True)
                    if not path.exists():
                        break
                n += 1
                path = folder / f"{name}-{n}"
            _in_use.add(path)
        self.path = path

    def release(self) -> None:
        with _lock:
            _in_use.discard(self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def token(folder: Path | str, session: str | None) -> str:
    """What the Run tab's model box holds for a compressed model: its folder locally, a token
    that loads only for this session in a public app."""
    folder = Path(folder)
    if not public_app():
        return str(folder)
    return f"{TOKEN_PREFIX}{session_id(session)}/{folder.name}"


def is_token(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(TOKEN_PREFIX)


def resolve(spec: str, session: str | None = None, check_session: bool = True) -> str:
    """The folder a token names. With ``check_session``, only the session that made it may
    (one message for a token that is not the session's and for one that does not exist)."""
    refused = MemstepError("this compressed model is not available (it belongs to another session, or was "
                           "removed to free disk space): compress it again")
    sid, _, name = spec[len(TOKEN_PREFIX):].partition("/")
    if not re.fullmatch(r"[0-9a-f]{24}", sid) or not _NAME.match(name):
        raise refused
    if check_session and not hmac.compare_digest(sid, session_id(session) or "-"):
        raise refused
    folder = compressed_root() / "sessions" / sid / name
    if made_by_memstep(folder) is None or not (folder / "config.json").is_file():
        raise refused
    return str(folder)


def shown(folder: Path | str) -> str:
    """A saved model as messages name it: the folder's name, never where it is on the server."""
    return Path(folder).name


def weight_bytes(model) -> int:
    """Bytes of a model's weights: what a compressed copy takes on disk at most."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


# After a compressed model is loaded into Run, unfold Run's Advanced controls, where the model box
# is, so the visitor sees which model the next run takes.
SHOW_MODEL_JS = ("() => { const fold = document.querySelector('#advanced');"
                 " if (fold && !fold.querySelector('#model')?.offsetParent) fold.querySelector('button')?.click(); }")


def loader(missing: str):
    """The "load into Run" handler of a Compress section: the compressed model's folder into
    the Run tab's model box, and the Run tab shown; ``missing`` is said when nothing was saved."""
    def load_into_run(folder):
        import gradio as gr

        if not folder:
            raise gr.Error(missing, print_exception=False)
        return model_box_update(folder), gr.Tabs(selected="run")

    return load_into_run


def model_box_update(folder: str):
    """The Run tab's model box showing a compressed model: added to its choices, so a public
    app's box (which takes listed models only) accepts it, for this session."""
    import gradio as gr

    from memstep.models import offered_models

    # a token shows as the model's name; a local folder as itself (it is the user's own path)
    choice = (folder.rpartition("/")[2], folder) if is_token(folder) else folder
    return gr.update(choices=[*offered_models(), choice], value=folder)
