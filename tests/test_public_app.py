"""Compression in a public app (a Space, or MEMSTEP_ALLOWED_MODELS): off unless switched on; when
on, per-session folders, models that load only for their session (through a token, never a
server path), a disk quota with oldest-first cleanup of what memstep made, and one press for
long runs, with the estimate beside the button. And "Load into Run" works in a public app's model box."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from test_models import deep_lm_folder, tiny_lm_folder  # noqa: F401  (fixtures)

from memstep.compress.guard import CHECK_WINDOWS
from memstep.errors import MemstepError
from memstep.outputs import MARKER, PARTIAL_MARKER
from ui import compressed, estimates
from ui import models as app_models
from ui.tabs.compress import laco, sparse

MIB = 2**20


def request(session: str):
    return SimpleNamespace(session_hash=session)


@pytest.fixture
def store(tmp_path, monkeypatch):
    root = tmp_path / "compressed"
    monkeypatch.setenv("MEMSTEP_COMPRESSED", str(root))
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("MEMSTEP_ALLOWED_MODELS", raising=False)
    monkeypatch.delenv("MEMSTEP_SPACE_COMPRESS", raising=False)
    return root


def public(monkeypatch, compress: bool = True):
    monkeypatch.setenv("SPACE_ID", "someone/memstep")
    if compress:
        monkeypatch.setenv("MEMSTEP_SPACE_COMPRESS", "1")


def made(folder: Path, created: float, size: int = MIB, marker: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * size)
    if marker:
        (folder / MARKER).write_text(json.dumps({"made_by": "memstep", "created": created}))
    return folder


def partial(folder: Path, created: float) -> Path:
    """A temporary folder memstep's save makes (its marker dated ``created``)."""
    made(folder, 0, marker=False)
    (folder / PARTIAL_MARKER).write_text(json.dumps({"made_by": "memstep", "partial": True, "created": created}))
    return folder


def test_compression_is_off_in_a_public_app_unless_switched_on(store, monkeypatch):
    assert compressed.compress_enabled()  # locally: on
    public(monkeypatch, compress=False)
    assert not compressed.compress_enabled()
    with pytest.raises(gr.Error, match="Compression is off"):
        next(laco.run_laco("embedded", 2, 1, 0, 1, 0.8, "paper", "dense", 2, 16, False, request=request("a")))
    with pytest.raises(gr.Error, match="Compression is off"):
        next(sparse.prune("embedded", "wanda", "unstructured", 0.5, ["none"], "text", 2, 16, 1, 1e-3, request=request("a")))
    monkeypatch.setenv("MEMSTEP_SPACE_COMPRESS", "1")
    assert compressed.compress_enabled()
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.delenv("MEMSTEP_SPACE_COMPRESS")
    monkeypatch.setenv("MEMSTEP_ALLOWED_MODELS", "my/model")  # a self-hosted public app: the same rule
    assert not compressed.compress_enabled()


def test_each_session_has_its_own_folder_and_tokens_load_for_it_only(store, monkeypatch):
    public(monkeypatch)
    a, b = compressed.store_folder("session-a"), compressed.store_folder("session-b")
    assert a != b and a.parent == b.parent == store / "sessions"
    assert compressed.session_id("session-a") not in ("session-a", "") and len(a.name) == 24
    with pytest.raises(MemstepError, match="needs a browser session"):
        compressed.store_folder("")
    folder = made(a / "laco-model", time.time())
    token = compressed.token(folder, "session-a")
    assert token == f"compressed:{a.name}/laco-model" and str(store) not in token
    assert compressed.resolve(token, "session-a") == str(folder)
    assert app_models.normalize_spec(token, "session-a") == str(folder)
    refusals = set()
    for spec, session in ((token, "session-b"), (token, ""), (f"compressed:{a.name}/missing", "session-a"),
                          ("compressed:../../etc/passwd", "session-a"), (f"compressed:{a.name}/../x", "session-a")):
        with pytest.raises(MemstepError) as err:
            app_models.normalize_spec(spec, session)
        refusals.add(str(err.value))
    assert len(refusals) == 1  # another session's model and a missing one read the same
    for spec in (str(folder), str(a), str(store)):  # a server path is never a model in a public app
        with pytest.raises(MemstepError, match="not offered here"):
            app_models.normalize_spec(spec, "session-a")
    with pytest.raises(MemstepError, match="not available"):
        app_models.get_model(token)  # a load without a session: refused too


def test_locally_the_store_is_one_folder_and_the_box_holds_the_path(store):
    folder = compressed.store_folder(None)
    assert folder == store and compressed.token(folder / "m", None) == str(folder / "m")


