"""The Run tab's story without a browser: the map's words under each column, the text's token
indices the map points at, the status after Stop and after a failure, the reset on a new
document, the search line and the step CSV counted like the page."""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

import numpy as np
import pytest

from memstep.schedules import make_schedule

try:
    from test_figures import fake_records, word_document
except ImportError:  # tests/ imported as a package
    from tests.test_figures import fake_records, word_document


@pytest.fixture
def fm():
    return make_schedule("fm", 1044, 256, 256)  # 20 prompt tokens + 1,024 one-word tokens, 5 steps


def test_each_map_column_carries_its_words(fm):
    from ui.views import column_words

    doc = word_document(fm)
    one = column_words(doc, 1, fm.tokens)
    assert one[0].startswith("the prompt's head") and one[19] == one[0]
    assert one[20] == "⟦w0⟧ w1 w2 w3 w4"  # the token in brackets, four neighbours each side
    assert one[520] == "w496 w497 w498 w499 ⟦w500⟧ w501 w502 w503 w504"
    wide = column_words(doc, 4, 261)
    assert wide[5] == "w0 w1 w2 w3" and wide[4].startswith("the prompt's head")
    assert all(len(words) <= 90 for words in column_words(doc, 64, 17))  # cut to a line


def test_the_map_figure_ships_the_words_and_the_text_its_token_indices(fm):
    from ui.runs import RunSettings
    from ui.views import RunView, render

    view = RunView(word_document(fm), RunSettings("fm", 256, 256), fm, records=fake_records(fm))
    shown = render(view)
    meta = shown.retained.layout.meta
    z = np.asarray(shown.retained.data[0].z)
    assert meta["width"] == 1 and meta["prefix"] == 20 and len(meta["words"]) == z.shape[1] == fm.tokens
    assert meta["words"][120] == "w96 w97 w98 w99 ⟦w100⟧ w101 w102 w103 w104"
    indices = [int(i) for i in __import__("re").findall(r'data-t="(\d+)"', shown.text)]
    assert indices[0] == 0 and indices == sorted(indices) and max(indices) < 1024


def test_a_stopped_runs_map_shows_what_it_read(fm):
    from ui.runs import RunSettings
    from ui.views import RunView, render

    records = fake_records(fm)
    view = RunView(word_document(fm), RunSettings("fm", 256, 256), fm, records=records[:2])
    running = render(view)  # mid-run: every step's row and every position, the unread part hatched
    assert np.asarray(running.retained.data[0].z).shape == (5, fm.tokens)
    view.stopped = True
    stopped = render(view)
    read = records[1].tokens_seen
    z = np.asarray(stopped.retained.data[0].z, dtype=float)
    assert z.shape == (2, read) and not np.isnan(z[1]).any()  # two steps, the positions they read, all drawn
    assert tuple(stopped.retained.layout.xaxis.range) == (-0.5, read - 0.5)
    assert "stopped at step 2 of 5" in stopped.retained.layout.title.text
    replay = render(view, step=0)  # replaying a step keeps the whole run's frame
    assert np.asarray(replay.retained.data[0].z).shape[1] == fm.tokens


def test_stop_leaves_no_time_and_a_failure_leaves_no_starting(fm):
    from ui import handlers
    from ui.runs import RunSettings
    from ui.views import RunView, stats_html

    view = RunView(word_document(fm), RunSettings("fm", 256, 256), fm, records=fake_records(fm)[:2])
    view.now = "step 3 of 5: reading tokens 532-788 · about 26 min left"
    assert "about 26 min left" in stats_html(view)
    view.stopped = True
    shown = stats_html(view)
    now = shown.split('id="memstep-now">', 1)[1].split("</p>", 1)[0]
    assert now == "stopped after step 2 of 5: the steps so far stay for replay" and "min left" not in shown
    failed = handlers.run_failed()
    assert "failed" in failed and "starting" not in failed


def test_a_new_document_resets_every_view_of_the_last_run():
    from ui import handlers
    from ui.views import answer_markdown

    stats, answer, view, views, charts, hint, aware, json_button, csv_button, text = handlers.reset_views()
    assert "not run yet" in stats and answer == answer_markdown(None) and view is None and text == ""
    assert views.visible is False and charts.visible is False and hint.visible is True
    assert aware.visible is False and json_button.visible is False and csv_button.visible is False


