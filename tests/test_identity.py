"""What a run is of, without a browser: the document id a run carries and shows, the model named
on the run card and in the answer (a compressed one by its name, never its server path), the
passkey card measuring what a search for the passkey measures, an empty question said at once
(refused for a question-aware run), a run stopped before its first step, the one-cut Compare
configuration, and the colours the map draws for a few slots and at the colour bar's end."""

from __future__ import annotations

import json
import re

import gradio as gr
import numpy as np
import pytest

from memstep.records import RunResult
from memstep.schedules import make_schedule

from ui.documents import DocumentSource


def _view(source: DocumentSource, records_kept, **kwargs):
    """A RunView of ``source`` prepared with the embedded tokenizer, FM c256 M128, with one-layer
    records keeping ``records_kept(step, seen)`` positions."""
    from test_truths import _records

    from ui.models import embedded_tokenizer
    from ui.runs import RunSettings, prepare
    from ui.views import RunView

    settings = RunSettings("fm", 256, 128)
    document = prepare(source, embedded_tokenizer(), None, 8192, settings)
    schedule = make_schedule("fm", document.tokens, 256, 128)
    view = RunView(document, settings, schedule, **kwargs)
    view.records = _records(schedule, 4, 128, **records_kept(view))
    return view


def test_the_document_id_follows_the_text_and_the_run_shows_it():
    a, b = DocumentSource("a.txt", "Some text."), DocumentSource("a.txt", "Some text!")
    assert re.fullmatch(r"[0-9a-f]{8}", a.doc_id) and a.doc_id == DocumentSource("a.txt", "Some text.").doc_id
    assert a.doc_id != b.doc_id and a.doc_id != DocumentSource("b.txt", "Some text.").doc_id
    from ui.views import stats_html

    view = _view(DocumentSource("notes.txt", "The harbour is quiet at dawn. " * 60), lambda v: {})
    assert f"notes.txt · #{view.document.source.doc_id}" in stats_html(view)


