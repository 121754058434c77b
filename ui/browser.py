"""Driving the app in headless Chromium: shared by the browser tests, the screenshot script
and the app benchmark. Playwright for Python with Debian's chromium (Playwright cannot
download browsers offline)."""

from __future__ import annotations

import os
import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = os.environ.get("MEMSTEP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1440, "height": 1000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(demo):
    """Launch ``demo`` on a free local port; yields its URL, closes it afterwards."""
    from ui.layout import launch_options

    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **launch_options())
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@contextmanager
def chromium():
    """Headless Chromium (Debian's), closed afterwards."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser, viewport: dict | None = None):
    """A page in a fresh context (no cache, no state), device scale 1 so screenshots are
    deterministic."""
    return browser.new_context(viewport=viewport or VIEWPORT, device_scale_factor=1).new_page()


@contextmanager
def chromium_page(viewport: dict | None = None):
    with chromium() as browser:
        yield new_page(browser, viewport)


def plot_selector(elem_id: str) -> str:
    return f"#{elem_id} .js-plotly-plot .main-svg"


def wait_for_plot(page, elem_id: str, timeout_s: float = 30) -> None:
    page.wait_for_selector(plot_selector(elem_id), timeout=timeout_s * 1000)


def wait_for_charts(page, scope: str = "body", timeout_s: float = 30) -> None:
    """Wait until every visible chart under ``scope`` is laid out to its container's width (Plotly
    lays a chart out again after its container changes size: a resize, a tab shown), then for
    two frames, so what is measured next is what is painted."""
    page.wait_for_function(
        "scope => [...document.querySelectorAll(scope + ' .js-plotly-plot')].every(p => p.offsetParent === null"
        " || (p._fullLayout && Math.abs(p._fullLayout.width - p.clientWidth) <= 1))",
        arg=scope, timeout=timeout_s * 1000)
    page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")


def resize_and_relayout(page, viewport: dict, timeout_s: float = 30) -> None:
    """Set the window to ``viewport`` and wait until every visible chart of the Run tab's views has
    been laid out again within its width."""
    page.set_viewport_size(viewport)
    wait_for_charts(page, "#run-views", timeout_s)


def open_app(page, url: str, timeout_s: float = 60) -> float:
    """Open the app and wait for the schedule preview to be drawn; returns the seconds it took."""
    began = time.perf_counter()
    page.goto(url, wait_until="domcontentloaded", timeout=timeout_s * 1000)
    wait_for_plot(page, "sizes-plot", timeout_s)
    return time.perf_counter() - began


def stat_selector(key: str) -> str:
    """The value of the Run tab's key-number card data-stat=key."""
    return f'#stats [data-stat="{key}"] .memstep-stat-value'


def stat(page, key: str) -> str:
    """The value of a key-number card (data-stat=key) of the Run tab."""
    return page.locator(stat_selector(key)).inner_text()


def choose_example(page, name: str) -> None:
    page.locator("#example input").click()
    page.get_by_role("option", name=name).click()


def open_advanced(page) -> None:
    """Unfold the Run tab's Advanced controls (sinks, scorer, model, ...) if folded."""
    if not page.locator("#question-aware").is_visible():
        page.locator("#advanced button").first.click()
        page.locator("#question-aware").wait_for(state="visible")


def set_number(page, elem_id: str, value) -> None:
    """Type into a Number, or into the number box of a Slider (unfolding Advanced for its fields)."""
    box = page.locator(f"#{elem_id} input[type=number]").first
    if page.locator("#advanced").count() and page.locator(f"#advanced #{elem_id}").count():
        open_advanced(page)
    box.fill(str(value))
    box.press("Enter")


def choose_schedule(page, label: str) -> None:
    page.locator("#schedule label").filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$")).click()


def wait_for_state(page, pattern: str, timeout_s: float = 300) -> None:
    """Wait until the run card's text matches ``pattern`` (e.g. "done"); on a timeout the error
    says what the card showed instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "([sel, pat]) => { const el = document.querySelector(sel); return el && new RegExp(pat).test(el.innerText); }",
            arg=[stat_selector("state"), pattern], timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        shown = {key: page.locator(stat_selector(key)).all_inner_texts() for key in ("state", "steps")}
        raise AssertionError(f"the run card never showed {pattern!r} in {timeout_s:g} s: it shows {shown}") from None


def upload(page, path) -> None:
    """Upload a file through the Run tab's file input."""
    page.locator("#upload input[type=file]").set_input_files(str(path))


