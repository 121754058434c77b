"""Screenshots of every tab after real runs, at a laptop's width (1440 px) and a phone's (390 px),
for the README and docs/ (docs/screenshots/).

Launches the app on a free port and, at each width, in light and in dark mode: runs the default
example (a 1.5k-token passkey document, IMDC, with the full-cache answer) on the Run tab, points
at the retained-token map (its words show under it), clicks it (the token outlined in the text)
and captures the tab and each of its views; runs the Compare tab (FM, IM, IMDC and one cut after
a full prefill on the same document, in the light pass, captured in both modes: the page's dark
class switched on); captures the Plan, Evaluate and Compress tabs. Dark files end in ``_dark``.
PNGs are palette-quantized to stay small. Prints each file and the page's width, so a horizontal
overflow shows here too.

    flock /tmp/memstep-heavy.lock .venv/bin/python scripts/screenshots.py     # 10-15 minutes on 2 cores
    .venv/bin/python scripts/screenshots.py --quick     # no Compare run, the laptop width only
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402

from ui.browser import (chromium, chromium_page, new_page, open_app, serve, wait_for_plot,  # noqa: E402
                        wait_for_state)
from ui.layout import build_app  # noqa: E402

WIDTHS = {"wide": {"width": 1440, "height": 1000}, "phone": {"width": 390, "height": 844}}
RUN_VIEWS = {"answer": "#answer", "chunk_memory": "#sizes-plot", "retained_tokens": "#retained-plot",
             "memory": "#memory-plot", "seconds": "#seconds-plot", "text": "#answer-text"}
THEMES = {"light": "", "dark": "?__theme=dark"}  # Gradio's own switch
LIMIT_BYTES = 400_000
SEARCH = "Elliot"  # a name the default example's text holds: the view outlines its matches


def shrink(path: Path) -> int:
    """Quantize a screenshot to a 256-colour palette (UI colours survive); returns its bytes."""
    image = Image.open(path).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    if path.stat().st_size > LIMIT_BYTES:  # a very tall page: fewer colours
        image.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    return path.stat().st_size


def capture_after(act, out: Path, settle_s: float = 1.5) -> None:
    """Serve the app, let ``act(page)`` run something on a fresh 1440 x 1000 page, then save the
    whole page to ``out`` (palette-quantized). Used by the Compress tab's screenshot scripts."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with serve(build_app()) as url, chromium_page(WIDTHS["wide"]) as page:
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


def overflow(page) -> int:
    """Pixels the page is wider than the window (0: no horizontal scroll)."""
    return page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")


def open_tab(page, title: str) -> None:
    page.get_by_role("tab", name=title).first.click()
    time.sleep(2.5)


def point_at_map(page) -> None:
    """Hover the middle of the retained-token map: the tokens under the pointer show beneath it."""
    drag = page.locator("#retained-plot .nsewdrag").first
    drag.scroll_into_view_if_needed()
    box = drag.bounding_box()
    for dx in (0, 2):
        page.mouse.move(box["x"] + box["width"] * 0.45 + dx, box["y"] + box["height"] * 0.8)
    time.sleep(0.5)


def click_map(page) -> None:
    """Click the retained-token map's last row: its token is outlined in the text view."""
    drag = page.locator("#retained-plot .nsewdrag").first
    drag.scroll_into_view_if_needed()
    box = drag.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.9)
    page.wait_for_selector("#retained-text .memstep-pointed", timeout=30_000)
    time.sleep(2)  # the replay redraws the text at that step; the outline goes back on


