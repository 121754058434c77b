"""The map and the words together, in headless Chromium, after one short real run per width: at
1440 px the text view sits beside the retained-token map, and a click on the map outlines the
clicked token in the text, in view, with no scrolling by hand; on a 390 px touch screen a tap
shows the token line (in view) and a second tap outlines the token in the text. Every text of
the page has a contrast of at least 4.5:1 in both themes, measured from the computed styles.
A number box out of range is answered in memstep's words, and the Plan tab's tables keep their
words whole on a phone. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re

import pytest
from conftest import netherfield

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAPTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
CHARS = 1500  # about 390 tokens: FM c128 M128 runs 4 steps in seconds and evicts


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    return netherfield(tmp_path_factory.mktemp("docs"), CHARS)


def _run(page, document) -> None:
    from ui.browser import (choose_schedule, set_number, upload_document, wait_for_charts, wait_for_plot,
                            wait_for_state)

    upload_document(page, document)
    choose_schedule(page, "FM")
    set_number(page, "chunk", 128)
    set_number(page, "memory", 128)
    page.wait_for_function("() => /FM c128 M128/.test(document.querySelector('#sizes-plot').innerText)",
                           timeout=60_000)
    page.locator("#run").click()
    wait_for_state(page, "done", timeout_s=600)
    wait_for_plot(page, "retained-plot")
    wait_for_charts(page, "#retained-plot")


@pytest.fixture(scope="module")
def laptop(browser, app_url, document):
    from ui.browser import new_page, open_app

    page = new_page(browser, LAPTOP)
    open_app(page, app_url)
    _run(page, document)
    yield page
    page.context.close()


@pytest.fixture(scope="module")
def phone(browser, app_url, document):
    from ui.browser import open_app

    context = browser.new_context(viewport=PHONE, device_scale_factor=1, has_touch=True, is_mobile=True)
    page = context.new_page()
    open_app(page, app_url)
    _run(page, document)
    yield page
    context.close()


def _cell(page, fx: float = 0.3, fy: float = 0.85) -> tuple[float, float]:
    """A point on the map's last row (after the last step), as fractions of its plot area."""
    drag = page.locator("#retained-plot .nsewdrag").first
    drag.scroll_into_view_if_needed()
    box = drag.bounding_box()
    return box["x"] + box["width"] * fx, box["y"] + box["height"] * fy


def _box(page, selector: str) -> dict | None:
    return page.evaluate("""(sel) => { const el = document.querySelector(sel); if (!el) return null;
                             const r = el.getBoundingClientRect();
                             return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
                                     text: el.innerText, height: innerHeight, width: innerWidth}; }""", selector)


def _in_view(box: dict | None) -> bool:
    """Wholly inside the window (a pixel's rounding aside)."""
    return box is not None and -1 <= box["top"] and box["bottom"] <= box["height"] + 1 and -1 <= box["left"] \
        and box["right"] <= box["width"] + 1


def test_at_1440_px_a_click_outlines_the_token_in_the_text_beside_the_map(laptop, artifacts_dir):
    page = laptop
    x, y = _cell(page)
    page.mouse.move(x, y)  # hover: the token line says what is under the pointer, nothing moves
    page.wait_for_function("() => /after step/.test(document.querySelector('#memstep-map-token').innerText)",
                           timeout=10_000)
    assert page.locator("#retained-text .memstep-pointed").count() == 0
    words = page.locator("#memstep-map-token b").inner_text()
    pointed = words[words.index("⟦") + 1:words.index("⟧")].strip()
    page.mouse.click(x, y)
    page.wait_for_selector("#retained-text .memstep-pointed", timeout=10_000)
    page.wait_for_timeout(1800)  # the replay redraws the text at that step: the outline comes back on it
    mark, plot = _box(page, "#retained-text .memstep-pointed"), _box(page, "#retained-plot")
    page.screenshot(path=str(artifacts_dir / "map_click_1440.png"))
    assert _in_view(mark) and _in_view(plot), (mark, plot)  # the token and the map, both on screen
    assert mark["text"].strip() == pointed and mark["left"] > plot["right"]  # the text view beside the map


def test_at_390_px_a_tap_shows_the_token_line_and_a_second_tap_the_text(phone, artifacts_dir):
    page = phone
    x, y = _cell(page)
    page.touchscreen.tap(x, y)
    page.wait_for_function("() => /tap again/.test(document.querySelector('#memstep-map-token').innerText)",
                           timeout=10_000)
    page.wait_for_timeout(400)  # the line scrolled into view
    line = _box(page, "#memstep-map-token")
    page.screenshot(path=str(artifacts_dir / "map_tap_390.png"))
    assert _in_view(line) and re.match(r"positions? [\d,-]+, after step \d+: ", line["text"]), line
    assert page.locator("#retained-text .memstep-pointed").count() == 0  # one tap: the words only
    x, y = _cell(page)
    page.touchscreen.tap(x, y)
    page.wait_for_selector("#retained-text .memstep-pointed", timeout=10_000)
    page.wait_for_timeout(1800)
    mark = _box(page, "#retained-text .memstep-pointed")
    page.screenshot(path=str(artifacts_dir / "map_second_tap_390.png"))
    assert _in_view(mark), mark


def test_every_text_has_a_contrast_of_4_5_in_both_themes(laptop):
    from ui.browser import contrast_problems

    page = laptop
    problems = []
    for dark in (False, True):
        page.evaluate("(dark) => document.body.classList.toggle('dark', dark)", dark)
        for tab in ("Run", "Compare", "Plan", "Evaluate", "Compress"):
            page.get_by_role("tab", name=tab, exact=True).first.click()
            page.wait_for_timeout(800)
            problems += [f"{'dark' if dark else 'light'}, {tab}: {p}" for p in contrast_problems(page)]
    page.evaluate("() => document.body.classList.remove('dark')")
    page.get_by_role("tab", name="Run", exact=True).first.click()
    assert not problems, "\n".join(problems)


def test_a_number_box_out_of_range_names_its_field_and_goes_back(laptop):
    from ui.browser import open_advanced, set_number, wait_for_toast

    page = laptop
    open_advanced(page)
    set_number(page, "sinks", 5000)
    toast = wait_for_toast(page, "Sinks")
    assert "5,000" in toast and "allowed 0 to 1,024" in toast and "Value 5000" not in toast
    page.wait_for_function("() => document.querySelector('#sinks input').value === '1024'", timeout=15_000)
    set_number(page, "sinks", 4)


def test_at_390_px_the_plan_tables_keep_their_words_whole(phone, artifacts_dir):
    """The Plan tab's tables scroll sideways on a phone instead of breaking words ("IMD C", "bf1 6")."""
    from ui.browser import broken_words, wait_for_charts

    page = phone
    page.get_by_role("tab", name="Plan", exact=True).first.click()
    wait_for_charts(page, "#plan-memory")
    page.locator("#plan-needs table").first.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts_dir / "plan_needs_390.png"))
    cells = "#plan-needs th, #plan-needs td, #plan-table th, #plan-table td"
    assert page.locator("#plan-needs td").count() > 0 and broken_words(page, cells) == []
    page.get_by_role("tab", name="Run", exact=True).first.click()
