"""Screenshots of the Compress tab after real runs, at 1440 and 390 px (docs/screenshots/compress_*):
LaCo at its defaults with the guard's verdict and block influence's row beside LaCo's, then
"keep the better model"; the Block influence section run layer by layer; pruning with added
self-generated calibration (small settings). Also checks that Stop leaves a status that says
"stopped" (LaCo mid-search) and that each button starts its run in one press.

    flock /tmp/memstep-heavy.lock .venv/bin/python scripts/screenshot_compress.py   # ~10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.screenshots import WIDTHS, shrink  # noqa: E402
from ui.browser import chromium_page, open_app, serve, set_number, wait_for_plot  # noqa: E402
from ui.layout import build_app  # noqa: E402

STATE = "document.querySelector('#{0}-status [data-stat=\"{0}-state\"] .memstep-stat-value')?.innerText || ''"


def state(page, section: str) -> str:
    return page.evaluate(f"() => {STATE.format(section)}")


def wait_state(page, section: str, pattern: str, timeout_s: float) -> str:
    page.wait_for_function(f"() => /{pattern}/.test({STATE.format(section)})", timeout=timeout_s * 1000)
    return state(page, section)


def both_widths(page, out: Path, name: str) -> list[Path]:
    paths = []
    for width, size in (("wide", WIDTHS["wide"]), ("phone", WIDTHS["phone"])):
        page.set_viewport_size(size)
        time.sleep(2.0)
        page.mouse.move(0, 0)
        path = out / f"{name}_{width}.png"
        page.screenshot(path=str(path), full_page=True)
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        print(f"{path}: {shrink(path) / 1000:.0f} KB, horizontal overflow {overflow} px", flush=True)
        paths.append(path)
    page.set_viewport_size(WIDTHS["wide"])
    time.sleep(1.0)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--skip", nargs="*", default=[], choices=["stop", "laco", "drop", "sparse"])
    parser.add_argument("--light", action="store_true",
                        help="about a CPU-minute: LaCo on the top layers and the drop without measuring, prune "
                             "with no reconstruction (file names end in _light)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with serve(build_app()) as url, chromium_page(WIDTHS["wide"]) as page:
        open_app(page, url)
        page.get_by_role("tab", name="Compress").click()
        page.get_by_role("tab", name="Layer collapse (LaCo)").click()
        wait_for_plot(page, "laco-similarity")
        page.wait_for_function("() => /estimated/.test(document.querySelector('#laco-estimate')?.innerText || '')",
                               timeout=120_000)
        print("LaCo estimate beside the button:", page.locator("#laco-estimate").inner_text(), flush=True)
        if "stop" not in args.skip:
            page.locator("#laco-run").click()
            wait_state(page, "laco", "^candidate 3", 300)
            page.locator("#laco-stop").click()
            time.sleep(8)  # anything still in flight would land by now
            print("LaCo status 8 s after Stop:", state(page, "laco"), flush=True)
            assert state(page, "laco").startswith("stopped"), state(page, "laco")
            page.screenshot(path=str(args.out / "compress_laco_stopped_wide.png"))
            shrink(args.out / "compress_laco_stopped_wide.png")
        if "laco" not in args.skip:
            if args.light:
                set_number(page, "laco-l", 24)
                page.locator("#laco-evaluate input").uncheck()
            began = time.perf_counter()
            page.locator("#laco-run").click()  # one press
            print("LaCo:", wait_state(page, "laco", "^done", 1200), f"({time.perf_counter() - began:.0f} s)",
                  flush=True)
            print("verdict:", page.locator("#laco-verdict").inner_text(), flush=True)
            both_widths(page, args.out, "compress_laco" + "_light" * args.light)
            if page.locator("#laco-keep").is_visible():
                page.locator("#laco-keep").click()
                page.wait_for_function("() => /Load block influence/.test(document.querySelector('#laco-load')"
                                       "?.innerText || '')", timeout=120_000)
                print("after keep:", state(page, "laco"), "|", page.locator("#laco-load").inner_text(), flush=True)
                page.locator("#laco-verdict").scroll_into_view_if_needed()
                page.screenshot(path=str(args.out / "compress_laco_kept_wide.png"))
                shrink(args.out / "compress_laco_kept_wide.png")
        if "drop" not in args.skip:
            page.get_by_role("tab", name="Block influence (drop layers)").click()
            wait_for_plot(page, "drop-influence")
            set_number(page, "drop-remove", 2)
            if args.light:
                page.locator("#drop-evaluate input").uncheck()
            page.wait_for_function("() => /estimated/.test(document.querySelector('#drop-estimate')?.innerText || '')",
                                   timeout=60_000)
            page.locator("#drop-run").click()
            print("drop:", wait_state(page, "drop", "^done", 900), flush=True)
            both_widths(page, args.out, "compress_drop" + "_light" * args.light)
        if "sparse" not in args.skip:
            page.get_by_role("tab", name="Pruning + reconstruction").click()
            page.locator("#sparse-run").wait_for(state="visible", timeout=30_000)
            page.get_by_label("text + self-generated added (reference)").check()
            for box in page.locator("#sparse-techniques label").all():
                checkbox = box.locator("input")
                wanted = ("none",) if args.light else ("none", "BR+GP")
                if (box.inner_text().strip() in wanted) != checkbox.is_checked():
                    checkbox.click()
            set_number(page, "sparse-samples", 2)
            set_number(page, "sparse-seq-len", 16 if args.light else 32)
            set_number(page, "sparse-epochs", 1)
            page.wait_for_function("() => /estimated/.test(document.querySelector('#sparse-estimate')?.innerText || '')",
                                   timeout=60_000)
            print("sparse estimate:", page.locator("#sparse-estimate").inner_text(), flush=True)
            page.locator("#sparse-run").click()
            page.wait_for_function("() => /Done\\./.test(document.querySelector('#sparse-status')?.innerText || '')",
                                   timeout=1800_000)
            print("sparse:", page.locator("#sparse-status").inner_text()[:300], flush=True)
            both_widths(page, args.out, "compress_sparse" + "_light" * args.light)
    return 0


if __name__ == "__main__":
    sys.exit(main())
