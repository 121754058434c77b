"""The reference switches in the app: the Run tab's "as the reference code" boxes and the
/prefill fields (through gradio_client on the embedded model, marked slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstep.errors import MemstepError
from memstep.presets import REFERENCE, SWITCHES, Fidelity

from ui.handlers import PADDED_WAY, WAY_CHOICES, WAY_DEFAULTS, choose_preset, reference_ways
from ui.runs import settings_from

TEXT = (Path(__file__).resolve().parent.parent / "assets" / "pride_and_prejudice_ch1-12.txt").read_text()[:2500]


def test_the_boxes_give_the_attention_and_the_switches():
    assert reference_ways(WAY_DEFAULTS) == ("sdpa", dict(Fidelity().__dict__))  # memstep's defaults
    assert reference_ways(WAY_CHOICES) == ("padded", dict(REFERENCE.__dict__))
    attention, switches = reference_ways([SWITCHES["gqa_grouping"].label])
    assert attention == "sdpa" and switches["gqa_grouping"] == "strided" and switches["sink_scoring"] == "pool"


def test_the_reference_preset_ticks_every_box():
    scorer, rope, sinks, ways = choose_preset("reference")
    assert (scorer, rope, sinks) == ("conv", "compact", 4) and set(ways) == set(WAY_CHOICES) and PADDED_WAY in ways


def test_the_preview_follows_the_rounding_box(monkeypatch):
    """The preview draws the schedule with the rounding the boxes ask for (as the run will)."""
    from memstep import schedules
    from ui import handlers
    from ui.documents import DocumentSource

    asked = []

    def spy(*args, **kwargs):
        asked.append(kwargs.get("rounding"))
        return schedules.make_schedule(*args, **kwargs)

    monkeypatch.setattr(handlers, "make_schedule", spy)
    doc = DocumentSource(name="text", text=TEXT)
    rounding = SWITCHES["growth_rounding"].label
    handlers.preview(doc, "", "im", "sqrt", 64, 256, 4, 600, ways=WAY_DEFAULTS)
    handlers.preview(doc, "", "im", "sqrt", 64, 256, 4, 600, ways=[w for w in WAY_DEFAULTS if w != rounding])
    assert asked == ["divide-first", "multiply-first"]


def test_settings_take_the_switches_and_refuse_bad_values():
    settings = settings_from("imdc", 256, 128, "linear", "conv", 4, "compact", False, "padded",
                             {"gqa_grouping": "Strided", "ntk": ""})
    assert settings.fidelity == Fidelity(gqa_grouping="strided") and settings.attention == "padded"
    assert settings.label().endswith("· as the reference")
    with pytest.raises(MemstepError, match="score rows must be one of chunk, last-c"):
        settings_from("imdc", 256, 128, "linear", "conv", 4, fidelity={"score_rows": "first-c"})
    with pytest.raises(MemstepError, match="ntk must be one of"):
        settings_from("imdc", 256, 128, "linear", "conv", 4, fidelity={"ntk": 3})
    with pytest.raises(MemstepError, match="attention must be one of sdpa, padded"):
        settings_from("imdc", 256, 128, "linear", "conv", 4, attention="flash")


@pytest.fixture(scope="module")
def client(served_app):
    from gradio_client import Client

    return Client(served_app, verbose=False)  # the session's app (tests/conftest.py)


@pytest.mark.slow
def test_prefill_as_the_reference_code(client):
    from gradio_client.exceptions import AppError

    result = client.predict(document_text=TEXT, schedule="imdc", chunk=256, memory=128, preset="reference",
                            question="Who has taken Netherfield Park?", api_name="/prefill")
    assert result["fidelity"] == dict(REFERENCE.__dict__) and result["attention"] == "padded"
    assert result["scorer"] == "conv" and result["prompt_question_tokens"] > 0 and result["answer"]
    one = client.predict(document_text=TEXT, schedule="imdc", chunk=256, memory=128, gqa_grouping="strided",
                         api_name="/prefill")
    assert one["fidelity"] == dict(Fidelity(gqa_grouping="strided").__dict__) and one["attention"] == "sdpa"
    with pytest.raises(AppError, match="cannot run IMDC with the layer-wise growth"):
        client.predict(document_text=TEXT, schedule="imdc", growth="square-sqrt", preset="reference",
                       api_name="/prefill")
    with pytest.raises(AppError, match="question place must be one of after, prompt"):
        client.predict(document_text=TEXT, question_place="before", api_name="/prefill")
