"""Screenshot of the Compress tab's LaCo section after a real run, for the README
(assets/screenshots/compress_laco.png).

Launches the app on a free port, opens Compress → Layer collapse (LaCo), runs it with the
defaults on the embedded model (search, then the dense model, LaCo and the two baselines
measured), waits for the table and captures the section.

    .venv/bin/python scripts/screenshot_laco.py            # about 1-3 minutes on a 2-core CPU
    .venv/bin/python scripts/screenshot_laco.py --quick    # a short search, nothing measured
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from screenshots import capture_after  # noqa: E402

from ui.browser import set_number, wait_for_plot  # noqa: E402


def open_laco(page) -> None:
    page.get_by_role("tab", name="Compress").click()
    page.get_by_role("tab", name="Layer collapse (LaCo)").click()
    wait_for_plot(page, "laco-similarity")


def run_laco(page, timeout_s: float = 900) -> float:
    """Click Collapse and wait for the run to finish; returns its seconds."""
    began = time.perf_counter()
    page.locator("#laco-run").click()
    page.wait_for_function(
        "() => /^done/.test(document.querySelector('#laco-status [data-stat=\"laco-state\"] "
        ".memstep-stat-value')?.innerText || '')", timeout=timeout_s * 1000)
    return time.perf_counter() - began


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshots" / "compress_laco.png")
    parser.add_argument("--quick", action="store_true", help="top layers only, no measurements")
    args = parser.parse_args(argv)
    def act(page):
        open_laco(page)
        if args.quick:
            set_number(page, "laco-l", 24)
            page.locator("#laco-evaluate input").uncheck()
        print(f"LaCo run: {run_laco(page):.1f} s")

    capture_after(act, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
