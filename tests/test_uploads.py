"""One visitor cannot fill the public app (issue 61): a visitor is its address as Gradio sees it, not
the session hash the client makes up; its uploads are read one at a time, and another visitor's
upload reads beside them; an upload is deleted once read, uploads never read go with their state's
time to live, and the bytes one address uploads are bounded; the compressed models' quota is
shared per address."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from memstep.errors import MemstepError
from memstep import reading
from ui import documents, uploads
from ui.visitors import visitor_key

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


def as_client(host: str):
    """What Gradio sets for the event a thread serves: its request, with the client's address."""
    from gradio.context import LocalContext

    LocalContext.request.set(SimpleNamespace(client=SimpleNamespace(host=host), session_hash=f"made-up-{host}"))


@pytest.fixture(autouse=True)
def no_request_left():
    """Each test's simulated request ends with it (the context is this thread's)."""
    yield
    from gradio.context import LocalContext

    LocalContext.request.set(None)


def test_a_visitor_is_its_address_not_its_session():
    one = visitor_key(SimpleNamespace(client=SimpleNamespace(host="10.0.0.1"), session_hash="a"))
    assert one == visitor_key(SimpleNamespace(client=SimpleNamespace(host="10.0.0.1"), session_hash="b"))
    assert one != visitor_key(SimpleNamespace(client=SimpleNamespace(host="10.0.0.2"), session_hash="a"))
    assert "10.0.0.1" not in one and visitor_key(SimpleNamespace(client=None)) == ""


