"""The app in headless Chromium: the preview, an uploaded document run with IMDC on the
embedded model, replay, and bad input shown on the page. Screenshots go to test-artifacts/.

Set MEMSTEP_UPDATE_BASELINES=1 to rewrite tests/baselines/ after an intended change."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import netherfield

from memstep.schedules import make_schedule

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BASELINES = Path(__file__).resolve().parent / "baselines"
CHAPTER_1_CHARS = 3000  # about 700 tokens: a run takes seconds on a CPU
IMDC_CHARS = 1500  # about 350 tokens: IMDC c256 M128 still evicts, in a few steps


@pytest.fixture(scope="module")
def shared(browser, app_url):
    """The module's page at the default laptop size (conftest.SharedAppPage): a test that checks
    defaults or runs a document opens the app afresh; the bad-input checks go on in the same page."""
    from conftest import SharedAppPage
    from ui.browser import new_page

    shared = SharedAppPage(new_page(browser), app_url)
    yield shared
    shared.page.context.close()


@pytest.fixture
def page(shared, request):
    yield shared.open_for(request)
    shared.close_for(request)


@pytest.fixture(scope="module")
def short_document(tmp_path_factory):
    return netherfield(tmp_path_factory.mktemp("docs"), CHAPTER_1_CHARS)


@pytest.fixture(scope="module")
def imdc_document(tmp_path_factory):
    return netherfield(tmp_path_factory.mktemp("docs"), IMDC_CHARS)


def _diff_fraction(a, b) -> float:
    """Fraction of pixels whose colour differs by more than a faint anti-aliasing shift."""
    from PIL import ImageChops

    diff = ImageChops.difference(a.convert("RGB"), b.convert("RGB")).convert("L")
    return sum(diff.point(lambda v: 255 if v > 48 else 0).histogram()[255:]) / (a.width * a.height)


@pytest.mark.fresh_page
def test_schedule_preview_matches_the_baseline_image(page, artifacts_dir):
    from PIL import Image

    shot = artifacts_dir / "schedule_preview.png"
    page.locator("#sizes-plot").screenshot(path=str(shot))
    baseline = BASELINES / "schedule_preview.png"
    if os.environ.get("MEMSTEP_UPDATE_BASELINES") == "1":
        BASELINES.mkdir(exist_ok=True)
        baseline.write_bytes(shot.read_bytes())
    got, want = Image.open(shot), Image.open(baseline)
    assert got.size == want.size, f"preview is {got.size}, baseline {want.size}"
    assert _diff_fraction(got, want) < 0.01, f"preview differs from {baseline}: see {shot}"


def test_preview_follows_the_controls_instantly(page):
    from ui.browser import choose_schedule, set_number

    note = page.locator("#preview-note")
    tokens = int(re.search(r"over ([\d,]+) tokens", note.inner_text()).group(1).replace(",", ""))
    choose_schedule(page, "FM")
    set_number(page, "chunk", 1024)
    expected = make_schedule("fm", tokens, 1024, 512).steps
    page.wait_for_function("n => /Preview\\** · (\\d+) steps/.exec(document.querySelector('#preview-note').innerText)"
                           "?.[1] == n", arg=str(expected), timeout=15_000)
    assert "FM c1024 M512" in page.locator("#sizes-plot").inner_text()
    set_number(page, "memory", 0)  # smaller than the 4 sinks: the preview says so
    page.wait_for_function("() => /smaller than the 4 sink/.test(document.querySelector('#preview-note').innerText)",
                           timeout=15_000)


@pytest.mark.parametrize("name, content, message", [
    # Gradio checks the file type on upload too (its message says "Invalid file type")
    ("table.csv", b"a,b\n1,2\n", re.compile("(Unsupported|Invalid) file type")),
    ("empty.txt", b"", "contains no text"),
    ("blob.txt", bytes(range(256)) * 8, "binary"),
])
def test_bad_uploads_show_a_message_and_keep_the_document(page, tmp_path, name, content, message):
    from ui.browser import upload, wait_for_toast

    settled = ("() => !/processing|^\\s*[0-9.]+s/.test(document.querySelector('#doc-info').innerText)")
    page.wait_for_function(settled, timeout=15_000)  # no handler's progress overlay (its timer reads "2.0s")
    before = page.locator("#doc-info").inner_text()
    path = tmp_path / name
    path.write_bytes(content)
    upload(page, path)
    assert re.search(message, wait_for_toast(page, message))
    page.wait_for_function(settled, timeout=15_000)  # the handler's progress overlay has gone
    assert page.locator("#doc-info").inner_text() == before


def test_bad_settings_and_models_show_an_error_and_the_app_keeps_serving(page, tmp_path, artifacts_dir):
    from ui.browser import open_advanced, set_number, wait_for_toast

    set_number(page, "memory", 0)  # fewer than the 4 sinks: the preview says so and Run waits for a fix
    page.wait_for_function("() => /smaller than the 4 sink/.test(document.querySelector('#preview-note').innerText)"
                           " && document.querySelector('#run').disabled", timeout=15_000)
    set_number(page, "memory", 512)
    page.wait_for_function("() => !document.querySelector('#run').disabled", timeout=15_000)
    open_advanced(page)  # the model is one of the folded controls
    model = page.locator("#model input")
    model.fill(str(tmp_path))  # a folder without a model in it
    model.press("Enter")
    page.locator("#run").click()
    wait_for_toast(page, "cannot load model")
    page.screenshot(path=str(artifacts_dir / "app_bad_model.png"), full_page=True)
    model.fill("embedded")  # the app still answers: the preview follows the next change
    model.press("Enter")
    set_number(page, "chunk", 1024)
    page.wait_for_function("() => /c1024 M512/.test(document.querySelector('#sizes-plot').innerText)",
                           timeout=15_000)


@pytest.mark.fresh_page
def test_upload_run_imdc_and_replay(page, imdc_document, artifacts_dir):
    from memstep.reading import read_document
    from memstep.generate import prompt_parts
    from ui.models import embedded_tokenizer
    from ui.browser import choose_schedule, rendered_plots, set_number, stat, upload_document, wait_for_plot, wait_for_state

    upload_document(page, imdc_document)
    page.locator("#question textarea").fill("Who has taken Netherfield Park?")
    choose_schedule(page, "IMDC")
    set_number(page, "chunk", 256)
    set_number(page, "memory", 128)
    text = read_document(imdc_document)  # as the server reads it (normalized)
    tokenizer = embedded_tokenizer()  # the embedded model's own tokenizer
    tokens = len(prompt_parts(tokenizer).head) + len(tokenizer(text, add_special_tokens=False)["input_ids"])
    steps = make_schedule("imdc", tokens, 256, 128).steps
    page.locator("#run").click()
    wait_for_state(page, "done", timeout_s=600)
    plots = ("sizes-plot", "retained-plot", "memory-plot", "seconds-plot")
    for plot in plots:
        wait_for_plot(page, plot)
    page.screenshot(path=str(artifacts_dir / "app_run_imdc.png"), full_page=True)

    assert rendered_plots(page, plots) == 4
    assert stat(page, "steps") == f"{steps} / {steps}"
    assert stat(page, "tokens") == f"{tokens:,} / {tokens:,}"
    assert stat(page, "memory") == f"{128 + 4:,} per layer"
    assert stat(page, "measured") == "n/a on this device"
    assert re.fullmatch(r"\d+\.\d MiB", stat(page, "modeled"))
    assert "From the compressed memory (IMDC c256 M128)" in page.locator("#answer").inner_text()
    assert page.locator("#retained-text span[style*='background']").count() > 10
    assert "after step" in page.locator("#retained-plot").inner_text()

    set_number(page, "replay", 1)  # replay: the run as it was after the first step
    page.wait_for_function("n => document.querySelector('#stats [data-stat=steps] .memstep-stat-value')"
                           ".innerText == '1 / ' + n", arg=str(steps), timeout=15_000)
    assert stat(page, "state").startswith("replay")
    page.screenshot(path=str(artifacts_dir / "app_replay_step1.png"), full_page=True)


@pytest.mark.fresh_page
def test_stop_cancels_a_run_and_the_next_run_completes(page, short_document, hold_for_stop):
    from ui.browser import choose_schedule, set_number, stat, upload_document, wait_for_state

    upload_document(page, short_document)
    choose_schedule(page, "FM")
    set_number(page, "chunk", 16)  # some 45 short steps
    hold_for_stop(2)  # the run waits after its second step until Stop reaches the server
    page.locator("#run").click()
    wait_for_state(page, "running", timeout_s=300)
    page.locator("#stop").click()
    wait_for_state(page, "stopped", timeout_s=30)
    stopped_at = stat(page, "steps")
    page.wait_for_timeout(3000)
    assert stat(page, "steps") == stopped_at  # no step arrives after Stop
    done, total = (int(x) for x in stopped_at.split(" / "))
    assert done < total
    assert "Stopped" in page.locator("#answer").inner_text()
    assert page.locator("#replay input[type=range]").is_enabled()  # the steps so far can be replayed
    set_number(page, "chunk", 512)
    page.locator("#run").click()  # the model is free again: the next run goes through
    wait_for_state(page, "done", timeout_s=600)
    assert stat(page, "steps") == "2 / 2"
