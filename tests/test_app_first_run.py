"""The first-run experience in headless Chromium at a laptop (1440x1000) and a phone
(390x844) viewport (issue 12): the default run tells the passkey's story, Run and Stop are
visible without scrolling and Ctrl+Enter runs, tables scroll sideways instead of stacking
their headers, the Plan chart when the weights do not fit, and controls that only reach
valid settings. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

VIEWPORTS = {"laptop": {"width": 1440, "height": 1000}, "phone": {"width": 390, "height": 844}}


@pytest.fixture(scope="module")
def pages(app_url, browser):
    """One shared page per viewport for the module (conftest.SharedAppPage): the story's run opens
    the app afresh, as a new visitor gets it; the checks after it go on in the same page, each
    showing the tab it needs."""
    from conftest import SharedAppPage
    from ui.browser import new_page

    made = {name: SharedAppPage(new_page(browser, size), app_url) for name, size in VIEWPORTS.items()}
    yield made
    for shared in made.values():
        shared.page.context.close()


@pytest.fixture(params=list(VIEWPORTS))
def page(request, pages):
    shared = pages[request.param]
    page = shared.open_for(request)
    page.viewport_name = request.param
    yield page
    shared.close_for(request)


def _show_run_tab(page) -> None:
    page.get_by_role("tab", name="Run", exact=True).first.click()
    page.locator("#run").wait_for(state="visible")


def _in_view(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= size["height"] and box["x"] >= 0 \
        and box["x"] + box["width"] <= size["width"]


@pytest.mark.fresh_page
def test_run_and_stop_are_visible_and_ctrl_enter_runs_the_story(page, artifacts_dir, hold_for_stop):
    """At both widths Run and Stop are in view and Ctrl+Enter starts the default story. The story runs
    to its end once, on the laptop; its charts are then checked at the phone's width as well (the
    same charts laid out again), where a wrapped legend once covered a title."""
    from ui.browser import resize_and_relayout, stat, wait_for_plot, wait_for_state

    assert _in_view(page, "#run") and _in_view(page, "#stop")  # no scrolling needed
    assert "1.5k" in page.locator("#example input").input_value()  # a short default run
    if page.viewport_name == "phone":
        hold_for_stop(1)  # the story's run waits after its first step until Stop reaches the server
    page.keyboard.press("Control+Enter")
    if page.viewport_name == "phone":
        wait_for_state(page, "running", timeout_s=120)
        page.locator("#stop").click()
        wait_for_state(page, "stopped", timeout_s=60)
        return
    wait_for_state(page, "done", timeout_s=900)
    wait_for_plot(page, "retained-plot")
    answer = page.locator("#answer").inner_text()
    assert "From the compressed memory" in answer and "From the full cache" in answer
    for who in ("compressed memory", "full cache"):  # each verdict agrees with the answer and the passkey
        line = next(line for line in answer.splitlines() if line.startswith(f"From the {who}"))
        said, key, verdict = re.fullmatch(r"From the [^:]*: (.*)passkey (\d+): (✓ yes|✗ no)\s*", line).groups()
        assert (verdict == "✓ yes") == bool(re.search(rf"(?<!\d){key}(?!\d)", said)), line
    assert re.search(r"What happened to the passkey\. The passkey \(\d+\) was read in step \d+ of \d+ and "
                     r"(left the memory in step \d+|stayed)", answer)
    assert page.locator('#stats [role="progressbar"]').count() == 1
    assert "chunks read" in page.locator("#stats .memstep-sr-only").inner_text()  # the charts in words
    assert stat(page, "steps").split(" / ")[0] == stat(page, "steps").split(" / ")[1]
    page.screenshot(path=str(artifacts_dir / "first_run_laptop.png"), full_page=True)
    plots = ("sizes-plot", "retained-plot", "memory-plot", "seconds-plot")
    for plot in plots:
        wait_for_plot(page, plot)
        assert not _legend_over_title(page, plot), plot
    try:
        resize_and_relayout(page, VIEWPORTS["phone"])
        page.screenshot(path=str(artifacts_dir / "first_run_phone.png"), full_page=True)
        for plot in plots:
            assert not _legend_over_title(page, plot), f"{plot} at the phone's width"
    finally:
        page.set_viewport_size(VIEWPORTS["laptop"])


def _overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def _legend_over_title(page, elem_id: str) -> list:
    """Pairs of a chart's legend and title boxes that intersect (issue 12: on a phone a
    wrapped legend covered the title), and legends that run into the plotting area."""
    plot = page.locator(f"#{elem_id} .js-plotly-plot")
    titles = [b for b in (e.bounding_box() for e in plot.locator(".gtitle").all()) if b]
    legends = [b for b in (e.bounding_box() for e in plot.locator(".legend").all()) if b]
    areas = [b for b in (e.bounding_box() for e in plot.locator(".nsewdrag").all()) if b]
    return [(legend, other) for legend in legends for other in titles + areas if _overlap(legend, other)]


def test_tables_scroll_sideways_instead_of_stacking_headers(page, artifacts_dir):
    for tab, table in (("Compare", "#compare-table"), ("Plan", "#plan-table")):
        page.get_by_role("tab", name=tab).click()
        page.locator(f"{table} th").first.wait_for(state="visible", timeout=30_000)
        heights = page.eval_on_selector_all(f"{table} th", "els => els.map(e => e.getBoundingClientRect().height)")
        # words wrap at spaces (at most three short lines), never one letter per line (8+ lines)
        assert heights and max(heights) < 100, heights
        cut = page.eval_on_selector_all(f"{table} th .cell-wrap, {table} th span",
                                              "els => els.filter(e => e.scrollWidth > e.clientWidth + 2).map(e => e.innerText + ':' + e.scrollWidth + '/' + e.clientWidth)")
        assert not cut, cut  # no header word is cut or broken
        page.screenshot(path=str(artifacts_dir / f"table_{tab.lower()}_{page.viewport_name}.png"), full_page=True)


def test_plan_chart_when_the_weights_do_not_fit(page, artifacts_dir):
    page.get_by_role("tab", name="Plan").click()
    for label, option in (("model", "Llama-3.1-70B"), ("GPU", "H100 80GB")):
        page.get_by_label(label, exact=True).first.click()
        page.get_by_role("option", name=option).first.click()
    page.wait_for_function("() => /weights alone/.test(document.querySelector('#plan-memory')?.innerText || '')",
                           timeout=60_000)
    lows = page.eval_on_selector("#plan-memory .js-plotly-plot",
                                 "el => Object.keys(el._fullLayout).filter(k => k.startsWith('yaxis'))"
                                 ".map(k => el._fullLayout[k].range[0])")
    assert lows and min(lows) >= -1e-9, lows  # never a negative limit
    assert re.search(r"at least \d+ GPUs", page.locator("#plan-memory").inner_text())
    page.screenshot(path=str(artifacts_dir / f"plan_70b_{page.viewport_name}.png"), full_page=True)


def test_controls_reach_only_valid_settings(page, artifacts_dir):
    from ui.browser import set_number

    _show_run_tab(page)
    note = page.locator("#preview-note")
    tokens = int(re.search(r"over ([\d,]+) tokens", note.inner_text()).group(1).replace(",", ""))
    assert int(page.locator("#chunk input[type=range]").get_attribute("max")) == tokens  # not past the document
    set_number(page, "memory", 4)  # the "at least 4" the error asks for is reachable
    page.wait_for_function("() => !/⚠/.test(document.querySelector('#preview-note').innerText) && "
                           "/M4\\b/.test(document.querySelector('#sizes-plot').innerText)", timeout=15_000)
    assert page.locator("#run").is_enabled()
    set_number(page, "memory", 2)
    page.wait_for_function("() => /smaller than the 4 sink/.test(document.querySelector('#preview-note').innerText)",
                           timeout=15_000)
    page.wait_for_function("() => document.querySelector('#run').disabled", timeout=15_000)  # no invalid run
    plot = page.locator("#sizes-plot .js-plotly-plot").bounding_box()
    for box in page.locator("#sizes-plot .annotation-text").all():
        b = box.bounding_box()
        assert b["x"] >= plot["x"] - 1 and b["x"] + b["width"] <= plot["x"] + plot["width"] + 1  # not cut off
    page.screenshot(path=str(artifacts_dir / f"invalid_settings_{page.viewport_name}.png"), full_page=True)
    set_number(page, "memory", 512)
    page.wait_for_function("() => !document.querySelector('#run').disabled", timeout=15_000)


def test_run_is_a_few_tab_presses_away_with_a_visible_focus_ring(page):
    _show_run_tab(page)
    page.locator("body").click(position={"x": 2, "y": 2})
    for presses in range(1, 16):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement?.id") == "run":
            break
    assert page.evaluate("() => document.activeElement?.id") == "run" and presses <= 10, presses
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineWidth")
    assert float(outline.rstrip("px")) >= 2  # the focus ring is not faint