def upload_document(page, path, timeout_s: float = 30) -> None:
    """Upload ``path`` and wait until the document line under the upload names it (read and counted)."""
    upload(page, path)
    page.wait_for_function("name => document.querySelector('#doc-info').innerText.includes(name)",
                           arg=Path(path).name, timeout=timeout_s * 1000)


def wait_for_toast(page, text: str | re.Pattern, timeout_s: float = 60) -> str:
    """Wait for a toast (error or warning) containing ``text``; returns its text."""
    toast = page.locator(".toast-body").filter(has_text=text).first
    toast.wait_for(state="visible", timeout=timeout_s * 1000)
    return toast.inner_text()


def rendered_plots(page, elem_ids) -> int:
    """How many of the plots ``elem_ids`` have drawn their Plotly SVG."""
    return sum(page.locator(plot_selector(elem_id)).count() > 0 for elem_id in elem_ids)


# Every text box drawn in the visible Plotly charts under ``scope`` (titles, axis titles and
# ticks, legends, annotations, colour bars, labels on points), hover labels left out.
_CHART_TEXTS_JS = """(scope) => {
  const root = document.querySelector(scope) || document;
  const out = [];
  for (const chart of root.querySelectorAll('.js-plotly-plot')) {
    if (chart.offsetParent === null) continue;
    const id = chart.closest('[id]')?.id || '?';
    const frame = chart.getBoundingClientRect();
    const boxes = [];
    for (const t of chart.querySelectorAll('.main-svg text')) {
      if (t.closest('.hoverlayer') || !t.textContent.trim()) continue;
      const style = getComputedStyle(t);
      if (style.display === 'none' || style.visibility === 'hidden' || style.opacity === '0') continue;
      const b = t.getBoundingClientRect();
      if (b.width < 1 || b.height < 1) continue;
      boxes.push({text: t.textContent.slice(0, 60), x: b.x, y: b.y, w: b.width, h: b.height});
    }
    out.push({id, frame: {x: frame.x, y: frame.y, w: frame.width, h: frame.height}, boxes});
  }
  return out;
}"""


def chart_text_problems(page, scope: str = "body", slack: float = 1.0) -> list[str]:
    """Text boxes of the visible charts that overlap another one, or run outside their chart
    (cut off): one line per problem, [] when every chart's text stands clear."""
    problems = []
    for chart in page.evaluate(_CHART_TEXTS_JS, scope):
        frame, boxes = chart["frame"], chart["boxes"]
        for i, a in enumerate(boxes):
            if a["x"] < frame["x"] - slack or a["x"] + a["w"] > frame["x"] + frame["w"] + slack:
                problems.append(f"{chart['id']}: '{a['text']}' runs outside the chart")
            for b in boxes[i + 1:]:
                if (a["x"] + slack < b["x"] + b["w"] and b["x"] + slack < a["x"] + a["w"]
                        and a["y"] + slack < b["y"] + b["h"] and b["y"] + slack < a["y"] + a["h"]):
                    problems.append(f"{chart['id']}: '{a['text']}' overlaps '{b['text']}'")
    return problems


def horizontal_overflow(page) -> int:
    """Pixels the page is wider than its window (0: nothing to scroll sideways)."""
    return page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")


# Points each trace of the visible charts draws: a heatmap's cells, a bar's or line's points.
_TRACE_POINTS_JS = """(scope) => {
  const out = [];
  for (const chart of (document.querySelector(scope) || document).querySelectorAll('.js-plotly-plot')) {
    if (chart.offsetParent === null || !chart.data) continue;
    const id = chart.closest('[id]')?.id || '?';
    for (const trace of chart.data) {
      const z = trace.z, size = (a) => a?.shape ? String(a.shape).split(',').reduce((n, d) => n * +d, 1)
                                                      : (a?.length ?? 0);
      // numpy arrays arrive as {dtype, bdata, shape}; lists as nested arrays
      const points = z ? (z.shape ? size(z) : Array.from(z).reduce((n, row) => n + (row?.length ?? 1), 0))
                       : Math.max(size(trace.x), size(trace.y));
      out.push({chart: id, type: trace.type || 'scatter', name: trace.name || '', points});
    }
  }
  return out;
}"""