def test_behind_a_trusted_proxy_the_visitor_is_the_address_it_appended(monkeypatch):
    """On a Space every connection comes from its proxy: the address is the entry the proxy appended to
    X-Forwarded-For; what the client wrote there itself (to its left) is never read."""
    from starlette.datastructures import Headers

    from ui.visitors import client_address

    def behind(forwarded: str | None):
        headers = Headers(headers={"x-forwarded-for": forwarded} if forwarded is not None else {})
        return SimpleNamespace(client=SimpleNamespace(host="10.16.3.80"), headers=headers)

    monkeypatch.delenv("MEMSTEP_TRUSTED_PROXY_HOPS", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert client_address(behind("203.0.113.9")) == "10.16.3.80"  # locally: the peer, headers ignored
    monkeypatch.setenv("SPACE_ID", "someone/memstep")
    assert client_address(behind("203.0.113.9")) == "203.0.113.9"
    spoofed = [client_address(behind(f"198.51.100.{i}, 203.0.113.9")) for i in range(4)]
    assert spoofed == ["203.0.113.9"] * 4  # made-up entries on the left: one visitor still
    assert client_address(behind(None)) == "10.16.3.80"
    monkeypatch.setenv("MEMSTEP_TRUSTED_PROXY_HOPS", "2")  # a load balancer in front of the proxy
    assert client_address(behind("198.51.100.7, 203.0.113.9, 10.0.0.5")) == "203.0.113.9"


# ---- reads --------------------------------------------------------------------------------------------

@pytest.fixture
def gated_reads(monkeypatch, tmp_path):
    """read_isolated replaced by a read that waits for its gate; the names read so far."""
    gates, inside = {}, []

    def slow_read(data, name, **limits):
        inside.append(name)
        gates.setdefault(name, threading.Event()).wait(20)
        return "Some text."

    monkeypatch.setattr(reading, "read_isolated", slow_read)
    paths = {}
    for name in ("a1.txt", "a2.txt", "b1.txt"):
        paths[name] = tmp_path / name
        paths[name].write_text("x")
        gates[name] = threading.Event()
    return gates, inside, paths


def until(condition, what: str, seconds: float = 30) -> None:
    """Wait for ``condition`` (a state, not a time: the bound only keeps a broken build from hanging)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_one_visitors_reads_run_one_at_a_time_and_never_hold_another_visitor(gated_reads):
    gates, inside, paths = gated_reads
    outcomes = {}

    def upload(host, name):
        as_client(host)
        try:
            outcomes[name] = documents.read_upload(paths[name]).text
        except MemstepError as err:
            outcomes[name] = str(err)

    threads = [threading.Thread(target=upload, args=("10.0.0.1", "a1.txt"))]
    threads[0].start()
    until(lambda: inside == ["a1.txt"], "the first read began")
    threads.append(threading.Thread(target=upload, args=("10.0.0.1", "a2.txt")))  # the same address, another session
    threads[-1].start()
    threads.append(threading.Thread(target=upload, args=("10.0.0.2", "b1.txt")))
    threads[-1].start()
    until(lambda: "b1.txt" in inside, "the other visitor read while the first one's read ran")
    assert inside == ["a1.txt", "b1.txt"]  # the first visitor's second upload waits for its first
    gates["b1.txt"].set()
    gates["a1.txt"].set()
    until(lambda: "a2.txt" in inside, "the first visitor's second read began")
    gates["a2.txt"].set()
    for thread in threads:
        thread.join(20)
    assert outcomes == {"a1.txt": "Some text.", "a2.txt": "Some text.", "b1.txt": "Some text."}
    assert uploads.visitors_reading() == 0  # nothing kept per visitor once its reads end


def test_a_visitors_second_read_is_refused_after_a_wait(gated_reads, monkeypatch):
    gates, inside, paths = gated_reads
    monkeypatch.setattr(uploads, "UPLOAD_WAIT_SECONDS", 0.3)
    first = threading.Thread(target=lambda: (as_client("10.0.0.1"), documents.read_upload(paths["a1.txt"])))
    first.start()
    until(lambda: inside == ["a1.txt"], "the first read began")
    as_client("10.0.0.1")
    with pytest.raises(MemstepError, match="previous upload is still being read"):
        documents.read_upload(paths["a2.txt"])
    assert inside == ["a1.txt"]
    gates["a1.txt"].set()
    gates["a2.txt"].set()
    first.join(20)
    assert documents.read_upload(paths["a2.txt"]) is not None and uploads.visitors_reading() == 0


# ---- files --------------------------------------------------------------------------------------------

def test_an_upload_is_deleted_once_read_or_refused_and_nothing_else_is(tmp_path, monkeypatch):
    folder = tmp_path / "gradio"
    monkeypatch.setattr(documents, "upload_folders", lambda: [folder.resolve(), documents.ASSETS.resolve()])
    read = folder / "0123abcd" / "doc.txt"
    read.parent.mkdir(parents=True)
    read.write_text("Some text to read.")
    assert documents.read_upload(read).text == "Some text to read."
    assert not read.exists() and not read.parent.exists() and folder.exists()
    refused = folder / "4567" / "scan.pdf"
    refused.parent.mkdir(parents=True)
    refused.write_bytes(b"%PDF-1.4 nothing")
    with pytest.raises(MemstepError):
        documents.read_upload(refused)
    assert not refused.exists()
    mine = tmp_path / "mine.txt"  # a file outside the upload folder (a bundled example, say): kept
    mine.write_text("Mine.")
    assert documents.read_upload(mine).text == "Mine." and mine.exists()


def upload_app(scope_client: str, inner=None):
    """The middleware around an app that stores nothing (what Gradio's upload route would store)."""
    async def stored(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=uploads.UploadBudget(inner or stored),
                                                         client=(scope_client, 50000)), base_url="http://app")


def run_async(make):
    """Run the coroutine ``make()`` returns in a thread of its own (its own event loop: a test worker's
    thread may hold a running one, from a browser test before this one)."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", asyncio.run(make())))
    thread.start()
    thread.join(120)
    return result["value"]


def test_each_address_uploads_at_most_its_share(monkeypatch):
    monkeypatch.setattr(uploads, "UPLOAD_VISITOR_BYTES", 3 * MIB)
    uploads.LEDGER.clear()

    async def scenario():
        async with upload_app("10.0.0.1") as one, upload_app("10.0.0.2") as two:
            sent = [(await one.post("/gradio_api/upload", content=b"x" * MIB)).status_code for _ in range(4)]
            other = (await two.post("/gradio_api/upload", content=b"x" * MIB)).status_code
            page = (await one.post("/gradio_api/queue/join", content=b"x" * MIB)).status_code  # not an upload
            refused = await one.post("/gradio_api/upload", content=b"x")
            return sent, other, page, refused

    sent, other, page, refused = run_async(scenario)
    assert sent == [200, 200, 200, 429] and other == 200 and page == 200
    assert refused.status_code == 429 and "one visitor may upload" in refused.text
    key = visitor_key(SimpleNamespace(client=SimpleNamespace(host="10.0.0.1")))
    assert uploads.LEDGER.used(key) == 3 * MIB
    uploads.LEDGER.give_back(key, MIB)  # one of its uploads was read: deleted, its bytes back
    assert run_async(lambda: _post_one("10.0.0.1")) == 200
    uploads.LEDGER.clear()

    async def too_big(scope, receive, send):  # what Gradio answers a file over its size limit
        await send({"type": "http.response.start", "status": 413, "headers": []})
        await send({"type": "http.response.body", "body": b"exceeds the maximum file size"})

    async def refused_uploads():
        async with upload_app("10.0.0.3", too_big) as client:
            return [(await client.post("/gradio_api/upload", content=b"x" * MIB)).status_code for _ in range(5)]

    assert run_async(refused_uploads) == [413] * 5  # never 429: nothing was stored, nothing counted
    uploads.LEDGER.clear()


async def _post_one(host: str) -> int:
    async with upload_app(host) as client:
        return (await client.post("/gradio_api/upload", content=b"x" * MIB)).status_code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_twenty_uploads_leave_no_file_once_their_state_expired(tmp_path):
    """The served app with a 2-second document state: twenty uploads in a row (never read, as a
    script sends them) are accepted, one more past the address's share is refused, and once their
    state's time is over the upload folder holds none of them; the app still serves."""
    port, cache = _free_port(), tmp_path / "gradio"
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRADIO_TEMP_DIR=str(cache), MEMSTEP_DOCUMENT_STATE_SECONDS="2",
               MEMSTEP_UPLOAD_VISITOR_MB="4", GRADIO_ANALYTICS_ENABLED="False")
    code = ("from ui.layout import build_app, launch_options; "
            f"build_app().launch(server_name='127.0.0.1', server_port={port}, **launch_options())")
    server = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=30) as http:
            for _ in range(600):
                try:
                    if http.get(url + "/").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert server.poll() is None, "the app did not start"
                time.sleep(0.2)
            stored = []
            for i in range(20):
                reply = http.post(url + "/gradio_api/upload", files={"files": (f"doc{i}.txt", b"x" * 100_000)})
                assert reply.status_code == 200, reply.text
                stored += reply.json()
            assert len(stored) == 20 and all(Path(p).resolve().is_relative_to(cache.resolve()) for p in stored)
            over = http.post(url + "/gradio_api/upload", files={"files": ("big.txt", b"x" * (3 * MIB))})
            assert over.status_code == 429
            for _ in range(600):  # Gradio's sweep: every second, the files older than the state's 2 s
                if not any(Path(p).exists() for p in stored):
                    break
                time.sleep(0.1)
            assert not any(Path(p).exists() for p in stored)
            assert not [p for p in cache.rglob("doc*.txt")] and http.get(url + "/").status_code == 200
    finally:
        server.terminate()
        server.wait(30)


