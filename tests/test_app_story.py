"""The Run tab read as a story, in headless Chromium (one served app and one browser for the
module): the status comes into view after Run on a phone, Stop leaves "stopped" with no time
left, the map says which tokens are under the pointer, a new document clears the last run's
answer, and the Evaluate tab leads with the evaluation the README's takeaway names."""

from __future__ import annotations

import re

import pytest
from conftest import netherfield

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1440, "height": 1000}
CHAPTER_CHARS = 3000  # about 700 tokens: a run takes seconds, and FM c16 has some 44 steps for Stop to land in


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    return netherfield(tmp_path_factory.mktemp("docs"), CHAPTER_CHARS)


@pytest.fixture(scope="module")
def app_url():
    """This module's own server: its tests follow one page through a run, a Stop and a new
    document, and on the session's shared server another module's work delayed its preview
    past a minute (the full suite, twice); alone it takes seconds."""
    from ui.browser import serve
    from ui.layout import build_app

    with serve(build_app()) as url:
        yield url


@pytest.fixture(scope="module")
def phone(app_url, browser, document):
    """A phone-sized page with the chapter uploaded and its question typed."""
    from ui.browser import new_page, open_app, upload_document

    page = new_page(browser, PHONE)
    open_app(page, app_url)
    upload_document(page, document)
    page.locator("#question textarea").fill("Who has taken Netherfield Park?")
    yield page
    page.context.close()


def _settle(page, label: str) -> None:
    page.wait_for_function(f"() => /{label}/.test(document.querySelector('#sizes-plot').innerText)",
                           timeout=60_000)  # a loaded machine takes seconds to redraw the preview


def _in_viewport(page, selector: str) -> bool:
    return page.evaluate("""(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
                                       return r.top > -2 && r.top < window.innerHeight - 40; }""", selector)


def test_on_a_phone_run_brings_the_status_into_view_and_stop_leaves_no_time(phone, hold_for_stop):
    from ui.browser import choose_schedule, set_number, wait_for_state

    choose_schedule(phone, "FM")
    set_number(phone, "chunk", 16)  # about 44 steps
    set_number(phone, "memory", 32)
    _settle(phone, "FM c16 M32")
    phone.evaluate("window.scrollTo(0, 0)")
    assert not _in_viewport(phone, "#stats")  # the controls fill a phone's first screen
    hold_for_stop(2)  # the run waits after its second step until Stop reaches the server
    phone.locator("#run").click()
    phone.wait_for_function("""() => { const r = document.querySelector('#stats').getBoundingClientRect();
                                       return r.top > -2 && r.top < window.innerHeight - 40; }""", timeout=10_000)
    wait_for_state(phone, "running", timeout_s=120)
    phone.wait_for_function("() => /step [1-9]/.test(document.querySelector('#memstep-now')?.innerText || '')",
                            timeout=120_000)
    phone.evaluate("""() => { window.memstepSaw = []; new MutationObserver(() => window.memstepSaw.push(
        document.querySelector('#stats')?.innerText || '')).observe(document.querySelector('#stats'),
        {childList: true, subtree: true, characterData: true}); }""")
    phone.locator("#stop").click()
    wait_for_state(phone, "stopped", timeout_s=60)
    seen = phone.evaluate("() => window.memstepSaw")  # what the status said between Stop and "stopped"
    assert any("stopping" in s and "step under way finishes first" in s for s in seen), seen
    phone.wait_for_timeout(500)  # any update still on its way
    status = phone.locator("#stats").inner_text()
    now = phone.locator("#memstep-now").inner_text()
    assert now.startswith("stopped after step") and not re.search(r"\d+ (s|min|h) left", status)
    assert "stopped" in status and "starting" not in status
    assert "Stopped" in phone.locator("#answer").inner_text()