def test_the_quota_removes_the_oldest_models_memstep_made_and_nothing_else(store, monkeypatch):
    now = time.time()
    old = made(store / "old", now - 300)
    middle = made(store / "middle", now - 200)
    newest = made(store / "sessions" / ("0" * 24) / "newest", now - 100)
    theirs = made(store / "theirs", now - 999, marker=False)  # not memstep's: never touched
    partial_old = partial(store / ".x.abc.memstep-partial", now - 7 * 3600)  # left by a killed run
    partial_new = partial(store / ".y.abc.memstep-partial", now)  # a run writing now
    unmarked = made(store / ".z.abc.memstep-partial", 0, marker=False)  # named like one, not memstep's
    os.utime(unmarked, (now - 9 * 3600, now - 9 * 3600))  # its file time is old: it is still kept
    removed = compressed.make_room(2 * MIB, quota_bytes=4 * MIB + 65536)  # the small files count too
    assert removed == [partial_old.name, old.name] and not old.exists() and not partial_old.exists()
    assert middle.exists() and newest.exists() and theirs.exists() and partial_new.exists() and unmarked.exists()
    with pytest.raises(MemstepError, match="over the app's"):
        compressed.make_room(5 * MIB, quota_bytes=4 * MIB)
    assert middle.exists()  # a refusal removes nothing


def test_a_reservation_replaces_only_memsteps_own_model_of_that_name(store):
    mine = made(store / "sparse-br", time.time())
    with compressed.Reservation(None, "sparse-br", MIB) as reservation:
        assert reservation.path == mine and not mine.exists()  # memstep's earlier model of that name
        with compressed.Reservation(None, "sparse-br", MIB) as second:
            assert second.path.name == "sparse-br-2"  # in use by the first run: another name
    theirs = made(store / "sparse-lr", time.time(), marker=False)
    with compressed.Reservation(None, "sparse-lr", MIB) as reservation:
        assert reservation.path.name == "sparse-lr-2" and theirs.exists()
    with pytest.raises(MemstepError, match="not a folder name"):
        compressed.Reservation(None, "../escape", MIB)


def test_one_press_runs_with_the_estimate_beside_the_button(store, monkeypatch, deep_lm_folder):  # noqa: F811
    """The estimate is shown before the press (recomputed from the settings); one press starts
    the run, with no second press to confirm it."""
    args = (str(deep_lm_folder), 2, 0, 0, 1, 0.01, "paper", "dense", 2, 16, False, "chained", True)  # keep it
    note = laco.estimate_note(str(deep_lm_folder), 2, 0, 0, 0.01, 2, 16, False, request=request("s"))
    assert note.startswith("estimated **") and note.endswith("on this machine")
    assert "cannot run: C must be at least 2" in laco.estimate_note(str(deep_lm_folder), 1, 0, 0, 0.01, 2, 16, False,
                                                                     request=request("s"))
    first = list(laco.run_laco(*args, request=request("s")))
    assert "estimated" in first[0][0] and first[-1][0].count("done") and first[-1][6] and Path(first[-1][6]).is_dir()


def test_the_estimate_counts_the_work(monkeypatch):
    """More candidates, tokens or steps: more seconds, in proportion to the planner's FLOP counts."""
    from memstep.memory import ModelShape

    shape = ModelShape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152,
                       params=134_515_008)
    monkeypatch.setattr(estimates, "matmul_flops_per_second", lambda: 1e10)
    base = dict(sentences=6, tokens=128, C=2, L=1, H=30, evaluate=False, probe=laco.APP_PROBE, repeats=2)
    small = estimates.laco_work(shape, **base)[0]
    assert estimates.laco_work(shape, **{**base, "L": 15})[0] < small < estimates.laco_work(
        shape, **{**base, "tokens": 256})[0]
    assert estimates.laco_work(shape, **{**base, "evaluate": True})[0] > 3 * small  # four models measured
    # by hand: 2 layers of hidden 4, one head of 4, MLP 8: 160 weights per layer; 2 tokens make
    # 2 x 2 x 160 projection FLOPs and 4 x 4 x 3 attention FLOPs (3 query-key pairs) per layer
    tiny = ModelShape(layers=2, hidden=4, heads=1, kv_heads=1, head_dim=4, intermediate=8, vocab=10, params=0)
    per_layer = 2 * 2 * 160 + 4 * 4 * 3
    one = dict(sentences=1, tokens=2, C=2, L=0, H=2, evaluate=False, probe=laco.APP_PROBE, repeats=1)
    assert estimates.laco_work(tiny, **one) == (2 * per_layer + 2 * per_layer, 0)  # dense inputs + 1 candidate
    # the check without the measurements: dense, LaCo and block influence on its 256-token windows
    check = estimates.laco_work(tiny, **one, check=True)[0] - estimates.laco_work(tiny, **one)[0]
    assert check == 3 * CHECK_WINDOWS * estimates._forward(tiny, 256, 2, lm_head=True) > 0
    s = dict(method="wanda", technique="br+gp", calibration="text", samples=16, seq_len=128, held_out=8, steps=20,
             batch=4)
    assert estimates.sparse_work(shape, **s)[0] > estimates.sparse_work(shape, **{**s, "technique": "none"})[0]
    # the model writes 20 texts of 512 tokens in two batches of 16 and 4: 2 x 511 decode steps
    assert estimates.sparse_work(shape, **{**s, "calibration": "self", "generated_texts": 20})[1] == 2 * 511
    assert estimates.sparse_work(shape, **s)[1] == 0
    assert estimates.seconds(1e10 * estimates.EFFICIENCY, 0, shape, 0) == pytest.approx(1.0)


