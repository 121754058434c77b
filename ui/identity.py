"""What a run is of: its document's identity, its model's name, and whether the page still shows
the document a Run would take.

A run carries the identity of what it ran (the document id, its name, the settings' label);
the run card and every view show it. Building an example or reading an upload takes seconds:
meanwhile the page marks the document as being prepared (the Run button says so and is
disabled), and a Run that reaches the server while the page and the session's document
disagree is refused, so a run never takes another document, or another document's settings,
than the page shows.
"""

from __future__ import annotations

from pathlib import Path

from memstep.models import EMBEDDED, packaged_spec

from ui import compressed

RUN_LABEL = "Run"
PREPARING_LABEL = "preparing the document…"
# The Run button while an example is built or an upload read (set in the browser at once, before
# the server hears of it): disabled, saying why. The pending box tells the server the same.
PREPARING_JS = ("(...inputs) => [{__type__: 'update', interactive: false, value: '" + PREPARING_LABEL + "'}, "
                "'preparing']")
NOT_SHOWN = ("the page is still preparing the document it shows: press Run again once the Run button is back "
             "(nothing was run)")
EXPIRED = "this page has been idle for hours and no longer holds its document: choose the document again"
CHANGED = ("the document changed after Run was pressed: press Run again to run the one the page shows now "
           "(nothing was run)")


def document_label(source) -> str:
    """'Passkey in Persuasion · #85a02b2b': the document's name and id, as the views show it."""
    return f"{source.name} · #{source.doc_id}"


def page_mismatch(source, example: str | None, pending: str | None, shown_id: str | None) -> str | None:
    """Why a Run from the page must not start (None: the page shows ``source``). ``shown_id`` is
    the document id the page holds (None: a caller that is not the page, such as a test or a
    raw queue client, which names no page state); ``example`` the example menu's value,
    ``pending`` set while the page prepares a document."""
    if shown_id is None:
        return None
    if source is None:  # the session's document was dropped (DOCUMENT_STATE_SECONDS after it was set)
        return EXPIRED
    if pending:
        return NOT_SHOWN
    if (example or None) != getattr(source, "example", None):
        return NOT_SHOWN
    if shown_id != source.doc_id:
        return CHANGED
    return None


def model_name(spec: str | None, lm=None) -> str:
    """The model as the page names it: a packaged model's name, a compressed model's folder
    name (never its server path), a hub id, a local folder's or file's name."""
    spec = (spec or "").strip() or EMBEDDED
    packaged = packaged_spec(spec)
    if packaged is not None:
        return packaged.name.split(" (")[0]
    if compressed.is_token(spec):
        return f"compressed model ‘{spec.rpartition('/')[2]}’"
    path = Path(spec)
    if compressed.made_by_memstep(path) is not None:
        return f"compressed model ‘{path.name}’"
    if spec.startswith(("/", ".", "~")) or spec.endswith(".gguf"):
        return path.name or spec
    return spec


def is_compressed(spec: str | None) -> bool:
    """Whether ``spec`` names a model memstep compressed (a token, or a folder with memstep's marker)."""
    spec = (spec or "").strip()
    if not spec:
        return False
    if compressed.is_token(spec):
        return True
    try:
        return compressed.made_by_memstep(Path(spec)) is not None
    except (OSError, ValueError):
        return False


def model_size(lm) -> str | None:
    """'135M', '1.5B': the loaded model's parameters, rounded as models are named."""
    model = getattr(lm, "model", None)
    if model is None or not hasattr(model, "parameters"):
        return None
    count = sum(p.numel() for p in model.parameters())
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    return f"{count / 1e6:.0f}M"


def model_words(spec: str | None, lm=None) -> str:
    """'the 135M model (SmolLM2-135M-Instruct)', 'the compressed model ‘laco-2’ (96M)': the subject
    of a sentence that says what the model itself cannot do."""
    name, size = model_name(spec, lm), model_size(lm)
    if is_compressed(spec):
        return f"the {name}" + (f" ({size} parameters)" if size else "")
    return f"the {size} model ({name})" if size else f"the model ({name})"

