"""Screenshots of the Run tab on Gemma 3 270M (hybrid attention) at 1440 and 390 px, after a
real run of the default example: the whole tab, and at 1440 px its Memory per layer (sliding
and global layers apart), the retained-token map (global layers) and the key numbers.

    flock /tmp/memstep-heavy.lock .venv/bin/python scripts/screenshots_gemma3.py   # a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from screenshots import WIDTHS, element, overflow, shrink  # noqa: E402

from memstep.models import GEMMA3  # noqa: E402
from ui.browser import chromium, new_page, open_app, serve, wait_for_plot, wait_for_state  # noqa: E402
from ui.layout import build_app  # noqa: E402

VIEWS = {"layers": "#layers-plot", "retained_tokens": "#retained-plot", "stats": "#stats"}


def capture(browser, url: str, name: str, out: Path) -> list[Path]:
    page = new_page(browser, WIDTHS[name])
    open_app(page, url)
    page.locator("#model input").click()
    page.get_by_role("option", name=GEMMA3).click()
    time.sleep(2)
    began = time.perf_counter()
    page.locator("#run").click()
    wait_for_state(page, "done", timeout_s=1200)
    for plot in ("retained-plot", "layers-plot"):
        wait_for_plot(page, plot)
    print(f"{name}: run {time.perf_counter() - began:.1f} s", flush=True)
    time.sleep(1.5)
    page.mouse.move(0, 0)
    shots = [out / f"gemma3_run_{name}.png"]
    page.screenshot(path=str(shots[0]), full_page=True)
    print(f"{shots[0].name}: page overflow {overflow(page)} px", flush=True)
    if name == "wide":
        for view, selector in VIEWS.items():
            path = out / f"gemma3_view_{view}_{name}.png"
            element(page, selector, path)
            shots.append(path)
    page.context.close()
    return shots


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with serve(build_app()) as url, chromium() as browser:
        for name in WIDTHS:
            shots += capture(browser, url, name, args.out)
    for path in shots:
        print(f"{path}: {shrink(path) / 1000:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
