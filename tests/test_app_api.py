"""The app's named API endpoints through gradio_client, on the embedded model: a streamed
run, a passkey document uploaded as a file, the schedule math, and bad input (each one a
readable error, after which the app still serves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstep.schedules import make_schedule

pytestmark = pytest.mark.slow

ASSETS = Path(__file__).resolve().parent.parent / "assets"
NETHERFIELD = (ASSETS / "pride_and_prejudice_ch1-12.txt").read_text()[:2500].rsplit("\n", 1)[0]


@pytest.fixture(scope="module")
def client():
    from gradio_client import Client

    from ui.browser import serve
    from ui.layout import build_app

    with serve(build_app()) as url:
        yield Client(url, verbose=False)


def test_prefill_streams_each_step_then_the_whole_run(client):
    job = client.submit(document_text=NETHERFIELD, schedule="imdc", chunk=256, memory=128,
                        question="Who has taken Netherfield Park?", api_name="/prefill")
    result = job.result(timeout=600)
    updates = job.outputs()
    steps = [u for u in updates if u["event"] == "step"]
    assert result["event"] == "result" and updates[-1] == result
    expected = make_schedule("imdc", result["tokens"], 256, 128)
    assert [s["chunk_size"] for s in steps] == list(expected.chunk_sizes)
    assert [s["step"] for s in steps] == list(range(expected.steps))
    assert result["schedule"]["chunk_sizes"] == list(expected.chunk_sizes)
    assert result["steps"][-1]["memory_after"] == 128 + 4
    assert len(result["kept_fraction"]) == result["tokens"]
    assert isinstance(result["answer"], str) and result["answer"]
    assert result["passkey"] is None and result["peak_bytes_measured"] is None  # CPU: no counter


def test_prefill_a_passkey_file_reports_whether_the_passkey_survived(client, tmp_path):
    from memstep.passkey import make_haystack
    from ui.models import embedded_tokenizer

    doc = make_haystack(NETHERFIELD, embedded_tokenizer(), 500, 0.5, 48213, thing="orchard")
    path = tmp_path / "haystack.md"
    path.write_text(doc.text)
    from gradio_client import handle_file

    result = client.predict(document_file=handle_file(str(path)), schedule="fm", chunk=128, memory=256,
                            api_name="/prefill")
    assert result["document"] == "haystack.md"
    assert result["question"] == "What is the magic number for the orchard?"  # found in the upload
    assert result["passkey"] == "48213"
    assert 0.0 <= result["passkey_kept"] <= 1.0
    assert result["passkey_answered"] == ("48213" in result["answer"])


def test_schedule_endpoint_is_the_schedule_math(client):
    out = client.predict(tokens=4096, schedule="imdc", chunk=512, memory=512, growth="sqrt", api_name="/schedule")
    expected = make_schedule("imdc", 4096, 512, 512, "sqrt")
    assert out["chunk_sizes"] == list(expected.chunk_sizes)
    assert out["memory_sizes"] == list(expected.memory_sizes)
    assert out["memory_after"] == [a for _, a in expected.cache_lengths(4)]
    assert out["peak_memory_plus_chunk"] == max(b + c for (b, _), c in zip(expected.cache_lengths(4),
                                                                            expected.chunk_sizes))


@pytest.mark.parametrize("case, message", [
    ("wrong type", "Unsupported file type"),
    ("empty", "contains no text"),
    ("binary", "binary file"),
    ("memory below sinks", "smaller than the 4 sink tokens"),
    ("chunk above document", "larger than the document"),
    ("unloadable model", "cannot load model"),
    ("no document", "give exactly one document"),
])
def test_bad_input_is_a_readable_error_and_the_app_keeps_serving(client, tmp_path, case, message):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    files = {"wrong type": ("table.csv", b"a,b\n1,2\n"), "empty": ("empty.txt", b""),
             "binary": ("blob.txt", bytes(range(256)) * 8)}
    kwargs = {"document_text": "A short document. " * 20, "schedule": "imdc", "chunk": 64, "memory": 64}
    if case in files:
        name, data = files[case]
        (tmp_path / name).write_bytes(data)
        kwargs = {**kwargs, "document_text": "", "document_file": handle_file(str(tmp_path / name))}
    elif case == "memory below sinks":
        kwargs["memory"] = 2
    elif case == "chunk above document":
        kwargs["chunk"] = 5000
    elif case == "unloadable model":
        kwargs["model"] = str(tmp_path)  # a folder with no model in it
    elif case == "no document":
        kwargs["document_text"] = ""
    with pytest.raises(AppError, match=message):
        client.predict(**kwargs, api_name="/prefill")
    assert client.predict(tokens=1000, api_name="/schedule")["steps"] == 2  # still serving


def test_an_oversized_upload_is_refused_with_the_limit(client, tmp_path):
    from gradio_client import handle_file

    from ui.documents import MAX_UPLOAD_BYTES

    path = tmp_path / "huge.txt"
    with path.open("wb") as f:
        f.truncate(MAX_UPLOAD_BYTES + 1)  # sparse: no 20 MB written to disk
    with pytest.raises(Exception, match="exceeds the maximum file size"):
        client.predict(document_file=handle_file(str(path)), api_name="/prefill")
    assert client.predict(tokens=1000, api_name="/schedule")["steps"] == 2


def test_prefill_rope_and_reference_preset(client):
    result = client.predict(document_text=NETHERFIELD, schedule="fm", chunk=256, memory=128, preset="reference",
                            max_tokens=600, api_name="/prefill")
    assert (result["scorer"], result["rope"], result["sinks"]) == ("conv", "compact", 4)
    assert [s["first_position"] for s in result["steps"]] == [s["memory_before"] for s in result["steps"]]
    result = client.predict(document_text=NETHERFIELD, schedule="im", growth="double-inverse", chunk=256,
                            memory=128, rope="document", max_tokens=600, api_name="/prefill")
    assert result["rope"] == "document" and result["scorer"] == "chunk-attention"
    assert [s["first_position"] for s in result["steps"]] == [s["chunk_start"] for s in result["steps"]]
    middle = result["steps"][1]  # 15 layers inverse-convex, 15 inverse-concave
    assert len(middle["layer_memory_after"]) == 30 and len(set(middle["layer_memory_after"])) == 2
    plan = client.predict(tokens=1000, schedule="imdc", chunk=200, memory=300, growth="double-inverse", layers=3,
                          api_name="/schedule")
    assert plan["layer_memory_sizes"][1] == [75, 210, 210]


def test_prefill_question_aware(client):
    from gradio_client.exceptions import AppError

    result = client.predict(document_text=NETHERFIELD, schedule="imdc", chunk=256, memory=128, max_tokens=600,
                            question="Who has taken Netherfield Park?", question_aware=True, api_name="/prefill")
    assert result["question_aware"] is True and result["question_weight"] == 0.75
    assert all(s["question_tokens"] > 0 for s in result["steps"])
    assert result["steps"][-1]["memory_after"] == 128 + 4  # the question's entries never stay
    with pytest.raises(AppError, match="attention-based scorer"):
        client.predict(document_text=NETHERFIELD, schedule="fm", chunk=256, memory=128, max_tokens=600,
                       question="Who?", question_aware=True, scorer="recency", api_name="/prefill")