@pytest.mark.slow
def test_load_into_run_in_a_public_app_then_run_with_the_token(tmp_path, monkeypatch, deep_lm_folder):  # noqa: F811
    """Through the served app's queue, as the page does: a session collapses the tiny model, loads it
    into Run (the public app's model box now offers it, for this session) and runs it; another
    session cannot; no message carries a server path."""
    from test_cancel import QueueClient, _event

    from ui import handlers
    from ui.browser import serve
    from ui.layout import build_app

    root = tmp_path / "compressed"
    monkeypatch.setenv("MEMSTEP_COMPRESSED", str(root))
    monkeypatch.setenv("MEMSTEP_ALLOWED_MODELS", str(deep_lm_folder))
    monkeypatch.setenv("MEMSTEP_SPACE_COMPRESS", "1")
    demo = build_app()
    with serve(demo) as url:
        owner = QueueClient(url)
        owner.join(_event(demo, laco.run_laco), [str(deep_lm_folder), 2, 0, 0, 1, 0.01, "paper", "dense", 2, 16,
                                                   False, "chained", True])  # kept whatever the check finds
        done = owner.wait_for(lambda m: m.get("msg") == "process_completed", 120)
        assert done["success"], done
        owner.messages.clear()
        owner.join(_event(demo, laco.load_into_run), [None])  # the folder is the session's state
        loaded = owner.wait_for(lambda m: m.get("msg") == "process_completed", 60)
        box = loaded["output"]["data"][0]
        token = box["value"]
        assert token in [value for _, value in box["choices"]] and str(root) not in json.dumps(box)
        owner.messages.clear()
        run_data = [None, token, "fm", "linear", 64, 32, "chunk-attention", 4, 200, "", False, "compact", False,
                    handlers.WAY_DEFAULTS, "", None, "", None]  # the search box's word, then the page's example,
        # pending mark and shown document id (None: a raw client names no page state, ui/identity.py)
        owner.join(_event(demo, handlers.run_document), run_data)
        done = owner.wait_for(lambda m: m.get("msg") == "process_completed", 120)
        assert done["success"], done  # the box took the token, and the run loaded it
        stranger = QueueClient(url)
        stranger.join(_event(demo, handlers.run_document), run_data)
        refused = stranger.wait_for(lambda m: m.get("msg") == "process_completed", 60)
        assert not refused["success"] and "not in the list of choices" in json.dumps(refused["output"])
        everything = json.dumps(owner.messages + stranger.messages)
        assert str(root) not in everything and str(tmp_path) not in everything
    from ui import api

    with pytest.raises(gr.Error, match="not available"):  # through the API, another session gets nothing either
        next(api.prefill(document_text="Some text. " * 20, model=token, request=request("stranger")))


def test_in_a_public_app_one_visitor_never_evicts_anothers_models(store, monkeypatch):
    public(monkeypatch)
    monkeypatch.setattr(compressed, "VISITOR_QUOTA_BYTES", 2 * MIB + 65536)
    a, b = compressed.store_folder("session-a"), compressed.store_folder("session-b")
    now = time.time()
    a_old, a_new = made(a / "old", now - 300), made(a / "new", now - 200)
    b_model = made(b / "model", now - 400)  # older than both of a's
    # a's third model: a's own oldest goes (its quota), never b's older one
    assert compressed.make_room(MIB, quota_bytes=8 * MIB, session="session-a") == ["old"]
    assert not a_old.exists() and a_new.exists() and b_model.exists()
    # the app's whole quota taken by a: b is refused, a's models stay
    with pytest.raises(MemstepError, match="taken by other visitors' models"):
        compressed.make_room(MIB, quota_bytes=2 * MIB + 65536, session="session-b")
    assert a_new.exists() and b_model.exists()
    # past their time to live, another session's models may go
    monkeypatch.setattr(compressed, "MODEL_TTL_SECONDS", 150)
    assert compressed.make_room(MIB, quota_bytes=2 * MIB + 65536, session="session-b") == ["new"]
    assert b_model.exists()
    with pytest.raises(MemstepError, match="per visitor"):
        compressed.make_room(3 * MIB, quota_bytes=8 * MIB, session="session-a")


def test_the_run_tabs_document_state_expires(monkeypatch):
    from ui.documents import DOCUMENT_STATE_SECONDS
    from ui.tabs import run

    with gr.Blocks():
        tab = run.build_tab()
    assert tab.doc_state.time_to_live == DOCUMENT_STATE_SECONDS <= 24 * 3600
