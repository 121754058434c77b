"""The Compress tab's LaCo section: figures and table as pure functions of run events, bad
settings as messages, the check deciding the save on the page (not saved when worse, saved when
"keep a worse model" is ticked, the check alone when the measurements are off), and (browser) a
short real run in headless Chromium that loads the collapsed model into the Run tab."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_models import deep_lm_folder  # noqa: F401  (fixture)

from ui.tabs.compress import laco

CANDIDATES = [
    {"step": 0, "layers": [8, 9], "merged": [8, 9], "similarity": 0.9, "accepted": True, "layers_after": 9},
    {"step": 1, "layers": [7, 8], "merged": [7, 8, 9], "similarity": 0.4, "accepted": False, "layers_after": 9},
    {"step": 2, "layers": [6, 7], "merged": [6, 7], "similarity": 0.7, "accepted": True, "layers_after": 8},
]


def test_similarity_figure_splits_merged_and_kept_and_draws_T():
    fig = laco.similarity_figure(CANDIDATES, 0.5, 10)
    merged, kept = fig.data[0], fig.data[1]
    assert list(merged.x) == [8, 6] and list(merged.y) == [0.9, 0.7]
    assert list(kept.x) == [7] and list(kept.y) == [0.4]
    assert any(shape.y0 == 0.5 for shape in fig.layout.shapes)  # the threshold line
    assert tuple(fig.layout.xaxis.range) == (9.5, -0.5)  # the walk reads left to right, top layer first
    assert "candidate 3" in fig.layout.annotations[0].text


def test_groups_so_far_and_layer_map():
    assert laco._groups_so_far(10, CANDIDATES) == [[0], [1], [2], [3], [4], [5], [6, 7], [8, 9]]
    rows = laco.layer_rows(10, [[0], [1], [2], [3], [4], [5], [6, 7], [8, 9]], {"uniform": [2, 7]})
    label, state, text = rows[0]
    assert label == "LaCo" and state[6] == "base" and text[6] == "+1" and state[7] == "merged" and text[7] == "→6"
    assert state.count("kept") == 6
    assert rows[1][1][2] == rows[1][1][7] == "removed" and rows[1][1].count("kept") == 8
    fig = laco.layer_map_figure(10, [[0], [1], [2], [3], [4], [5], [6, 7], [8, 9]], {"uniform": [2, 7]})
    assert list(fig.data[0].x) == ["LaCo", "uniform"] and len(fig.data[0].z) == 10  # a row per layer


def test_table_rows_ratios_against_dense():
    def row(label, layers, ppl, seconds, correct, removed=None):
        out = {"label": label, "layers": layers, "params": layers * 1e6, "weight_bytes": layers * 4e6,
               "kv_bytes_per_token": layers * 1536, "perplexity": ppl, "passkey_accuracy": sum(correct) / 2,
               "passkey_correct": correct, "prefill_seconds": 9.0, "prefill_cpu_seconds": seconds}
        return out | ({"removed": removed} if removed is not None else {})

    rows = laco.table_rows({"dense": row("dense", 30, 20.0, 4.0, [True, True]),
                            "uniform": row("uniform removal", 24, 50.0, 3.0, [True, False], [1, 5])})
    assert rows[0][2] == "—" and rows[0][5] == "20.00 (×1.00)" and rows[0][6] == "2/2" and rows[0][7] == "4.00"
    assert rows[1][2] == "1, 5" and rows[1][5] == "50.00 (×2.50)" and rows[1][6] == "1/2"
    assert rows[1][7] == "3.00 (25%)"  # CPU seconds and the share saved
    assert rows[1][4] == "36.0\u00a0KiB" and rows[1][3] == "24.0\u00a0M · 92\u00a0MiB"  # units stay with numbers


def test_folder_name_and_bad_settings():
    name = laco.folder_name("SmolLM2-135M-Instruct (embedded)", dict(variant="paper", reference="dense", C=2, L=1,
                                                                     H=30, I=1, T=0.8, sentences=6, tokens=128))
    assert name == "smollm2-135m-instruct-embedded-laco-paper-dense-C2L1H30I1T0.8-cal6x128"
    import gradio as gr

    for args, words in (((1, 1, 0, 1, 0.8), "C must be at least 2"), ((2, 1, 0, 1, 0.8, 99), "calibration sentences"),
                        ((2, 1, 0, 1, "x"), "T must be a number"), ((2, 1, 0, 1.5, 0.8), "whole number")):
        C, L, H, I, T, *rest = args  # noqa: E741
        sentences = rest[0] if rest else 2
        with pytest.raises(gr.Error, match=words):
            next(laco.run_laco("embedded", C, L, H, I, T, "paper", "dense", sentences, 16, False))


@pytest.mark.slow
@pytest.mark.browser
def test_short_laco_run_in_the_browser_loads_into_run(tmp_path, monkeypatch, artifacts_dir, browser):
    """Its own server (the compressed models' folder is this test's), in the session's browser."""
    from ui.browser import chromium_page, open_app, serve, set_number, wait_for_plot
    from ui.layout import build_app

    monkeypatch.setenv("MEMSTEP_COMPRESSED", str(tmp_path / "compressed"))
    with serve(build_app()) as url, chromium_page() as page:
        open_app(page, url)
        page.get_by_role("tab", name="Compress").click()
        page.get_by_role("tab", name="Layer collapse (LaCo)").click()
        wait_for_plot(page, "laco-similarity")
        set_number(page, "laco-c", 2)
        set_number(page, "laco-i", 1)
        set_number(page, "laco-l", 25)
        set_number(page, "laco-sentences", 2)
        set_number(page, "laco-tokens", 32)
        set_number(page, "laco-t", 0.5)
        page.locator("#laco-evaluate input").uncheck()
        # two sentences of 32 tokens merge layers the check finds worse than block influence: this test
        # is about loading a model into Run, so it keeps the worse one, as a user who ticks the box does
        page.locator("#laco-keep-worse input").check()
        page.locator("#laco-run").click()
        page.wait_for_function(
            "() => /^done/.test(document.querySelector('#laco-status [data-stat=\"laco-state\"] "
            ".memstep-stat-value')?.innerText || '')", timeout=240_000)
        state = page.locator('#laco-status [data-stat="laco-state"] .memstep-stat-value').inner_text()
        wait_for_plot(page, "laco-similarity")
        wait_for_plot(page, "laco-map")
        assert page.locator("#laco-similarity .scatterlayer .point").count() == 3  # H = 29 (the top index): l = 27, 26, 25
        page.screenshot(path=str(artifacts_dir / "compress_laco_short.png"), full_page=True)
        if "removed none" in state:
            pytest.fail(f"the short run should merge something at T=0.5: {state}")
        assert page.locator("#laco-load").is_enabled()
        page.locator("#laco-load").click()
        page.wait_for_function("() => document.querySelector('#model input')?.value.includes('laco-paper')",
                               timeout=30_000)
        assert page.locator("#run").is_visible()  # the Run tab is shown
        folder = page.locator("#model input").input_value()
        assert folder.startswith(str(tmp_path / "compressed"))


