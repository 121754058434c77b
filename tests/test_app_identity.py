"""One run, one input, in headless Chromium: Run pressed 0.2 s, 1 s and 3 s after choosing each
bundled example (or uploading a document) runs that document with the settings the page shows,
never the one before. Building an example takes seconds (the whole novel's tokens are counted):
meanwhile Run says "preparing the document…" and is disabled, so the click waits for it.

Each press is checked on the run's card (its document id, tokens and steps), and the run is
stopped before its first step: the check is about what the run was given, not about the model's
work (``stop_before_steps`` holds each run, once its document is prepared and its schedule made,
until Stop reaches the server). The server's caches of built examples and token counts are
emptied before each choice, so every press races a real build."""

from __future__ import annotations

import re

import pytest
from conftest import netherfield

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DELAYS = (0.2, 1.0, 3.0)


@pytest.fixture(scope="module")
def page(browser, app_url):
    from ui.browser import new_page, open_advanced, open_app

    page = new_page(browser)
    open_app(page, app_url)
    open_advanced(page)  # Sinks and Max tokens in view: the checks read them
    yield page
    page.context.close()


@pytest.fixture
def stop_before_steps(monkeypatch):
    """Every run of the session's app waits, with its document prepared and its schedule made, until
    Stop is pressed (at most 60 s), so it stops before any step: a Stop pressed as the card says
    "starting" otherwise lands after the first step, seconds of model work per press. The app
    serves in this process, so the patch reaches its handlers; what is checked stays real (the
    Run button, the run's own inputs and card, Stop)."""
    import time

    from ui import handlers

    streamed = handlers.timed

    def held(stream):
        events = streamed(stream)
        schedule = next(events)  # the document prepared, the schedule made
        deadline = time.monotonic() + 60
        while not handlers._STOP_REQUESTS and time.monotonic() < deadline:
            time.sleep(0.02)
        yield schedule
        yield from events

    monkeypatch.setattr(handlers, "timed", held)


def _forget_built_documents() -> None:
    """The app serves in this process: its caches of built examples and token counts go, so the
    next choice builds its document again (seconds for the whole novel) as on a fresh server."""
    from ui import documents, handlers

    documents.example.cache_clear()
    with handlers._COUNTS_LOCK:
        handlers._COUNTS.clear()


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _expected(page, source) -> tuple[int, int]:
    """(tokens, steps) of a run of ``source`` with the settings the page shows now."""
    from memstep.schedules import make_schedule
    from ui import handlers
    from ui.runs import settings_from

    value = lambda elem_id: page.locator(f"#{elem_id} input[type=number]").first.input_value()  # noqa: E731
    schedule = page.locator("#schedule input:checked").get_attribute("value")
    max_tokens = value("max-tokens") or None
    settings = settings_from(schedule, value("chunk"), value("memory"), "linear", None, value("sinks"),
                             page.locator("#rope input:checked").get_attribute("value"))
    tokens = handlers.preview_tokens(source, None, max_tokens, settings)
    return tokens, make_schedule(settings.schedule, tokens, settings.chunk, settings.memory, "linear", layers=30).steps


def _press_run_after(page, delay: float, choose) -> dict:
    """Choose a document, press Run ``delay`` seconds later (the click waits while Run is disabled),
    stop the run as soon as it starts (stop_before_steps holds it) and read what it ran."""
    from ui.browser import stat, wait_for_state

    choose()
    page.wait_for_timeout(delay * 1000)
    page.locator("#run").click(timeout=120_000)
    # this run's own card (the last one ended "stopped", and this one is held until Stop), or a refusal
    wait_for_state(page, "starting|running|failed", timeout_s=180)
    assert "failed" not in stat(page, "state"), page.locator(".toast-body").all_inner_texts()  # refused
    page.locator("#stop").click()
    wait_for_state(page, "stopped|done", timeout_s=180)
    return {key: stat(page, key) for key in ("state", "document", "steps", "tokens")}


def _check(page, shown: dict, source) -> None:
    tokens, steps = _expected(page, source)
    assert shown["document"] == f"{source.name} · #{source.doc_id}", shown
    assert _number(shown["tokens"].split("/")[1]) == tokens and _number(shown["steps"].split("/")[1]) == steps, shown
    assert f"#{source.doc_id}" in page.locator("#doc-info").inner_text()


def test_run_pressed_while_an_example_is_built_runs_that_example(page, stop_before_steps):
    from ui.browser import choose_example
    from ui.documents import EXAMPLES, WHOLE_BOOK_EXAMPLE, example
    from ui.models import embedded_tokenizer

    names = [name for name in EXAMPLES if name != WHOLE_BOOK_EXAMPLE] + [WHOLE_BOOK_EXAMPLE]  # the novel last
    if page.locator("#example input").input_value() == names[0]:  # each choice must change the example
        names = names[1:] + names[:1]
    for delay in DELAYS:  # every example in turn, so each choice is another example than the last
        for name in names:
            _forget_built_documents()
            shown = _press_run_after(page, delay, lambda name=name: choose_example(page, name))
            _check(page, shown, example(name, embedded_tokenizer()))


def test_run_pressed_while_an_upload_is_read_runs_that_upload(page, tmp_path, stop_before_steps):
    from memstep.documents import read_document_bytes
    from ui.browser import upload
    from ui.documents import DocumentSource

    clear = page.locator('#upload button[aria-label="Clear"]')
    for i, delay in enumerate(DELAYS):
        path = netherfield(tmp_path, 2000 + 400 * i)  # another text each time: another id, other tokens
        path = path.rename(tmp_path / f"upload-{i}.txt")
        if clear.count():  # the box shows the last upload: cleared, it takes a file again
            clear.click()
        shown = _press_run_after(page, delay, lambda path=path: upload(page, path))
        info = page.locator("#doc-info").inner_text()
        assert info.startswith(path.name) and shown["document"] == f"{path.name} · {re.search('#[0-9a-f]{8}', info)[0]}"
        _check(page, shown, DocumentSource(path.name, read_document_bytes(path.read_bytes(), path.name)))


def test_a_run_the_page_did_not_prepare_is_refused_before_any_work():
    """Server side (what the browser's disabled button stands in front of): a Run whose page still
    prepares a document, or shows another example or another document id than the session holds,
    is refused with one line, and no model is loaded."""
    import gradio as gr

    from ui import handlers
    from ui.documents import DocumentSource
    from ui.identity import CHANGED, NOT_SHOWN, page_mismatch

    doc = DocumentSource("upload.txt", "Some text. " * 40)
    assert page_mismatch(doc, None, "", doc.doc_id) is None  # the page shows what the session holds
    assert page_mismatch(doc, None, "", None) is None  # a caller that is not the page names nothing
    assert page_mismatch(doc, None, "preparing", doc.doc_id) == NOT_SHOWN
    assert page_mismatch(doc, "Passkey in Persuasion (1.5k tokens)", "", doc.doc_id) == NOT_SHOWN
    assert page_mismatch(doc, None, "", "0badc0de") == CHANGED
    assert "choose the document again" in page_mismatch(None, None, "", doc.doc_id)  # the session's state expired
    run = handlers.run_document(doc, "no/such-model", "fm", "linear", 64, 32, "chunk-attention", 4, None, "",
                                False, example_name=None, pending="preparing", shown_id=doc.doc_id)
    with pytest.raises(gr.Error, match="still preparing the document"):
        next(run)  # refused before the model (which does not exist) is looked up