def test_the_map_shows_the_tokens_under_the_pointer(phone):
    from ui.browser import choose_schedule, set_number, wait_for_charts, wait_for_plot, wait_for_state

    choose_schedule(phone, "FM")  # (in the full suite the page was seen back on IMDC after the Stop)
    set_number(phone, "chunk", 256)
    set_number(phone, "memory", 256)
    _settle(phone, "FM c256 M256")
    phone.locator("#run").click()
    wait_for_state(phone, "done", timeout_s=600)
    wait_for_plot(phone, "retained-plot")
    wait_for_charts(phone, "#retained-plot")
    drag = phone.locator("#retained-plot .nsewdrag").first
    size = drag.bounding_box()
    # hover scrolls the map into view, and finds the element again if Plotly redrew it meanwhile
    drag.hover(position={"x": size["width"] * 0.6, "y": size["height"] * 0.5})
    box = drag.bounding_box()
    phone.mouse.move(box["x"] + box["width"] * 0.6 + 2, box["y"] + box["height"] * 0.5 + 1)
    phone.wait_for_function("() => /after step/.test(document.querySelector('#memstep-map-token').innerText)",
                            timeout=10_000)
    pointed = phone.locator("#memstep-map-token").inner_text()
    assert pointed.startswith("position") and "kept by" in pointed
    words = phone.locator("#memstep-map-token b").inner_text()
    plain = words.replace("⟦", "").replace("⟧", "").strip("… ")  # the pointed token's brackets off
    assert "⟦" in words and len(plain) >= 3 and plain in " ".join(
        phone.locator("#retained-text .memstep-paper").inner_text().split())


def test_another_document_clears_the_last_answer(phone):
    from ui.browser import choose_example

    # the last test's run: its answer follows the prefill's "done"
    phone.wait_for_function("() => /From the compressed memory/.test(document.querySelector('#answer').innerText)",
                            timeout=120_000)
    choose_example(phone, _another_example(phone))
    phone.wait_for_function("() => /not run yet/.test(document.querySelector('#stats').innerText)", timeout=30_000)
    assert "From the compressed memory" not in phone.locator("#answer").inner_text()
    assert not phone.locator("#retained-plot").is_visible() and not phone.locator("#download-json").is_visible()


def _another_example(page) -> str:
    from ui.documents import DEFAULT_EXAMPLE, EXAMPLES

    return next(name for name in EXAMPLES if name != DEFAULT_EXAMPLE)


def test_the_page_goes_quiet_once_the_controls_settle(app_url, browser, tmp_path):
    """After a document, a schedule, two sizes and a size beyond the document (which the page moves
    back), the page stops calling the server: it once previewed without end, some seven calls a
    second while nobody touched it: a listener's own output (the chunk put back within the
    document) changed a control while the other listeners of that control still ran, and they
    re-triggered each other from then on. Waits for 2 s with no call, up to 60 s."""
    import json

    from ui.browser import choose_schedule, new_page, open_app, set_number, upload_document

    page = new_page(browser, LAPTOP)  # (on a phone's page the same steps looped less often)
    calls = []
    page.on("request", lambda r: calls.append(json.loads(r.post_data or "{}").get("fn_index"))
            if "queue/join" in r.url else None)
    try:
        open_app(page, app_url)
        upload_document(page, netherfield(tmp_path, 1500))  # shorter than the first chunk: the page moves it
        choose_schedule(page, "FM")
        set_number(page, "chunk", 256)
        set_number(page, "memory", 256)
        set_number(page, "chunk", 100_000)  # beyond the document: the page moves it to the document's tokens
        _settle(page, r"FM c(?!256)\d+ M256")
        seen, quiet_since, waited = len(calls), 0.0, 0.0
        while quiet_since < 2.0 and waited < 60.0:
            page.wait_for_timeout(250)
            waited += 0.25
            quiet_since = quiet_since + 0.25 if len(calls) == seen else 0.0
            seen = len(calls)
        assert quiet_since >= 2.0, f"the page kept calling the server: {calls[-12:]} (last of {len(calls)})"
    finally:
        page.context.close()


def test_the_evaluate_tab_leads_with_the_readme_comparison(phone):
    phone.get_by_role("tab", name="Evaluate").click()
    headline = phone.locator("#eval-headline")
    headline.wait_for(state="visible")
    text = headline.inner_text()
    assert "memstep's question-aware FM answers" in text and "kvpress ChunkKV" in text
    assert _in_viewport(phone, "#eval-headline")