def test_guard_verdict_and_influence_figure():
    from ui.tabs.compress import drop

    worse = laco.verdict_html({"worse": True, "removed_layers": 2, "layers": 28, "perplexity": 1579.96,
                               "baseline_perplexity": 30.02, "dense_perplexity": 24.46})
    assert "worse than dropping the same 2 layers by block influence" in worse and "1,579.96" in worse
    assert "30.02" in worse and "role='alert'" in worse
    fine = laco.verdict_html({"worse": False, "removed_layers": 2, "layers": 28, "perplexity": 29.0,
                              "baseline_perplexity": 30.02, "dense_perplexity": 24.46})
    assert "no worse" in fine and "alert" not in fine
    fig = drop.influence_figure([0.3, 0.01, 0.2, 0.05], [1, 3], 4)
    kept, dropped = fig.data
    assert list(kept.x) == [0, 2] and list(dropped.x) == [1, 3] and dropped.marker.color == drop.DROPPED
    assert fig.layout.yaxis.type == "log" and drop.influence_figure([], [], 30).layout.yaxis.type == "linear"


def test_keep_baseline_refuses_without_a_run():
    import gradio as gr

    for bad in (None, {"spec": "embedded"}, {"spec": "embedded", "removed": "1,2"}):
        with pytest.raises(gr.Error):
            laco.keep_baseline(bad)


def test_verdict_says_whether_the_worse_model_was_saved():
    worse = {"worse": True, "removed_layers": 2, "layers": 28, "perplexity": 1579.96, "baseline_perplexity": 30.02,
             "dense_perplexity": 24.46}
    refused = laco.verdict_html(worse, refused="not saved: ...")
    assert "Not saved." in refused and f"tick “{laco.KEEP_BOX}”" in refused and "1,579.96" in refused
    kept = laco.verdict_html(worse, kept=True)
    assert "Saved anyway" in kept and "Not saved" not in kept and "30.02" in kept
    assert laco.verdict_html(None) == ""


@pytest.mark.parametrize("keep_worse", [False, True])
def test_the_page_saves_a_worse_model_only_when_asked(tmp_path, monkeypatch, deep_lm_folder, keep_worse):  # noqa: F811
    """The measurements off: the check alone runs (dense, LaCo, block influence) and decides the
    save. The verdict is forced to "worse" so both outcomes are seen whatever the random model."""
    from memstep.compress import collapse_run

    monkeypatch.setenv("MEMSTEP_COMPRESSED", str(tmp_path / "compressed"))
    monkeypatch.delenv("SPACE_ID", raising=False)
    real_compare = collapse_run.compare

    def worse(method, baseline, dense):
        verdict = real_compare(method, baseline, dense)
        verdict["worse"] = True
        return verdict

    monkeypatch.setattr(collapse_run, "compare", worse)
    outputs = list(laco.run_laco(str(deep_lm_folder), 2, 0, 0, 1, 0.01, "paper", "dense", 2, 16, False, "chained",
                                 keep_worse, request=SimpleNamespace(session_hash="k")))
    status, verdict, table, load, folder = (outputs[-1][0], outputs[-1][3], outputs[-1][4], outputs[-1][5],
                                            outputs[-1][6])
    assert [row[0] for row in table] == ["dense", "LaCo (paper formula)", "block influence (ShortGPT)"]
    assert all(row[6] == "—" and row[7] == "—" for row in table)  # the check: no passkey, no prefill
    if keep_worse:
        assert folder and Path(folder).is_dir() and "Saved anyway" in verdict and load["interactive"]
        assert "kept although worse" in status
    else:
        assert folder is None and "Not saved." in verdict and not load["interactive"]
        assert "not saved: the check finds it worse than block influence" in status
        assert not any((tmp_path / "compressed").glob("*laco*"))
