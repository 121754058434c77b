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
def client(served_app):
    from gradio_client import Client

    return Client(served_app, verbose=False)  # the session's app (tests/conftest.py)


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
    assert result["question_aware"] is True and (result["question_weight"], result["question_pool"]) == (1.0, "max:15")
    assert all(s["question_tokens"] > 0 for s in result["steps"])
    assert result["steps"][-1]["memory_after"] == 128 + 4  # the question's entries never stay
    with pytest.raises(AppError, match="attention-based scorer"):
        client.predict(document_text=NETHERFIELD, schedule="fm", chunk=256, memory=128, max_tokens=600,
                       question="Who?", question_aware=True, scorer="recency", api_name="/prefill")


# ---- issue 12: a public API nobody can abuse --------------------------------------------------
def _raw_call(url: str, endpoint: str, data: list) -> str:
    """POST a call as a client other than gradio_client would (no "meta" on files); returns
    the event stream's text."""
    import httpx

    with httpx.Client(timeout=120) as http:
        event = http.post(f"{url}gradio_api/call/{endpoint}", json={"data": data}).json()["event_id"]
        return http.get(f"{url}gradio_api/call/{endpoint}/{event}").text


@pytest.fixture(scope="module")
def app_url(client):
    return client.src if client.src.endswith("/") else client.src + "/"


def test_server_files_never_come_back(app_url, client):
    readme = str(ASSETS.parent / "README.md")
    answers = []
    for path in ("README.md", readme, "/etc/hostname", "/no/such/file.txt"):
        data = ["", {"path": path}, "", "full", 512, 512, "linear", "chunk-attention", 4, "", 4096, "", False,
                "compact", "", False] + [""] * 7  # the reference switches: empty = memstep's default
        answers.append(_raw_call(app_url, "prefill", data))
    assert all("uploaded through the page" in a for a in answers), answers
    assert not any("sdk_version" in a or "Hugging Face Spaces" in a for a in answers)  # README never read
    assert len({a.split("event: error")[-1] for a in answers}) == 1  # one message, existing or not
    assert client.predict(tokens=1000, api_name="/schedule")["steps"] == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(chunk="abc"), "chunk size must be a whole number"),
    (dict(sinks="four"), "sinks must be a whole number"),
    (dict(model=123), "model must be a text"),
    (dict(model="x" * 3000), "model name is not valid"),
    (dict(chunk=1), "over the limit of 256"),  # would hold the only run slot for minutes
])
def test_wrong_types_are_one_readable_line_as_the_readme_shows(client, kwargs, message):
    from gradio_client.exceptions import AppError

    job = client.submit(document_text="A short note. " * 200, api_name="/prefill", **kwargs)
    updates = list(job)  # as the README says: nothing streams for a refused run...
    assert updates == []
    with pytest.raises(AppError, match=message) as err:  # ...and the result raises the reason
        job.result()
    assert "\n" not in str(err.value) and "x" * 200 not in str(err.value)


def test_schedule_endpoint_refuses_over_cap_and_bad_tokens(client):
    from gradio_client.exceptions import AppError

    for kwargs, message in ((dict(tokens=10**7, chunk=1), "over the limit"), (dict(tokens=0), "from 1"),
                            (dict(tokens=-1), "from 1"), (dict(tokens=1.5), "whole number")):
        with pytest.raises(AppError, match=message):
            client.predict(api_name="/schedule", **kwargs)