def test_the_search_line_says_a_share_once_when_its_ends_round_alike(fm):
    from ui.runs import RunSettings
    from ui.views import RunView, search_spans, search_summary

    view = RunView(word_document(fm), RunSettings("fm", 256, 256), fm, records=fake_records(fm))
    text = view.document.source.text
    line = search_summary(view, "w1000", search_spans("w1000", text), view.records)
    assert "kept by 100% of" in line and "100%-100%" not in line


def test_a_run_keeps_the_search_through_its_updates(fm):
    """The query goes with the run: every streamed update outlines its matches (the summary
    does not vanish on a rerun while the box still holds the word)."""
    from ui import handlers
    from ui.runs import RunSettings

    def stream():
        yield "schedule", fm
        yield from (("step", r) for r in fake_records(fm))

    updates = list(handlers._stream_run(stream(), word_document(fm), RunSettings("fm", 256, 256), None, False, 0.0,
                                        lambda *a, **k: None, "search", query="w1000"))
    assert all("memstep-search-result" in update[5] for update in updates)


def test_the_step_csv_counts_steps_from_one_like_the_page(fm):
    from memstep.records import RunResult
    from ui.share import steps_csv

    records = fake_records(fm)
    result = SimpleNamespace(steps=records)
    rows = list(csv.DictReader(io.StringIO(steps_csv(result))))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5]
    assert RunResult  # the JSON keeps the records' own index (it equals `memstep run --json`)


def test_a_size_beyond_its_slider_is_named_and_put_back_in_use():
    """Chunk 100,000 on a 1,524-token document and memory 1,000,000: one note per field, in its
    own words, and the boxes get the values the preview uses (not Gradio's 'Value 100000 is
    greater than maximum value 1524', once per event, with the box keeping 100,000)."""
    import warnings

    from memstep.models import default_model
    from ui import handlers

    doc = handlers.default_document()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figure, note, run, chunk, memory, end = handlers.preview_page(doc, default_model(), "fm", "linear",
                                                                      100_000, 1_000_000, 4, None)
    tokens = chunk["maximum"]
    assert end == tokens  # the slider's end the page holds now
    assert [str(w.message) for w in caught] == [
        f"Chunk size c: 100,000 is more than this document's tokens ({tokens:,}; allowed 16 to {tokens:,}); the box is "
        f"back at {tokens:,}.",
        "Memory size M: 1,000,000 is more than the largest memory this page runs (8,192; allowed 0 to 8,192); the box "
        "is back at 8,192."]
    assert chunk["value"] == tokens and memory["value"] == handlers.MEMORY_MAX
    assert note.startswith("**Preview** · 1 steps") and f"over {tokens:,} tokens" in note
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        *_, chunk, memory, _ = handlers.preview_page(doc, default_model(), "fm", "linear", 256, 256, 4, None)
    assert not caught and "value" not in chunk and "value" not in memory  # in range: the boxes are the user's


def test_the_chunk_sliders_end_is_sent_only_when_it_moves():
    """An update of a slider redraws it, and a redraw between the user's typing and Enter put the
    old number back (under load: the typed chunk and memory both lost, no change sent). The end
    goes out for a new document or limit, not with every preview."""
    from memstep.models import default_model
    from ui import handlers

    doc, model = handlers.default_document(), default_model()
    first = handlers.preview_page(doc, model, "fm", "linear", 256, 256, 4, None)
    tokens = first[3]["maximum"]
    again = handlers.preview_page(doc, model, "fm", "linear", 256, 256, 4, None, chunk_end=tokens)
    assert again[3] == {"__type__": "update"} and again[5] == tokens  # gr.skip(): the slider is left alone
    cut = handlers.preview_page(doc, model, "fm", "linear", 256, 256, 4, 300, chunk_end=tokens)
    assert cut[3]["maximum"] == cut[5] < tokens  # a token limit moves the end: sent
    over = handlers.preview_page(doc, model, "fm", "linear", 100_000, 256, 4, None, chunk_end=tokens)
    assert over[3] == {"value": tokens, "__type__": "update"}  # the value comes back; the end stays