def test_a_compressed_model_is_named_on_the_card_and_in_the_answer(tmp_path, monkeypatch):
    from memstep.outputs import MARKER
    from ui import compressed, identity
    from ui.views import answer_markdown, stats_html

    folder = tmp_path / "laco-2"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"made_by": "memstep"}))
    assert identity.model_name(str(folder)) == "compressed model ‘laco-2’" and identity.is_compressed(str(folder))
    token = f"{compressed.TOKEN_PREFIX}{'0' * 24}/laco-2"
    assert identity.model_name(token) == "compressed model ‘laco-2’" and "/" not in identity.model_name(token)[17:]
    assert identity.model_name("embedded") == "SmolLM2-135M-Instruct" and not identity.is_compressed("embedded")
    assert identity.model_name("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
    view = _view(DocumentSource("notes.txt", "The harbour is quiet at dawn. " * 60), lambda v: {},
                 question="Who?", model_name=identity.model_name(str(folder)),
                 model_words="the compressed model ‘laco-2’ (96M parameters)", named_model=True)
    view.result = RunResult(model="m", tokens=1, prefix_tokens=0, schedule={}, scorer="s", sinks=4, device="cpu",
                            dtype="float32", answer="xx yy", question="Who?")
    assert "compressed model ‘laco-2’" in stats_html(view) and str(tmp_path) not in stats_html(view)
    assert "(FM c256 M128 · compressed model ‘laco-2’)" in answer_markdown(view)


def test_the_passkey_card_measures_what_a_search_for_the_passkey_finds():
    """The card said 58% of slots hold the passkey where a search said 38% after the same step: the
    card measured the whole needle sentence, the search the digits. Both measure the digits now."""
    from ui.documents import with_needle
    from ui.views import search_summary, stats_html

    text = "Prose goes on here. " * 30 + "The magic number for the vault is 57071. " + "More prose after it. " * 30
    source = with_needle("p.txt", text)

    def kept(view):  # keep the sentence up to the passkey's second token: the sentence and the digits differ
        return {"keep": (view.needle[0], view.passkey_positions[0] + 2)}

    view = _view(source, kept)
    digits = view.passkey_positions
    assert digits is not None and view.needle[0] <= digits[0] < digits[1] <= view.needle[1] and digits != view.needle
    card = re.search(r'data-stat="passkey">.*?value">(\d+)% of slots', stats_html(view)).group(1)
    found = re.search(r"still in memory \(kept by (\d+)% of the layer-head slots\)",
                      search_summary(view, "57071", [(text.index("57071"), text.index("57071") + 5)], view.records))
    assert found and card == found.group(1) and card != "100" and card != "0"


def test_an_empty_question_is_said_at_once_and_refused_for_question_aware():
    from ui import handlers
    from ui.explain import NO_QUESTION

    doc = DocumentSource("notes.txt", "Some text. " * 40)
    run = handlers.run_document(doc, "no/such-model", "fm", "linear", 64, 32, "chunk-attention", 4, None, "   ",
                                False, question_aware=True)
    with pytest.raises(gr.Error, match="Question-aware scoring needs a question"):
        next(run)  # before any model is looked up (this one does not exist)
    first = next(handlers.run_document(doc, "no/such-model", "fm", "linear", 64, 32, "chunk-attention", 4, None, "",
                                       False))
    assert first[6] == NO_QUESTION and "starting" in first[0] and f"#{doc.doc_id}" in first[0]


def test_a_run_stopped_before_its_first_step_says_so_and_draws_nothing(monkeypatch):
    from ui import handlers
    from ui.views import stats_html

    view = _view(DocumentSource("notes.txt", "The harbour is quiet at dawn. " * 60), lambda v: {})
    view.records, view.stopped = [], True
    assert f"stopped before step 1 of {view.steps} ended: nothing was read into memory" in stats_html(view)
    outputs = handlers._run_outputs(view)
    assert outputs[9].visible is False and outputs[15].visible is False  # no empty charts
    assert "fills in as the steps run" not in json.dumps(str(outputs))


def test_one_cut_is_fm_over_the_whole_document_with_its_own_label():
    from ui import comparison

    settings = comparison.configuration_settings(4, comparison.ONCE, "linear", 512, 256, "chunk-attention", 4,
                                                 "auto", True)
    assert settings.schedule == "fm" and settings.question_aware
    import dataclasses

    whole = dataclasses.replace(settings, chunk=1524)
    assert comparison.label_of(comparison.ONCE, whole) == "one cut M256 · shared positions · question-aware"
    assert make_schedule("fm", 1524, whole.chunk, whole.memory).steps == 1
    with pytest.raises(Exception, match="configuration 2: memory size must be"):
        comparison.configuration_settings(2, "fm", "linear", 512, -5, "chunk-attention", 4, "auto", False)
    check = comparison.memory_guard(3)
    with pytest.warns(UserWarning, match=r"Configuration 3, memory: 99,999 is more than .*allowed 0 to 8,192"):
        assert check(99_999) == {"__type__": "update", "value": 8192}
    assert check(512) == gr.skip()


def test_the_kept_strips_share_one_axis_and_mark_the_true_answer():
    from test_figures import fake_records

    from ui.figures import compare_kept_figure

    runs = [(name, fake_records(make_schedule(kind, 1524, chunk, 512)), "note")
            for name, kind, chunk in (("FM", "fm", 512), ("IMDC", "imdc", 512), ("one cut", "fm", 1524))]
    fig = compare_kept_figure(runs, 1524, answer=(1050, 1053))
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    assert len(heatmaps) == 3 and len({tuple(np.asarray(h.x)) for h in heatmaps}) == 1  # one token axis
    assert all(np.asarray(h.z).shape == (1, len(h.x)) for h in heatmaps)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 3 and {s.x0 for s in lines} == {1051.0}  # the answer dotted through every strip
    assert any("true answer" in (t.name or "") for t in fig.data)
    assert fig.layout.coloraxis.colorbar.outlinewidth >= 1
    # the colour bar runs from "one" slot to all: orange (kept by none) is named in the legend
    from ui import legend

    evicted = [t for t in fig.data if t.name == legend.LEGEND_NAMES["evicted"]]
    assert len(evicted) == 1 and evicted[0].marker.color == legend.EVICTED_MAP


def test_a_token_kept_by_a_few_slots_is_pale_and_the_colour_bar_is_outlined():
    """At M = 128 of 2,270 tokens most tokens are kept by a slot or two: the scale keeps those pale
    (a mid blue there read as "nearly everything kept"); the bar's navy end has an outline, so it
    does not melt into a dark card."""
    from test_figures import fake_records

    from ui import figures, legend
    from ui.highlight import _hex, _luminance

    def colour_at(fraction):
        scale = [(p, _hex(c)) for p, c in legend.KEPT_SCALE]
        for (p0, c0), (p1, c1) in zip(scale, scale[1:]):
            if p0 <= fraction <= p1:
                t = (fraction - p0) / (p1 - p0)
                return tuple(a + t * (b - a) for a, b in zip(c0, c1))

    assert _luminance(colour_at(1 / 90)) > 0.7 and _luminance(colour_at(1.0)) < 0.05
    schedule = make_schedule("fm", 2048, 512, 512)
    fig = figures.retained_map_figure(fake_records(schedule), 2048, schedule.steps)
    assert fig.data[0].colorbar.outlinewidth >= 1
