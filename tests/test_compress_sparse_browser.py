"""The Compress tab's pruning section in headless Chromium, on a tiny model: a run streams its
curves and table, a bad setting shows a toast and the page keeps working, and the pruned model
loads into the Run tab in one click."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_tiny_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    from transformers import AutoTokenizer

    from memstep import models
    from memstep.errors import MemstepError
    from ui.browser import CHROMIUM, serve

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make chromium)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(models.embedded_model_folder()))
    except MemstepError as err:
        pytest.skip(str(err))
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = make_tiny_model("llama", layers=2, vocab_size=len(tokenizer), max_position_embeddings=8192)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    patch = pytest.MonkeyPatch()
    patch.setenv("MEMSTEP_MODEL", str(folder))
    patch.setenv("MEMSTEP_COMPRESSED", str(tmp_path_factory.mktemp("compressed")))
    from ui.layout import build_app

    try:
        with serve(build_app()) as url:
            yield url
    finally:
        patch.undo()


def test_prune_streams_curves_and_loads_into_run(app_url, artifacts_dir):
    from scripts.screenshot_sparse import open_section, prune_in_app
    from ui.browser import chromium_page, open_app, set_number, wait_for_toast

    with chromium_page() as page:
        open_app(page, app_url)
        open_section(page)
        set_number(page, "sparse-samples", 0)  # out of bounds: a toast, nothing runs
        page.locator("#sparse-run").click()
        assert "1-32" in wait_for_toast(page, "samples must be", timeout_s=30)
        prune_in_app(page, ["none", "BR+GP"], samples=4, seq_len=16, epochs=1, timeout_s=300)
        assert page.locator("#sparse-plot .js-plotly-plot .scatterlayer .trace").count() == 4  # 2 x (calib, held)
        page.screenshot(path=str(artifacts_dir / "compress_sparse_tiny.png"), full_page=True)
        table = page.locator("#sparse-table").inner_text()
        assert "none" in table and "BR+GP" in table and "→" in table, table
        folder = page.locator("#sparse-pruned input").input_value()
        assert folder.endswith("sparse-br-gp")
        page.locator("#sparse-load").click()
        # the list names the model by its folder's name; the Run tab's box shows the folder itself
        page.wait_for_function("f => (document.querySelector('#model input')?.value || '').endsWith('/' + f)",
                               arg=folder, timeout=30_000)
        assert page.get_by_role("tab", name="Run").get_attribute("aria-selected") == "true"
