"""Screenshot of the Compress tab's pruning section after a real run (assets/screenshots/compress_sparse.png).

Launches the app, opens Compress > Pruning + reconstruction, prunes the Run tab's model (the
embedded SmolLM2-135M unless MEMSTEP_MODEL says otherwise) with Wanda 50% and the chosen
techniques on small calibration settings, waits for the end and captures the section.

    .venv/bin/python scripts/screenshot_sparse.py      # several minutes per technique on a 2-core CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.screenshots import capture_after  # noqa: E402
from ui.browser import set_number  # noqa: E402


def open_section(page) -> None:
    page.get_by_role("tab", name="Compress").click()
    page.get_by_role("tab", name="Pruning + reconstruction").click()
    page.locator("#sparse-run").wait_for(state="visible", timeout=30_000)


def set_techniques(page, techniques: list[str]) -> None:
    for box in page.locator("#sparse-techniques label").all():
        name = box.inner_text().strip()
        checkbox = box.locator("input")
        if (name in techniques) != checkbox.is_checked():
            checkbox.click()


def prune_in_app(page, techniques, samples, seq_len, epochs, timeout_s=3600) -> float:
    set_techniques(page, techniques)
    set_number(page, "sparse-samples", samples)
    set_number(page, "sparse-seq-len", seq_len)
    set_number(page, "sparse-epochs", epochs)
    began = time.perf_counter()
    page.locator("#sparse-run").click()
    page.wait_for_function("() => /Done\\./.test(document.querySelector('#sparse-status')?.innerText || '')",
                           timeout=timeout_s * 1000)
    page.wait_for_selector("#sparse-plot .js-plotly-plot .main-svg", timeout=30_000)
    return time.perf_counter() - began


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshots" / "compress_sparse.png")
    parser.add_argument("--techniques", nargs="+", default=["none", "LR", "BR+GP", "BR+GP+CR"])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    def act(page):
        open_section(page)
        seconds = prune_in_app(page, args.techniques, args.samples, args.seq_len, args.epochs)
        print(f"pruning: {seconds:.0f} s")

    capture_after(act, args.out, settle_s=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
