"""Screenshots of the app after real runs, for the README (assets/screenshots/).

Launches the app on a free port, runs the default example (a 1.5k-token passkey document)
with IMDC and the full-cache reference answer, captures each view, runs the Compare tab
(FM, IM, IMDC) and captures the other tabs, then the Run tab at a phone's width (390 px).
PNGs are palette-quantized to stay small.

    .venv/bin/python scripts/screenshots.py            # a few minutes on a 2-core CPU
    .venv/bin/python scripts/screenshots.py --quick    # no full-cache reference, for a look
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402

from ui.browser import (chromium_page, choose_example, open_app, serve, wait_for_plot,  # noqa: E402
                        wait_for_state)
from ui.documents import DEFAULT_EXAMPLE  # noqa: E402
from ui.layout import build_app  # noqa: E402

QUICK_EXAMPLE = DEFAULT_EXAMPLE
PHONE = {"width": 390, "height": 844}
LIMIT_BYTES = 300_000


def shrink(path: Path) -> int:
    """Quantize a screenshot to a 256-colour palette (UI colours survive); returns its bytes."""
    image = Image.open(path).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    if path.stat().st_size > LIMIT_BYTES:  # a very tall page: halve the colours
        image.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    return path.stat().st_size


def capture_after(act, out: Path, settle_s: float = 1.5) -> None:
    """Serve the app, let ``act(page)`` run something on a fresh 1440 x 1000 page, then save the
    whole page to ``out`` (palette-quantized). Used by the Compress tab's screenshot scripts."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with serve(build_app()) as url, chromium_page({"width": 1440, "height": 1000}) as page:
        open_app(page, url)
        act(page)
        time.sleep(settle_s)
        page.mouse.move(0, 0)
        page.screenshot(path=str(out), full_page=True)
    print(f"{out}: {shrink(out) / 1000:.0f} KB")


def element(page, selector: str, path: Path) -> None:
    page.locator(selector).first.scroll_into_view_if_needed()
    time.sleep(0.3)
    page.locator(selector).first.screenshot(path=str(path))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshots")
    parser.add_argument("--quick", action="store_true", help="the short example, no full-cache reference")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = QUICK_EXAMPLE if args.quick else DEFAULT_EXAMPLE
    shots: list[Path] = []

    def shot(filename: str) -> Path:
        path = args.out / filename
        shots.append(path)
        return path

    with serve(build_app()) as url, chromium_page({"width": 1440, "height": 1000}) as page:
        open_app(page, url)
        if name != DEFAULT_EXAMPLE:
            choose_example(page, name)
            page.wait_for_function("n => document.querySelector('#doc-info').innerText.includes(n)",
                                   arg=name.split(" (")[0], timeout=30_000)
        time.sleep(1)
        page.screenshot(path=str(shot("app_before_run.png")))
        if not args.quick:
            page.locator("#full-reference input").check()
        began = time.perf_counter()
        page.locator("#run").click()
        wait_for_state(page, "done", timeout_s=1200)
        for plot in ("sizes-plot", "retained-plot", "memory-plot", "seconds-plot"):
            wait_for_plot(page, plot)
        print(f"run: {time.perf_counter() - began:.1f} s")
        time.sleep(1)
        page.mouse.move(0, 0)
        page.screenshot(path=str(shot("app_run.png")), full_page=True)
        element(page, "#sizes-plot", shot("view_chunk_memory.png"))
        element(page, "#retained-plot", shot("view_retained_tokens.png"))
        element(page, "#memory-plot", shot("view_memory.png"))
        element(page, "#seconds-plot", shot("view_seconds.png"))
        element(page, "#answer-text", shot("view_text_answer.png"))

        page.get_by_role("tab", name="Compare").click()
        began = time.perf_counter()
        page.locator("#compare-run").click()
        page.wait_for_function("() => /Done/.test(document.querySelector('#compare-status')?.innerText || '')",
                               timeout=1_800_000)
        print(f"compare: {time.perf_counter() - began:.1f} s")
        time.sleep(1)
        page.mouse.move(0, 0)
        page.screenshot(path=str(shot("app_compare.png")), full_page=True)
        for title in ("Plan", "Evaluate"):
            tab = page.get_by_role("tab", name=title)
            if tab.count():
                tab.click()
                time.sleep(3)
                page.screenshot(path=str(shot(f"app_{title.lower()}.png")), full_page=True)
    with serve(build_app()) as url, chromium_page(PHONE) as page:  # the first screen on a phone
        open_app(page, url)
        time.sleep(1)
        page.screenshot(path=str(shot("app_phone.png")))
    for path in shots:
        print(f"{path}: {shrink(path) / 1000:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