# ---- the compressed models' quota ---------------------------------------------------------------------

def test_made_up_sessions_from_one_address_share_its_quota(tmp_path, monkeypatch):
    """Four made-up sessions from one address cannot hold more than that address's share of the app's
    quota (the issue: four sessions of 1,000 MB filled the 4 GB and refused everyone for 24 h)."""
    from test_public_app import made, public

    from ui import compressed

    monkeypatch.setenv("MEMSTEP_COMPRESSED", str(tmp_path / "compressed"))
    monkeypatch.delenv("MEMSTEP_ALLOWED_MODELS", raising=False)
    public(monkeypatch)
    monkeypatch.setattr(compressed, "VISITOR_QUOTA_BYTES", 2 * MIB + 65536)
    as_client("10.0.0.1")
    now = time.time()
    folders = []
    for i in range(4):  # each new session's model evicts the address's older ones: never more than its share
        compressed.make_room(MIB, quota_bytes=8 * MIB, session=f"made-up-{i}")
        folders.append(made(compressed.store_folder(f"made-up-{i}") / "model", now + i))
        held = sum(f.stat().st_size for p in folders if p.exists() for f in p.rglob("*") if f.is_file())
        assert held <= 2 * MIB + 65536 + MIB
    assert [p.exists() for p in folders] == [False, False, True, True]
    as_client("10.0.0.2")  # another visitor still finds room, and evicts nothing of the first one's
    assert compressed.make_room(MIB, quota_bytes=8 * MIB, session="visitor-two") == []
    assert json.loads((compressed.store_folder("made-up-3") / compressed.VISITOR_FILE).read_text())["visitor"] == \
        visitor_key(SimpleNamespace(client=SimpleNamespace(host="10.0.0.1")))