def capture_width(browser, url: str, name: str, out: Path, compare: bool, theme: str = "light") -> list[Path]:
    shots: list[Path] = []
    tag = name if theme == "light" else f"{name}_{theme}"

    def save(filename: str, selector: str | None = None, keep_pointer: bool = False, suffix: str = tag,
             whole: bool = True) -> None:
        path = out / f"{filename}_{suffix}.png"
        if not keep_pointer:
            page.mouse.move(0, 0)
        if selector:
            element(page, selector, path)
        else:
            page.screenshot(path=str(path), full_page=whole)
        shots.append(path)
        print(f"{path.name}: page overflow {overflow(page)} px", flush=True)

    page = new_page(browser, WIDTHS[name])
    open_app(page, url + THEMES[theme])
    time.sleep(1)
    page.screenshot(path=str(out / f"run_before_{tag}.png"))
    shots.append(out / f"run_before_{tag}.png")
    began = time.perf_counter()
    page.locator("#run").click()
    wait_for_state(page, "done", timeout_s=1200)
    for plot in ("sizes-plot", "retained-plot", "memory-plot", "seconds-plot"):
        wait_for_plot(page, plot)
    print(f"{name}: run {time.perf_counter() - began:.1f} s", flush=True)
    page.locator("#search textarea, #search input").first.fill(SEARCH)
    page.wait_for_function("() => document.querySelector('#retained-text .memstep-search-result')", timeout=30_000)
    time.sleep(1)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(out / f"run_first_screen_{tag}.png"))  # what a reader sees beside Run
    shots.append(out / f"run_first_screen_{tag}.png")
    point_at_map(page)
    save("run", keep_pointer=True)
    if name == "wide":
        for view, selector in RUN_VIEWS.items():
            save(f"view_{view}", selector)
        point_at_map(page)
        save("view_map_pointer", "#run-views", keep_pointer=True)
    click_map(page)  # the map and the words together: the clicked token outlined in the text, in view
    save("view_map_click", keep_pointer=True, whole=False)  # the window as the click left it
    open_tab(page, "Compare")
    if compare:
        began = time.perf_counter()
        page.locator("#compare-run").click()
        page.wait_for_function("() => /Done/.test(document.querySelector('#compare-status')?.innerText || '')",
                               timeout=1_800_000)
        print(f"{name}: compare {time.perf_counter() - began:.1f} s", flush=True)
        time.sleep(1.5)
        for dark in (False, True):  # the run's results in both modes (the page's own dark class)
            page.evaluate("(dark) => document.body.classList.toggle('dark', dark)", dark)
            time.sleep(1)
            save("compare", suffix=f"{name}_dark" if dark else name)
            save("compare_kept", "#compare-kept", suffix=f"{name}_dark" if dark else name)
        page.evaluate("() => document.body.classList.remove('dark')")
    elif theme == "light":
        save("compare")
    for title in ("Plan", "Evaluate", "Compress"):
        open_tab(page, title)
        save(title.lower())
    page.context.close()
    return shots


def index(shots: list[Path], out: Path) -> str:
    """docs/screenshots/README.md: what the pictures are, and a link to each, by tab and mode."""
    lines = [f"Screenshots of every tab at 1440 px (`*_wide`) and 390 px (`*_phone`), in light and dark mode "
             f"(`*_dark`), made by `scripts/screenshots.py` on {datetime.date.today().isoformat()} after real runs "
             "of the default example (the Compare run once per width, shown in both modes). Do not edit by hand: "
             "rerun the script.",
             "", "| picture | light | dark |", "|---|---|---|"]
    names = sorted({p.stem.removesuffix("_dark") for p in shots if p.parent == out})
    for stem in names:
        light, dark = out / f"{stem}.png", out / f"{stem}_dark.png"
        cell = lambda path: f"[{path.name}]({path.name})" if path in shots else "-"  # noqa: E731
        lines.append(f"| {stem.replace('_', ' ')} | {cell(light)} | {cell(dark)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--quick", action="store_true", help="no Compare run, the laptop width only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with serve(build_app()) as url, chromium() as browser:
        for theme in (["light"] if args.quick else list(THEMES)):
            for name in (["wide"] if args.quick else list(WIDTHS)):
                shots += capture_width(browser, url, name, args.out, compare=not args.quick and theme == "light",
                                       theme=theme)
    for path in shots:
        print(f"{path}: {shrink(path) / 1000:.0f} KB")
    if args.out == ROOT / "docs" / "screenshots" and not args.quick:  # date the README's pictures
        from benchmarks.docs_block import write_block

        write_block("screenshots", "Pictures of this README: every tab at 1440 and 390 px, after real runs of the "
                    "default example, in [docs/screenshots](docs/screenshots/).", "scripts/screenshots.py",
                    doc=ROOT / "README.md")
    (args.out / "README.md").write_text(index(shots, args.out), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