def test_an_upload_shorter_than_the_chunk_brings_the_chunk_back_with_it(tmp_path, monkeypatch):
    """The chunk slider ends at a short upload's tokens (a longer chunk comes back to them) in the
    upload's own answer, with the document, so the preview that follows leaves the slider alone:
    its update once redrew the box while the user typed the next chunk."""
    import warnings

    from conftest import netherfield
    from memstep.models import default_model
    from ui import handlers

    folder = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))

    def uploaded():
        (folder / "upload").mkdir(parents=True, exist_ok=True)
        return netherfield(folder / "upload", 1500)

    path = uploaded()
    model = default_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source, *_, chunk, end, _, _, _ = handlers.choose_upload(str(path), handlers.default_document(), model, 512, None)
    tokens = handlers.preview_tokens(source, model, None)
    assert tokens < 512 and chunk == {"maximum": tokens, "value": tokens, "__type__": "update"} and end == tokens
    assert [str(w.message) for w in caught] == [
        f"Chunk size c: 512 is more than this document's tokens ({tokens:,}; allowed 16 to {tokens:,}); the box is "
        f"back at {tokens:,}."]
    assert handlers.preview_page(source, model, "fm", "linear", tokens, 256, 4, None, chunk_end=end)[3] == {
        "__type__": "update"}  # the preview that follows leaves the slider alone
    path = uploaded()  # uploaded again: a read upload is deleted (ui/uploads.py)
    *_, chunk, end, _, _, _ = handlers.choose_upload(str(path), handlers.default_document(), model, 256, None)
    assert chunk == {"maximum": tokens, "__type__": "update"}  # within the document: the user's chunk stays
    path = uploaded()
    *_, chunk, end, _, _, _ = handlers.choose_upload(str(path), handlers.default_document(), model, 512, "many")
    assert chunk == end == {"__type__": "update"}  # tokens not counted: the preview names the fault


def test_after_a_new_document_the_preview_leaves_the_chunk_box_alone():
    """Gradio reads the chunk slider for the preview that follows a new document as it was before
    the document's handler put it within the document, and a chunk put back from that old value
    landed over the one the user typed next. After a document or an example the preview still
    uses a chunk within the document, but leaves the box (and its note) to the document's handler;
    after the user's own chunk it puts it back, with its note."""
    import warnings

    import gradio as gr

    from memstep.models import default_model
    from ui import handlers

    doc, model = handlers.default_document(), default_model()
    tokens = handlers.preview_tokens(doc, model, None)

    def changed(target):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = handlers.controls_changed(None, doc, model, "fm", "linear", 100_000, 256, 4, None, None, "compact",
                                            None, False, "", None, tokens, event=gr.EventData(target, None))
        return out, [str(w.message) for w in caught]

    with gr.Blocks():
        document, example, chunk = gr.State(), gr.Dropdown(elem_id="example"), gr.Slider(elem_id="chunk")
    for target in (document, example):
        (figure, note, run, box, *_), notes = changed(target)
        assert box == {"__type__": "update"} and not notes and f"FM c{tokens} M256" in figure.layout.title.text
    for target in (chunk, None):
        (_, _, _, box, *_), notes = changed(target)
        assert box == {"value": tokens, "__type__": "update"} and len(notes) == 1 and "100,000" in notes[0]


def test_an_example_keeps_the_chunk_within_its_tokens():
    from memstep.models import default_model
    from ui import handlers
    from ui.documents import DEFAULT_EXAMPLE, EXAMPLE_SETTINGS

    model = default_model()
    assert "chunk" not in EXAMPLE_SETTINGS.get(DEFAULT_EXAMPLE, {})
    source, *_, chunk, memory, max_tokens, rope, end, _, _, _ = handlers.choose_example(DEFAULT_EXAMPLE, model, 100_000, None)
    tokens = handlers.preview_tokens(source, model, None)
    assert chunk == {"maximum": tokens, "value": tokens, "__type__": "update"} and end == tokens
    *_, chunk, memory, max_tokens, rope, end, _, _, _ = handlers.choose_example(DEFAULT_EXAMPLE, model, 256, None)
    assert chunk == {"maximum": tokens, "__type__": "update"}


def test_the_controls_views_come_from_one_listener(app_server):
    """Gradio re-sends a deferred change event to every listener of it when an 'always_last'
    listener finishes, so two such listeners on one control re-trigger each other for as long as
    they overlap (the page once previewed without end while nobody touched it). No trigger of the
    built app has two; the Run tab's preview, stale-views line and share link share one."""
    demo, _ = app_server
    config = demo.get_config_file()
    names = {c["id"]: c.get("props", {}).get("elem_id") or c["type"] for c in config["components"]}
    waiting: dict[tuple, set] = {}
    for dependency in config["dependencies"]:
        if dependency.get("trigger_mode") == "always_last":
            for target, event in dependency["targets"]:
                waiting.setdefault((target, event), set()).add(dependency["id"])
    assert {(names.get(target), target, event): ids for (target, event), ids in waiting.items() if len(ids) > 1} == {}
    follow = [d for d in config["dependencies"] if ["chunk" in names.get(o, "") for o in d["outputs"]].count(True)
              and any(names.get(o) == "share-link" for o in d["outputs"])]
    assert len(follow) == 1 and {names[o] for o in follow[0]["outputs"]} >= {
        "sizes-plot", "preview-note", "stale-note", "share-link", "chunk", "memory"}


