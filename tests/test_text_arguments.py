"""Text arguments that are not text (issue 61): bytes that are not UTF-8 and lone surrogates in any
text argument of any verb are one line and exit 2 before any model loads; file names keep the
system's bytes; the app's search box answers a lone surrogate without a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_outputs import call, no_model_loads, one_line_refusal  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent


def test_acceptance_a_question_that_is_not_utf8_is_one_line_before_the_model(tmp_path):
    """`memstep run doc.txt --question $'\\xff'` as a shell passes it: raw bytes, in a fresh process."""
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document about the vault.")
    done = subprocess.run([os.fsencode(sys.executable), b"-m", b"memstep", b"run", os.fsencode(doc), b"--question",
                           b"\xff"], capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    err = done.stderr.decode("utf-8", "replace")
    one_line_refusal(done.returncode, err, "--question", "not UTF-8", "0xff")


@pytest.mark.parametrize("argv, option", [
    (["run", "{doc}", "--question", "what is \udcff?"], "--question"),
    (["run", "{doc}", "--question", "a lone \ud800 surrogate"], "--question"),
    (["run", "{doc}", "--model", "emb\udce9dded"], "--model"),
    (["run", "{doc}", "--scorer", "\udcffx"], "--scorer"),
    (["eval", "--schedules", "full,\udcff", "--output", "{out}"], "--schedules"),
    (["compress", "sparse", "--method", "wanda\udcff", "--output", "{out}"], "--method"),
    (["plan", "--model", "llama\udcff"], "--model"),
])
def test_any_text_argument_is_refused_in_one_line_before_any_work(tmp_path, argv, option, no_model_loads):  # noqa: F811
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.")
    argv = [a.format(doc=doc, out=tmp_path / "out") for a in argv]
    code, out, err = call(argv)
    one_line_refusal(code, err, option)
    assert out == "" and not (tmp_path / "out").exists()


def test_a_file_name_keeps_the_systems_bytes(tmp_path):
    """A file name is the system's bytes, whatever their encoding (a Latin-1 name on a UTF-8 system):
    it is read, not refused."""
    name = os.fsdecode(b"caf\xe9.txt")  # 'caf\udce9.txt'
    (tmp_path / name).write_text("Some text.")
    from memstep.reading import read_document

    assert read_document(tmp_path / name) == "Some text."
    code, _, err = call(["run", tmp_path / "missing\udce9.txt", "--quiet"])
    one_line_refusal(code, err, "File not found")


def test_the_search_box_answers_a_lone_surrogate_without_a_traceback(monkeypatch):
    import gradio as gr

    from test_outcome import _view

    from ui import handlers

    warned = []
    monkeypatch.setattr(gr, "Warning", lambda message, **kwargs: warned.append(message))
    view = _view("It is w12.", "It is w301.")
    answer = handlers.search_text("w3\ud800", 0, view)
    assert answer == gr.skip() and len(warned) == 1 and "unpaired surrogate" in warned[0]
    shown = handlers.search_text("w30", 0, view)  # a real query still searches, and its page encodes
    assert "memstep-match-0" in shown
    json.dumps(shown).encode("utf-8")
