"""Explaining a run without a browser: where the full cache's answer sits in the document and
which step evicted it, search matches with their retention, the question-aware suggestion,
links that carry the settings, the run's files, and honest timing (CPU seconds, load)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from memstep.records import RunResult, StepRecord
from memstep.schedules import make_schedule

from ui import outcome, share, timing


def _record(step, start, size, kept_positions, total=3):
    kept = np.array(kept_positions, dtype=np.int64).reshape(1, 1, -1)
    return StepRecord(step=step, steps=total, chunk_start=start, chunk_size=size, memory_before=0, memory_budget=4,
                      memory_after=kept.shape[2], seconds=0.5, bytes_measured=None, bytes_modeled=1,
                      bytes_modeled_parts={"weights": 0}, kv_bytes_actual=0, kept_positions=kept, evicted=True)


def test_the_answers_number_is_found_in_the_document():
    text = "The vault is old. The magic number for the vault is 57071. More prose here."
    spans = outcome.answer_spans("The magic number for the vault is 57071.", "What is the magic number for the vault?",
                                 text)
    assert [text[s:e] for s, e in spans] == ["57071"]
    # no number: the longest run of the answer's words that holds a word the question lacks
    text = "Netherfield Park is let at last. Mr. Bingley has taken Netherfield Park. Bingley is rich."
    spans = outcome.answer_spans("Mr. Bingley has taken it.", "Who has taken Netherfield Park?", text)
    assert [text[s:e] for s, e in spans] == ["Mr. Bingley"]
    assert outcome.answer_spans("I do not know.", "Who?", text) == []  # nothing of substance
    # of runs as long, the rarest: the answer's name, not a word on every page
    text = "The Committee met. The Committee ruled. Ms. Okafor chairs the Committee. The Committee adjourned."
    spans = outcome.answer_spans("The Committee is chaired by Okafor.", "Who chairs it?", text)
    assert [text[s:e] for s, e in spans] == ["Okafor"]
    assert outcome.answer_spans("", "Who?", text) == []
    assert outcome.answers_differ("57", "57071") and not outcome.answers_differ("It is 5.", "it is 5")


def test_history_says_which_step_read_and_which_evicted_a_stretch():
    records = [_record(0, 0, 4, [0, 1, 2, 3]), _record(1, 4, 4, [0, 1, 4, 5]), _record(2, 8, 4, [0, 1, 8, 9])]
    assert outcome.history(records, 2, 4) == outcome.History(read=1, left=2, kept=0.0)
    assert outcome.history(records, 4, 6) == outcome.History(read=2, left=3, kept=0.0)
    assert outcome.history(records, 0, 2) == outcome.History(read=1, left=None, kept=1.0)
    assert outcome.history(records[:1], 8, 10).read is None  # not read yet
    assert "left the memory in step 2" in outcome.describe_history(outcome.history(records, 2, 4), 3)


def test_search_matches_and_token_ranges():
    text = "Elliot and  elliot\nELLIOT, Elliott"
    spans = outcome.search_spans("elliot", text)
    assert [text[s:e] for s, e in spans] == ["Elliot", "elliot", "ELLIOT", "Elliot"]
    assert outcome.search_spans("and elliot", text) == [(7, 18)]  # spaces match any whitespace
    assert outcome.search_spans("  ", text) == [] and outcome.search_spans("x" * 1000, text) == []
    assert outcome.token_range([(0, 6), (6, 10), (10, 18)], (7, 12)) == (1, 3)
    assert outcome.token_range([(0, 6)], (10, 12)) is None


def _view(compressed_answer, full_answer, question_aware=False):
    from test_figures import word_document

    from ui.runs import RunSettings
    from ui.views import RunView

    schedule = make_schedule("fm", 520, 256, 256)
    document = word_document(schedule)
    text = document.source.text
    source = type(document.source)("doc", text + "", "What is w300?", None, None)
    document = type(document)(source, document.ids, document.spans, document.prefix_tokens, None)
    records = [_record(i, i * 256, min(256, 520 - i * 256), [0, 1, 2, 3], schedule.steps) for i in range(schedule.steps)]
    result = RunResult(model="m", tokens=520, prefix_tokens=20, schedule={}, scorer="s", sinks=4, device="cpu",
                       dtype="float32", steps=records, answer=compressed_answer, question="What is w300?")
    full = RunResult(model="m", tokens=520, prefix_tokens=20, schedule={}, scorer="s", sinks=4, device="cpu",
                     dtype="float32", answer=full_answer, question="What is w300?")
    return RunView(document, RunSettings("fm", 256, 256, question_aware=question_aware), schedule, records=records,
                   result=result, full=full, wants_reference=True)


def test_the_answer_box_says_why_the_answers_differ_and_offers_question_aware():
    from ui.views import answer_markdown, render

    view = _view("It is w12.", "It is w301.")
    assert view.answer_chars and view.suggests_question_aware
    text = answer_markdown(view)
    assert "**Why the answers differ.**" in text and "“w301”" in text
    assert "read in step 2 of 3 and **left the memory in step 2**" in text
    assert "Try question-aware" in text
    shown = render(view, query="w30")
    assert 'data-mark="answer"' in shown.text and 'href="#memstep-answer-0"' in shown.text
    assert "matches</b> for “w30”" in shown.text and 'id="memstep-match-0"' in shown.text
    assert any(a.text == "answer" for a in shown.retained.layout.annotations)
    same = _view("It is w301.", "it is w301")
    assert not same.answer_chars and not same.suggests_question_aware and "Why the answers" not in answer_markdown(same)
    assert not _view("It is w12.", "It is w301.", question_aware=True).suggests_question_aware


def test_a_link_carries_the_settings_and_refuses_bad_values():
    query = share.settings_query("Passkey in Persuasion (1.5k tokens)", "fm", "linear", 256.0, 256, 4, 4096,
                                 "chunk-attention", "compact", False, "What is x?", "embedded",
                                 default_question="What is x?", default_model="embedded")
    assert query == ("?example=passkey-in-persuasion&schedule=fm&chunk=256&memory=256&sinks=4&max_tokens=4096"
                     "&scorer=chunk-attention&rope=compact")
    chosen, refused = share.parse_query({"example": "passkey-in-persuasion", "schedule": "FM", "chunk": "256",
                                         "memory": "256", "question_aware": "yes", "growth": "wiggly",
                                         "model": "/etc/passwd", "sinks": "1e9"}, ["embedded"])
    assert chosen == {"example": "Passkey in Persuasion (1.5k tokens)", "schedule": "fm", "chunk": 256,
                      "memory": 256, "question_aware": True}
    assert len(refused) == 3 and any("growth" in r for r in refused) and any("not offered" in r for r in refused)
    assert share.example_from("Passkey in Persuasion (1.5k tokens)") == "Passkey in Persuasion (1.5k tokens)"


def test_the_runs_files_are_its_json_and_a_step_table(tmp_path, monkeypatch):
    monkeypatch.setattr(share, "DOWNLOADS", tmp_path)
    records = [_record(0, 0, 4, [0, 1, 2, 3]), _record(1, 4, 4, [0, 1, 4, 5])]
    result = RunResult(model="m", tokens=8, prefix_tokens=0, schedule={"schedule": "fm"}, scorer="s", sinks=4,
                       device="cpu", dtype="float32", steps=records, answer="a", question="q")
    old = tmp_path / "run-old"
    old.mkdir()
    past = time.time() - 2 * share.KEEP_SECONDS
    import os
    os.utime(old, (past, past))
    json_path, csv_path = share.write_files(result, "FM c4 M4", [0.25, 0.5])
    assert json.loads(open(json_path).read()) == result.to_dict()
    lines = open(csv_path).read().splitlines()
    assert lines[0].startswith("step,chunk_start,chunk_size") and "bytes_modeled_weights" in lines[0]
    assert lines[2].split(",")[7] == "0.5" and len(lines) == 3
    assert not old.exists()  # an hour-old run's files are gone


def test_cpu_time_is_the_work_of_each_item_and_the_load_note(monkeypatch):
    clock = [10.0]  # a CPU clock that moves only where the stream works: no real time is read
    monkeypatch.setattr(timing.time, "process_time", lambda: clock[0])

    def stream():
        yield "schedule", None
        clock[0] += 0.25  # the work of producing the step
        yield "step", 1

    items = list(timing.timed(stream()))
    assert [(k, seconds) for k, _, seconds in items] == [("schedule", 0.0), ("step", 0.25)]
    assert timing.shared_note((5.2, 2)) == "shared machine: load 5.2 on 2 cores, so wall seconds follow the other jobs"
    assert timing.shared_note((1.5, 2)) is None
    assert timing.seconds_left(2.0, 100, 300) == pytest.approx(4.0) and timing.seconds_left(0, 0, 10) is None
    assert timing.about(4.2) == "about 4 s" and timing.about(600) == "about 10 min"


def test_the_planner_counts_more_flops_for_a_wider_step():
    from memstep.planner import MODEL_PRESETS

    config = MODEL_PRESETS["smollm2-135m"]
    fm = timing.modeled_flops(config, make_schedule("fm", 4096, 512, 512), 4)
    imdc = timing.modeled_flops(config, make_schedule("imdc", 4096, 512, 512), 4)
    full = timing.modeled_flops(config, make_schedule("full", 4096), 4)
    assert full > fm > imdc > 0  # IMDC's narrower steps attend over fewer entries
    assert timing.modeled_flops({"hidden_size": "x"}, make_schedule("fm", 64, 32, 32), 4) is None
