"""Screenshots of a whole-book run (Pride and Prejudice, 156k tokens, IMDC at c = M = 1024: 153
steps) on the Run tab, at a laptop's width (1440 px) and a phone's (390 px), for docs/.

One run: the page picks the whole-novel example (it sets chunk and memory to 1,024 and clears max
tokens), runs it to the end, and is captured at 1440 px, then again after the window is narrowed to
390 px. With the embedded model the run takes 10-20 minutes on 2 shared cores.

    flock /tmp/memstep-heavy.lock .venv/bin/python scripts/screenshot_long.py
    .venv/bin/python scripts/screenshot_long.py --model /path/to/folder --out test-artifacts   # a quick look
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.screenshots import WIDTHS, shrink  # noqa: E402
from ui.browser import (choose_example, chromium_page, horizontal_overflow, open_app, serve,  # noqa: E402
                        trace_points, wait_for_plot, wait_for_state)
from ui.documents import WHOLE_BOOK_EXAMPLE  # noqa: E402
from ui.layout import build_app  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model the page accepts (default: the embedded one)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds the run may take")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with serve(build_app()) as url, chromium_page(WIDTHS["wide"]) as page:
        open_app(page, url)
        if args.model:
            box = page.locator("#model input")
            box.fill(args.model)
            box.press("Enter")
        choose_example(page, WHOLE_BOOK_EXAMPLE)
        page.wait_for_function("() => /153 steps/.test(document.querySelector('#preview-note').innerText)",
                               timeout=60_000)
        print(page.locator("#preview-note").inner_text(), file=sys.stderr)
        began = time.perf_counter()
        page.locator("#run").click()
        wait_for_state(page, "done", timeout_s=args.timeout)
        print(f"run done in {time.perf_counter() - began:.0f} s wall", file=sys.stderr)
        for plot in ("sizes-plot", "retained-plot", "memory-plot", "seconds-plot"):
            wait_for_plot(page, plot)
        for name, size in (("wide", WIDTHS["wide"]), ("phone", WIDTHS["phone"])):
            page.set_viewport_size(size)
            time.sleep(2)  # the charts redraw at the new width
            page.mouse.move(0, 0)
            path = args.out / f"whole_book_{name}.png"
            page.screenshot(path=str(path), full_page=True)
            widest = max(t["points"] for t in trace_points(page, "#run-views") if t["type"] != "heatmap")
            print(f"{path}: {shrink(path) / 1000:.0f} KB, overflow {horizontal_overflow(page)} px, "
                  f"at most {widest} points in a chart's trace", file=sys.stderr)
        print(page.locator("#stats").inner_text().replace("\n", " "), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
