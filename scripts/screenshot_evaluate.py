"""Screenshots of the Evaluate tab at a laptop's width (1440 px) and a phone's (390 px), with the
results the tab chooses (results/eval, the committed evaluation, unless $MEMSTEP_RESULTS or
results/local holds results), in light and dark mode.

    .venv/bin/python scripts/screenshot_evaluate.py        # docs/screenshots/evaluate_{wide,phone}[_dark].png

Nothing runs a model: the tab only reads results. Prints each file and the page's horizontal
overflow (0 = none)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from screenshots import THEMES, WIDTHS, open_tab, overflow, shrink  # noqa: E402

from ui.browser import chromium, new_page, open_app, serve, wait_for_plot  # noqa: E402
from ui.layout import build_app  # noqa: E402


def main(out: Path = ROOT / "docs" / "screenshots") -> int:
    out.mkdir(parents=True, exist_ok=True)
    with serve(build_app()) as url, chromium() as browser:
        for theme, name in ((theme, name) for theme in THEMES for name in ("wide", "phone")):
            page = new_page(browser, WIDTHS[name])
            open_app(page, url + THEMES[theme])
            open_tab(page, "Evaluate")
            wait_for_plot(page, "eval-intervals")
            time.sleep(1.5)
            page.mouse.move(0, 0)
            path = out / f"evaluate_{name}{'' if theme == 'light' else '_' + theme}.png"
            page.screenshot(path=str(path), full_page=True)
            print(f"{path}: {shrink(path) / 1000:.0f} KB, page overflow {overflow(page)} px", flush=True)
            page.context.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
