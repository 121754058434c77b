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


def open_app(page, url: str, timeout_s: float = 60) -> float:
    """Open the app and wait for the schedule preview to be drawn; returns the seconds it took."""
    began = time.perf_counter()
    page.goto(url, wait_until="domcontentloaded", timeout=timeout_s * 1000)
    wait_for_plot(page, "sizes-plot", timeout_s)
    return time.perf_counter() - began


def stat(page, key: str) -> str:
    """The value of a key-number card (data-stat=key) of the Run tab."""
    return page.locator(f'#stats [data-stat="{key}"] .memstep-stat-value').inner_text()


def choose_example(page, name: str) -> None:
    page.locator("#example input").click()
    page.get_by_role("option", name=name).click()


def set_number(page, elem_id: str, value) -> None:
    """Type into a Number, or into the number box of a Slider."""
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def choose_schedule(page, label: str) -> None:
    page.locator("#schedule label").filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$")).click()


def wait_for_state(page, pattern: str, timeout_s: float = 300) -> None:
    """Wait until the run card's text matches ``pattern`` (e.g. "done")."""
    page.wait_for_function(
        "([sel, pat]) => { const el = document.querySelector(sel); return el && new RegExp(pat).test(el.innerText); }",
        arg=['#stats [data-stat="state"] .memstep-stat-value', pattern], timeout=timeout_s * 1000)


def upload(page, path) -> None:
    """Upload a file through the Run tab's file input."""
    page.locator("#upload input[type=file]").set_input_files(str(path))


def wait_for_toast(page, text: str | re.Pattern, timeout_s: float = 60) -> str:
    """Wait for a toast (error or warning) containing ``text``; returns its text."""
    toast = page.locator(".toast-body").filter(has_text=text).first
    toast.wait_for(state="visible", timeout=timeout_s * 1000)
    return toast.inner_text()


def rendered_plots(page, elem_ids) -> int:
    """How many of the plots ``elem_ids`` have drawn their Plotly SVG."""
    return sum(page.locator(plot_selector(elem_id)).count() > 0 for elem_id in elem_ids)
