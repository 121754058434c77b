"""Hostile requests against the served app (docs/hardening.md): server paths, huge numbers, wrong
types, unknown models, huge texts, private events started through the queue. Each request must be
answered (a result or one readable line, no server path in it), the server's CPU and memory must
stay bounded, and a normal request must work afterwards.

Starts the app in a subprocess on the embedded model (as a public app when --public: a Space's
SPACE_ID set), writes benchmarks/results/hostile_app[_public].json and prints a table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MB = 1e6


def start(port: int, public: bool):
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False")
    if public:
        env.update(SPACE_ID="someone/memstep", MEMSTEP_MODEL="embedded")
    code = ("from ui.layout import build_app, launch_options; from ui.models import get_model; get_model(None); "
            f"build_app().launch(server_name='127.0.0.1', server_port={port}, **launch_options())")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def requests(big: str) -> list[tuple[str, str, dict]]:
    """(label, api name, arguments)."""
    text = "It was a bright cold day in April, and the clocks were striking thirteen. " * 20
    p = "/prefill"
    return [
        ("model: /root", p, {"document_text": text, "model": "/root"}),
        ("model: /etc/passwd", p, {"document_text": text, "model": "/etc/passwd"}),
        ("model: /no/such/folder", p, {"document_text": text, "model": "/no/such/folder"}),
        ("model: compressed token, not ours", p, {"document_text": text, "model": "compressed:" + "a" * 24 + "/x"}),
        ("model: unknown hub id", p, {"document_text": text, "model": "someone/no-such-model-xyz"}),
        ("model: 3,000 characters", p, {"document_text": text, "model": "x" * 3000}),
        ("model: a number", p, {"document_text": text, "model": 123}),
        ("chunk 10^30", p, {"document_text": text, "chunk": 10**30}),
        ("memory -1", p, {"document_text": text, "memory": -1}),
        ("max_tokens 2^63", p, {"document_text": text, "max_tokens": 2**63}),
        ("sinks 1e308", p, {"document_text": text, "sinks": 1e308}),
        ("chunk '512' (a string)", p, {"document_text": text, "chunk": "512"}),
        ("full_reference 'x'", p, {"document_text": text, "full_reference": "x"}),
        ("question_aware [1]", p, {"document_text": text, "question_aware": [1]}),
        ("question: a dict", p, {"document_text": text, "question": {"a": 1}}),
        ("question: 1 MB", p, {"document_text": text, "question": "why " * 250_000}),
        ("document_text 14 MB, max_tokens 16", p, {"document_text": big[:14_000_000], "schedule": "full",
                                                   "max_tokens": 16}),
        ("document_text 21 MB", p, {"document_text": big, "max_tokens": 16}),
        ("example: unknown", p, {"example_name": "../../etc/passwd"}),
        ("schedule: 16,777,216 tokens x 1,024 layers", "/schedule",
         {"tokens": 16_777_216, "schedule": "im", "chunk": 1024, "memory": 1024, "growth": "double-inverse",
          "layers": 1024}),
        ("schedule: tokens 10^18", "/schedule", {"tokens": 10**18}),
        ("schedule: layers 10^9", "/schedule", {"tokens": 4096, "growth": "square-sqrt", "layers": 10**9}),
        ("schedule: tokens True", "/schedule", {"tokens": True}),
    ]


def main() -> None:
    from gradio_client import Client

    public = "--public" in sys.argv
    port = 7950 + os.getpid() % 40
    server = start(port, public)
    url = f"http://127.0.0.1:{port}/"
    rows = []
    try:
        client = None
        for _ in range(300):
            try:
                client = Client(url, verbose=False)
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.5)
        if client is None:
            raise RuntimeError("the app did not start")
        proc = psutil.Process(server.pid)
        client.predict(document_text="A warm-up document about the sea. " * 30, schedule="fm", chunk=64, memory=32,
                       api_name="/prefill")  # the first prefill's own allocations are not a request's cost
        rss_start = proc.memory_info().rss
        big = (ROOT / "assets" / "persuasion_excerpt.txt").read_text() * 80
        big = (big * (21_000_000 // len(big) + 1))[:21_000_000]
        home = str(Path.home())
        for label, api, kwargs in requests(big):
            cpu0, began = sum(proc.cpu_times()[:2]), time.perf_counter()
            try:
                out = client.predict(api_name=api, **kwargs)
                answer = f"ok: {out.get('event', '')} {out.get('tokens', out.get('steps', ''))}".strip()
            except Exception as err:  # noqa: BLE001 - the refusal as the client sees it
                answer = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            rows.append({"request": label, "answer": answer[:160], "seconds": time.perf_counter() - began,
                         "server_cpu_seconds": sum(proc.cpu_times()[:2]) - cpu0,
                         "server_rss_mb": proc.memory_info().rss / MB,
                         "leaks_a_path": leaks(answer, [v for v in kwargs.values() if isinstance(v, str)])})
            print(f"{label:<44} {rows[-1]['seconds']:>6.1f} s {rows[-1]['server_cpu_seconds']:>6.2f} CPU-s  "
                  f"{answer[:90]}", flush=True)
        rows.extend(private_events(url))
        after = client.predict(tokens=4096, api_name="/schedule")
        small = client.predict(document_text="A short document about the sea. " * 30, schedule="fm", chunk=64,
                               memory=32, api_name="/prefill")
        serving = after["steps"] == 8 and small["event"] == "result"
        summary = {"public": public, "still_serving": serving, "rss_start_mb": rss_start / MB,
                   "rss_end_mb": proc.memory_info().rss / MB, "requests": rows}
        name = "hostile_app_public.json" if public else "hostile_app.json"
        (ROOT / "benchmarks" / "results" / name).write_text(json.dumps(summary, indent=1))
        print(f"still serving: {serving}; server RSS {rss_start / MB:.0f} -> {summary['rss_end_mb']:.0f} MB; "
              f"a server path in an answer: {any(r['leaks_a_path'] for r in rows)}")
    finally:
        server.terminate()
        server.wait(30)


def leaks(answer: str, given: list[str]) -> bool:
    """A server path in an answer, besides the ones the request itself named."""
    for text in given:
        answer = answer.replace(text[:80], "")
    return str(Path.home()) in answer or str(ROOT) in answer


def private_events(url: str) -> list[dict]:
    """Raw queue calls, past any client: /prefill naming server files as its document (a client
    such as gradio_client would upload a local path instead), and the Compress tab's events,
    hidden from the API but started through the queue anyway, with absurd settings. Each must end
    with one line at once."""
    from ui import api
    from ui.layout import build_app
    from ui.tabs.compress import laco, sparse

    demo = build_app()
    index = {fn.fn: i for i, fn in demo.fns.items()}
    index[api.prefill] = next(i for i, fn in demo.fns.items() if fn.api_name == "prefill")

    def prefill_file(path):
        return ["", {"path": path, "meta": {"_type": "gradio.FileData"}}, "", "imdc", 512, 512, "linear",
                "chunk-attention", 4, "", 4096, "", False, "compact", "", False]

    rows = []
    for label, fn, data in (
            ("raw: file /etc/passwd", api.prefill, prefill_file("/etc/passwd")),
            ("raw: file ../../../../etc/passwd", api.prefill, prefill_file("../../../../etc/passwd")),
            ("raw: file ~/.cache/memstep (a folder)", api.prefill, prefill_file(str(Path.home() / ".cache/memstep"))),
            ("raw: file README.md of the app", api.prefill, prefill_file(str(ROOT / "README.md"))),
            ("queue: LaCo C=10^9, 10^6 sentences", laco.run_laco,
             ["embedded", 10**9, 1, 0, 1, 0.8, "paper", "dense", 10**6, 10**6, True, "chained"]),
            ("queue: LaCo model /etc", laco.run_laco, ["/etc", 2, 1, 0, 1, 0.8, "paper", "dense", 6, 128, False, "chained"]),
            ("queue: pruning 10^6 samples", sparse.prune,
             ["embedded", "wanda", "unstructured", 0.5, ["br"], "text", 10**6, 128, 20, 1e-3, "norms"]),
            ("queue: load a server path into Run", laco.load_into_run, ["/root"])):
        session = uuid.uuid4().hex[:11]
        began = time.perf_counter()
        with httpx.Client(timeout=60) as http:
            http.post(f"{url}gradio_api/queue/join", json={"data": data, "fn_index": index[fn],
                                                           "session_hash": session, "event_data": None})
            answer = ""
            with http.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}) as reply:
                for line in reply.iter_lines():
                    if line.startswith("data:"):
                        message = json.loads(line[5:])
                        if message.get("msg") == "process_completed":
                            output = message.get("output", {})
                            answer = (output.get("error") or "refused, no message (Gradio: not an upload)"
                                      if not message.get("success") else json.dumps(output.get("data"))[:160])
                            break
        rows.append({"request": label, "answer": str(answer)[:160], "seconds": time.perf_counter() - began,
                     "leaks_a_path": leaks(str(answer), [v for v in data if isinstance(v, str)])})
        print(f"{label:<44} {rows[-1]['seconds']:>6.1f} s             {str(answer)[:90]}", flush=True)
    return rows


if __name__ == "__main__":
    main()
