"""Every tab at a phone's width (390 px) and a laptop's (1440 px), a link that reopens its
settings, and a run's downloads, in headless Chromium with one served app for the module.

- no horizontal scroll, no two text boxes of any chart overlapping or cut off (measured from
  the rendered SVG's bounding boxes), every tab and control inside the window;
- /?schedule=fm&chunk=256&memory=256&example=... opens with those settings;
- after a run, the JSON download parses and equals `memstep run --json` on the same document
  and settings, up to the timing fields; the step CSV has a row per step.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import csv
import io
import json

import pytest
from conftest import netherfield

pytestmark = [pytest.mark.browser, pytest.mark.slow]

VIEWPORTS = {"phone": {"width": 390, "height": 844}, "laptop": {"width": 1440, "height": 1000}}
TABS = ["Run", "Compare", "Plan", "Evaluate", ("Compress", "Layer collapse (LaCo)"),
        ("Compress", "Pruning + reconstruction")]
TIMING = {"seconds", "full_seconds"}  # what differs between two runs of the same settings
CHAPTER_CHARS = 1500  # about 350 tokens: two steps of 256, a run takes seconds


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    return netherfield(tmp_path_factory.mktemp("docs"), CHAPTER_CHARS)


@pytest.fixture(scope="module")
def ran(app_url, browser, document, tmp_path_factory):
    """One page that ran the document (FM c256 M256, a question): the run's downloads and the
    page, kept for the module (runs are the slow part)."""
    from ui.browser import choose_schedule, new_page, open_app, set_number, upload_document, wait_for_plot, wait_for_state

    page = new_page(browser, VIEWPORTS["laptop"])
    open_app(page, app_url)
    upload_document(page, document)
    page.locator("#question textarea").fill("Who has taken Netherfield Park?")
    choose_schedule(page, "FM")
    set_number(page, "chunk", 256)
    set_number(page, "memory", 256)
    page.wait_for_function("() => /FM c256 M256/.test(document.querySelector('#sizes-plot').innerText)",
                           timeout=60_000)  # a loaded machine takes seconds to redraw the preview
    page.locator("#run").click()
    wait_for_state(page, "done", timeout_s=600)
    for plot in ("retained-plot", "memory-plot", "seconds-plot"):
        wait_for_plot(page, plot)
    folder = tmp_path_factory.mktemp("downloads")
    files = {}
    for key, button in (("json", "#download-json"), ("csv", "#download-csv")):
        page.locator(button).wait_for(state="visible", timeout=30_000)
        with page.expect_download(timeout=30_000) as download:
            page.locator(button).click()
        files[key] = folder / download.value.suggested_filename
        download.value.save_as(files[key])
    yield page, files
    page.context.close()


@pytest.fixture(scope="module")
def fresh_page(browser, app_url):
    """A page the module's tests open the app in afresh (a new Gradio session each time) rather than
    a new browser context each, which costs Chromium about twice the work; shared
    (conftest.SharedAppPage), so a check that works from any state goes on in it."""
    from conftest import SharedAppPage
    from ui.browser import new_page

    shared = SharedAppPage(new_page(browser, VIEWPORTS["laptop"]), app_url)
    yield shared
    shared.page.context.close()


@pytest.fixture
def fresh(fresh_page, request):
    yield fresh_page
    fresh_page.close_for(request)


def _strip_timing(value):
    if isinstance(value, dict):
        return {k: _strip_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_strip_timing(v) for v in value]
    return value


def test_the_json_download_equals_memstep_run_json(ran, document, tmp_path):
    from memstep.cli import main

    page, files = ran
    downloaded = json.loads(files["json"].read_text())
    out = tmp_path / "cli.json"
    assert main(["run", str(document), "--schedule", "fm", "--chunk", "256", "--memory", "256",
                 "--question", "Who has taken Netherfield Park?", "--output", str(out), "--quiet"]) == 0
    expected = json.loads(out.read_text())
    assert _strip_timing(downloaded) == _strip_timing(expected)
    assert downloaded["answer"] and downloaded["schedule"]["schedule"] == "fm" and len(downloaded["steps"]) >= 2
    rows = list(csv.DictReader(io.StringIO(files["csv"].read_text())))
    assert [int(r["step"]) for r in rows] == [s["step"] + 1 for s in downloaded["steps"]]  # from 1, as the page
    assert [int(r["memory_after"]) for r in rows] == [s["memory_after"] for s in downloaded["steps"]]
    assert all(float(r["cpu_seconds"]) > 0 for r in rows)  # the process's CPU time, beside wall seconds


def test_search_outlines_the_matches_with_their_retention(ran, artifacts_dir):
    page, _ = ran
    page.locator("#search textarea, #search input").first.fill("Netherfield")
    page.wait_for_function("() => /matches<\\/b>|match<\\/b>/.test(document.querySelector("
                           "'#retained-text .memstep-search-result')?.innerHTML || '')", timeout=30_000)
    result = page.locator("#retained-text .memstep-search-result").inner_text()
    marked = page.locator('#retained-text [data-mark="match"]')
    count = int(result.split(" match")[0])
    assert count >= 2 and page.locator('#retained-text [id^="memstep-match-"]').count() == count
    assert "Netherfield" in marked.first.inner_text()
    assert "still in memory" in result or "evicted from every slot" in result
    page.locator("#search textarea, #search input").first.fill("")
    page.wait_for_function("() => !document.querySelector('#retained-text [data-mark=\"match\"]')", timeout=30_000)


@pytest.mark.fresh_page
@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_every_tab_fits_the_screen_with_no_overlapping_chart_text(ran, fresh, request, viewport, artifacts_dir):
    """After a run (the run tab's charts drawn) at the viewport's width, and on a fresh page."""
    from playwright.sync_api import expect

    from ui.browser import chart_text_problems, horizontal_overflow, wait_for_charts

    ran_page, _ = ran
    ran_page.set_viewport_size(VIEWPORTS[viewport])
    ran_page.get_by_role("tab", name="Run").first.click()
    wait_for_charts(ran_page)  # the charts follow the new width
    problems = chart_text_problems(ran_page)
    ran_page.screenshot(path=str(artifacts_dir / f"screens_run_{viewport}.png"), full_page=True)
    assert horizontal_overflow(ran_page) <= 0
    assert not problems, problems
    fresh.page.set_viewport_size(VIEWPORTS[viewport])
    page = fresh.open_for(request)
    width = VIEWPORTS[viewport]["width"]
    for tab in TABS:
        title, section = tab if isinstance(tab, tuple) else (tab, None)
        button = page.get_by_role("tab", name=title, exact=True).first
        assert button.is_visible(), f"tab {title} is hidden at {width} px"
        button.click()
        expect(button).to_have_attribute("aria-selected", "true")
        if section:
            inner = page.get_by_role("tab", name=section, exact=True).first
            assert inner.is_visible(), f"section {section} is hidden at {width} px"
            inner.click()
            expect(inner).to_have_attribute("aria-selected", "true")
        wait_for_charts(page)  # the tab's charts drawn at this width
        name = f"{title}{' ' + section if section else ''}"
        assert horizontal_overflow(page) <= 0, f"{name} scrolls sideways at {width} px"
        problems = chart_text_problems(page)
        assert not problems, (name, problems)
        outside = page.evaluate("""(width) => [...document.querySelectorAll(
              'button, input, textarea, select, [role="tab"], a')]
            .filter(e => e.offsetParent !== null && !e.closest('.table-wrap, .table-container, .modebar, footer'))
            .map(e => [e.innerText || e.getAttribute('aria-label') || e.id || e.tagName, e.getBoundingClientRect()])
            .filter(([, b]) => b.width > 0 && (b.left < -1 || b.right > width + 1))
            .map(([name, b]) => name.slice(0, 40) + ' ' + Math.round(b.left) + '-' + Math.round(b.right))""", width)
        assert not outside, (name, outside)  # every control inside the window
        cut = page.evaluate("""() => [...document.querySelectorAll('label, button, th span, th .cell-wrap')]
            .filter(e => e.offsetParent !== null && e.clientWidth > 0 && !e.closest('.label-wrap')
                         && e.scrollWidth > e.clientWidth + 4)
            .map(e => (e.innerText || '').slice(0, 40) + ' ' + e.scrollWidth + '/' + e.clientWidth)""")
        assert not cut, (name, cut)  # no label, button or column header cut off (accordions wrap theirs)
        page.screenshot(path=str(artifacts_dir / f"screens_{name.split(' (')[0].replace(' ', '_')}_{viewport}.png"),
                        full_page=True)


def test_a_tab_hidden_while_the_window_narrowed_fits_its_charts_when_shown(fresh, request):
    """Compare's charts drawn on a laptop, the window narrowed to a phone's while Run shows: when
    Compare shows again its charts are laid out to the phone's width (they kept 600 px, clipped)."""
    from ui.browser import wait_for_charts

    fresh.page.set_viewport_size(VIEWPORTS["laptop"])
    page = fresh.open_for(request)  # (in the module's order, the page every tab was checked in)
    page.get_by_role("tab", name="Compare", exact=True).first.click()
    wait_for_charts(page)
    page.get_by_role("tab", name="Run", exact=True).first.click()
    page.set_viewport_size(VIEWPORTS["phone"])
    wait_for_charts(page)
    page.get_by_role("tab", name="Compare", exact=True).first.click()
    wait_for_charts(page, "#compare-sizes", timeout_s=10)  # (a chart left at the old width never matches)
    widths = page.evaluate("() => ['#compare-sizes', '#compare-memory'].map(s => "
                           "document.querySelector(s + ' .js-plotly-plot')._fullLayout.width)")
    assert all(w <= VIEWPORTS["phone"]["width"] for w in widths), widths


def test_a_link_reopens_its_settings(fresh, app_url):
    from ui.browser import open_advanced, open_app

    page = fresh.page
    page.set_viewport_size(VIEWPORTS["laptop"])
    fresh.stale = True  # another address: the next test opens the app afresh
    open_app(page, app_url + "?schedule=fm&chunk=256&memory=256&example=passkey-in-pride-and-prejudice&sinks=8"
                             "&chunk_bogus=1&growth=nonsense")
    page.wait_for_function("() => /FM c256 M256/.test(document.querySelector('#sizes-plot')?.innerText || '')",
                           timeout=30_000)
    assert page.locator("#example input").input_value() == "Passkey in Pride and Prejudice (4k tokens)"
    assert page.locator("#chunk input[type=number]").input_value() == "256"
    assert page.locator("#memory input[type=number]").input_value() == "256"
    open_advanced(page)  # sinks is one of the folded controls
    assert page.locator("#sinks input").input_value() == "8"
    assert page.locator("#schedule input[value=fm]").is_checked()
    assert "passkey" in page.locator("#doc-info").inner_text()
    assert page.locator(".toast-body").filter(has_text="growth").count() >= 1  # a refused value says so
    link = page.locator("#memstep-link").get_attribute("href")
    assert "schedule=fm" in link and "chunk=256" in link and "example=passkey-in-pride-and-prejudice" in link