def test_step_axes_thin_their_labels_at_many_steps():
    from ui.figures import seconds_figure, step_dtick

    assert [step_dtick(n) for n in (3, 16, 17, 40, 99, 153, 1000)] == [1, 1, 2, 5, 10, 20, 200]
    schedule = make_schedule("fm", 153 * 64, 64, 64)
    fig = seconds_figure(fake_records(schedule), schedule.steps)
    labelled = (fig.layout.xaxis.range[1] - fig.layout.xaxis.range[0]) / fig.layout.xaxis.dtick
    assert fig.layout.xaxis.dtick == 20 and labelled <= 8  # 153 steps: 20, 40, ... 140


def test_dark_mode_repaints_legend_markers_the_toolbar_and_the_text_view():
    from ui.theme import dark_css

    css = dark_css()
    assert ".legendpoints path[style*='fill: rgb(30, 58, 138)']" in css  # the navy kept-memory marker
    assert ".dark .memstep-paper {" in css and ".modebar-btn path" in css


def test_the_last_runs_views_say_when_the_controls_moved_on(fm):
    from ui import handlers
    from ui.runs import RunSettings
    from ui.views import RunView

    view = RunView(word_document(fm), RunSettings("fm", 256, 256), fm, records=fake_records(fm))
    same = ("fm", "linear", 256, 256, "chunk-attention", 4, "auto", False, "q?")
    assert handlers.stale_note(None, *same) == "" and handlers.stale_note(view, *same) == ""
    moved = handlers.stale_note(view, "fm", "linear", 512, 256, "chunk-attention", 4, "auto", False, "q?")
    assert "last run (FM c256 M256)" in moved and "Press **Run**" in moved
    # another RoPE choice: the views say so
    assert "Press **Run**" in handlers.stale_note(view, *same[:6], "shared", False, "q?")
    view.result = SimpleNamespace(question="Who?", rope="compact")
    assert "asked “Who?”" in handlers.stale_note(view, *same[:-1], "Who is it?")
    assert handlers.stale_note(view, *same[:-1], " Who? ") == ""


def test_the_size_sliders_leave_the_bounds_to_memstep():
    import gradio as gr

    from ui.fields import OpenSlider, settle

    with gr.Blocks():
        slider = OpenSlider(16, 1524, value=512, step=16)
    assert slider.get_block_name() == "slider"  # the page draws Gradio's own slider
    assert slider.preprocess(100_000) == 100_000 and slider.preprocess("x") == "x"  # no generic error
    assert settle(100_000, "Chunk size c", 16, 1524, "this document's tokens") == (
        1524, "Chunk size c: 100,000 is more than this document's tokens (1,524; allowed 16 to 1,524); the box is back "
              "at 1,524.")
    assert settle(8, "Chunk size c", 16, 1524)[0] == 16 and settle(512, "Chunk size c", 16, 1524) == (512, None)
    assert settle(float("nan"), "M", 0, 10)[1] is None and settle("ten", "M", 0, 10) == ("ten", None)  # for the check


def test_run_follows_the_settings_once_a_preparation_ends():
    """A refused upload brings Run back, and no preview follows (no control changed): Run must
    still wait while the memory is smaller than the sinks, and come back once it is fixed. While
    the page prepares or shows another document, Run is left as the page set it."""
    from memstep.models import default_model
    from ui import handlers

    doc, model = handlers.default_document(), default_model()
    example, key = getattr(doc, "example", None), doc.doc_id

    def ready(memory, pending="", shown=key, name=example):
        return handlers.run_ready(name, doc, pending, shown, model, "fm", "linear", 256, memory, 4, None)

    assert ready(0) == {"__type__": "update", "value": "Run", "interactive": False}
    assert ready(512) == {"__type__": "update", "value": "Run", "interactive": True}
    assert ready(512, pending="1") == {"__type__": "update"}  # a newer document is on its way
    assert ready(512, shown="another") == {"__type__": "update"}
    assert handlers.run_ready(example, None, "", key, model, "fm", "linear", 256, 512, 4, None) == {
        "__type__": "update"}