def trace_points(page, scope: str = "body") -> list[dict]:
    """[{chart, type, name, points}] for every trace of the visible charts under ``scope``."""
    return page.evaluate(_TRACE_POINTS_JS, scope)


# The contrast of every visible text against what is painted behind it (WCAG 2: relative
# luminance, (L1 + 0.05) / (L2 + 0.05)), from the computed styles: the text's colour (its alpha
# and the opacity of its ancestors applied) over the backgrounds of its ancestors, composited
# from the page's own background up. HTML text, and the charts' SVG text (fill) over the chart's
# backgrounds. Disabled controls are left out (WCAG 1.4.3 exempts inactive components), and so
# are the retained-token map's and other charts' coloured cells (not text).
_CONTRAST_JS = """([scope, least]) => {
  const parse = (c) => {
    const m = c && c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, bottom) => {  // top (rgba) composited over an opaque bottom
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + bottom[i] * (1 - a)).concat(1);
  };
  const lum = (c) => {
    const ch = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * ch(c[0]) + 0.7152 * ch(c[1]) + 0.0722 * ch(c[2]);
  };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const page = parse(getComputedStyle(document.body).backgroundColor);
  const base = page && page[3] > 0 ? page.slice(0, 3).concat(1) :
    (document.body.classList.contains("dark") ? [11, 15, 25, 1] : [255, 255, 255, 1]);
  const behind = (el) => {  // the backgrounds from the root down to el, composited
    const chain = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) chain.push(e);
    let color = base, alpha = 1;
    for (const e of chain.reverse()) {
      const style = getComputedStyle(e);
      alpha *= +style.opacity;
      let bg = parse(e instanceof SVGElement ? (e.tagName === "rect" || e.tagName === "path" ? style.fill : null)
                     : style.backgroundColor);
      if (e instanceof SVGElement && e.tagName !== "svg") bg = null;  // a chart's text: its paper, not its cells
      if (bg && bg[3] > 0) color = over(bg, color);
    }
    return {color, alpha};
  };
  const root = document.querySelector(scope) || document.body;
  const out = [];
  const seen = new Set();
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent.trim();
    const el = node.parentElement;
    if (!text || !el || seen.has(el)) continue;
    seen.add(el);
    if (el.closest("[disabled], .hoverlayer, .memstep-sr-only, script, style, [aria-hidden=true]")) continue;
    const style = getComputedStyle(el);
    if (style.visibility !== "visible" || style.display === "none") continue;
    const box = el.getBoundingClientRect();
    if (box.width < 1 || box.height < 1) continue;
    if (el.closest("svg")) {
      if (!el.closest(".js-plotly-plot") || el.closest(".cbaxis, .colorbar")) continue;
    }
    const fg = parse(el instanceof SVGElement ? style.fill : style.color);
    if (!fg) continue;
    const {color, alpha} = behind(el);
    const seenColor = over([fg[0], fg[1], fg[2], fg[3] * alpha], color);
    const r = ratio(seenColor, color);
    if (r < least) {
      const where = el.closest("[id]")?.id || el.tagName.toLowerCase();
      out.push(`${where}: "${text.slice(0, 40)}" ${r.toFixed(2)}:1 (rgb ${seenColor.slice(0, 3).map(Math.round)}`
               + ` on ${color.slice(0, 3).map(Math.round)})`);
    }
  }
  return out;
}"""


def contrast_problems(page, scope: str = "body", least: float = 4.5) -> list[str]:
    """Visible texts under ``scope`` whose contrast with what is behind them is under ``least``:1
    (one line each: where, the text, the ratio, the colours); [] when every text passes."""
    return page.evaluate(_CONTRAST_JS, [scope, least])


# Words a line break cuts in two inside the given elements (table cells, say): a word whose
# characters lie on more than one line box.
_BROKEN_WORDS_JS = """(selector) => {
  const out = [];
  for (const cell of document.querySelectorAll(selector)) {
    if (cell.offsetParent === null) continue;
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
        if (tops.size > 1) out.push(m[0]);
      }
    }
  }
  return out;
}"""


def broken_words(page, selector: str) -> list[str]:
    """Words split across lines inside the elements ``selector`` matches ([] when none is)."""
    return page.evaluate(_BROKEN_WORDS_JS, selector)
