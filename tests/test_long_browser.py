"""A 32k-token document on the page (a tiny random model with the embedded tokenizer, so the run
takes seconds): the views render, nothing overflows sideways, no trace draws more points than
the page's limits, the text view stays a window of the document."""

from __future__ import annotations

import pytest

from tests.conftest import ASSETS, make_tiny_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOKENS = 32_768
CHUNK = 256  # 129 steps: past the charts' bar limit and the map's row limit


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A 2-layer random model that reads the embedded tokenizer's ids, trained window 4,096."""
    from ui.models import embedded_tokenizer

    tokenizer = embedded_tokenizer()
    folder = tmp_path_factory.mktemp("tiny-long")
    make_tiny_model(vocab_size=len(tokenizer), max_position_embeddings=4096).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def long_document(tmp_path_factory):
    text = (ASSETS / "pride_and_prejudice.txt").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("docs") / "novel_32k.txt"
    path.write_text(text[:160_000])  # about 37k tokens: cut to 32,768 by max tokens
    return path


def test_a_32k_token_document_runs_and_its_views_stay_within_the_page(app_url, browser, tiny_folder, long_document,
                                                                      artifacts_dir):
    """One run at a laptop's width; its views are then checked there and at a phone's width."""
    from ui.browser import (horizontal_overflow, new_page, open_advanced, open_app, rendered_plots,
                            resize_and_relayout, set_number, stat, trace_points, upload_document, wait_for_plot, wait_for_state)
    from ui.figures import MAP_ROWS, MAX_BARS, MAX_CELLS
    from ui.views import TEXT_VIEW_TOKENS

    page = new_page(browser, {"width": 1440, "height": 900})
    try:
        open_app(page, app_url)
        open_advanced(page)  # the model is one of the folded controls
        model = page.locator("#model input")
        model.fill(str(tiny_folder))
        model.press("Enter")
        upload_document(page, long_document)
        page.locator("#question textarea").fill("")
        set_number(page, "max-tokens", TOKENS)
        set_number(page, "chunk", CHUNK)
        set_number(page, "memory", 256)
        page.wait_for_function("() => /Preview\\** · 129 steps/.test(document.querySelector('#preview-note')"
                               ".innerText)", timeout=30_000)
        page.locator("#run").click()
        wait_for_state(page, "done", timeout_s=240)
        plots = ("sizes-plot", "retained-plot", "memory-plot", "seconds-plot")
        for plot in plots:
            wait_for_plot(page, plot)
        assert stat(page, "steps") == "129 / 129"
        tokens = int(stat(page, "tokens").split(" / ")[1].replace(",", ""))
        assert tokens > TOKENS  # the document was not cut at the tiny model's 4,096 positions
        for width in (1440, 390):
            resize_and_relayout(page, {"width": width, "height": 900})
            page.screenshot(path=str(artifacts_dir / f"app_long_32k_{width}.png"), full_page=True)
            assert rendered_plots(page, plots) == 4
            assert horizontal_overflow(page) == 0, f"scrolls sideways at {width} px"
            for trace in trace_points(page, "#run-views"):
                limit = MAX_CELLS if trace["type"] == "heatmap" else max(MAX_BARS, 2 * MAP_ROWS + 4)
                assert trace["points"] <= limit, trace
        heatmap = next(t for t in trace_points(page, "#retained-plot") if t["type"] == "heatmap")
        assert heatmap["points"] > 0
        text = page.locator("#retained-text")
        assert f"Showing document tokens {TOKENS - TEXT_VIEW_TOKENS + 1:,}-{TOKENS:,} of {TOKENS:,}" in \
            text.inner_text()
        assert len(text.inner_html()) < 2_000_000  # a window, not the whole document's markup
    finally:
        page.close()
