"""Full-cache reference answers of the bundled examples, computed once and kept.

The contrast that explains a run (the full cache answers the passkey, the compressed memory
does not) needs a second prefill of the whole document. For the bundled examples it is the
same every time for a given model, question and token ids, so it runs once per process and
is also kept on disk (``$MEMSTEP_CACHE/reference_answers.json``) for the next start.
"""

from __future__ import annotations

import hashlib
import json
import threading

from memstep.paths import cache_root

MAX_ENTRIES = 256  # a handful of examples x models x questions; bounded all the same

_lock = threading.Lock()
_answers: dict[str, dict] | None = None


def reference_key(model: str, question: str, ids: list[int]) -> str:
    digest = hashlib.sha256(json.dumps([model, question, list(ids)]).encode()).hexdigest()
    return digest[:32]


def _path():
    return cache_root() / "reference_answers.json"


def _load() -> dict[str, dict]:
    global _answers
    if _answers is None:
        try:
            loaded = json.loads(_path().read_text())
            _answers = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            _answers = {}
    return _answers


def lookup(key: str) -> dict | None:
    """{"answer": str, "seconds": float} when this reference ran before."""
    with _lock:
        entry = _load().get(key)
    return entry if isinstance(entry, dict) and isinstance(entry.get("answer"), str) else None


def store(key: str, answer: str, seconds: float) -> None:
    with _lock:
        answers = _load()
        answers[key] = {"answer": answer, "seconds": round(float(seconds), 3)}
        while len(answers) > MAX_ENTRIES:
            answers.pop(next(iter(answers)))
        try:
            _path().parent.mkdir(parents=True, exist_ok=True)
            tmp = _path().with_suffix(".tmp")
            tmp.write_text(json.dumps(answers))
            tmp.replace(_path())
        except OSError:  # a read-only cache folder: the in-memory copy still serves this process
            pass
