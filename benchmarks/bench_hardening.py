"""Costs of hostile requests to the app, measured in one process (docs/hardening.md):

- a pasted document_text of 14 MB run with max_tokens 16 through /prefill's function
  (CPU seconds of the whole process and RSS growth, after the model is loaded);
- the same text through the served app over HTTP (the server's CPU and RSS, measured on the
  server process from outside);
- three 20 MB uploads read at the same time (the upload handler's concurrency limit);
- /schedule at the work bound and the request the issue reported (refused at once).

Writes benchmarks/results/bench_hardening.json and prints a table. OMP_NUM_THREADS=1 recommended.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "bench_hardening.json"
MB = 1e6


def text_of(size: int) -> str:
    paragraph = (ROOT / "assets" / "persuasion_excerpt.txt").read_text(encoding="utf-8")
    return (paragraph * (size // len(paragraph) + 1))[:size]


def measure(fn) -> dict:
    process = psutil.Process()
    rss_before = process.memory_info().rss
    cpu_before = time.process_time()
    wall_before = time.perf_counter()
    peak = [rss_before]
    done = threading.Event()

    def watch():
        while not done.wait(0.02):
            peak[0] = max(peak[0], process.memory_info().rss)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out = fn()
    finally:
        done.set()
        watcher.join()
    rss_after = process.memory_info().rss
    return {"cpu_seconds": time.process_time() - cpu_before, "wall_seconds": time.perf_counter() - wall_before,
            "rss_growth_mb": (rss_after - rss_before) / MB, "rss_peak_growth_mb": (peak[0] - rss_before) / MB,
            "out": out}


def pasted_text_in_process(text: str) -> dict:
    from ui import api
    from ui.models import get_model

    get_model(None)  # the model is loaded before: what one request costs on top of a serving app
    list(api.prefill(document_text="warm up " * 20, schedule="full", max_tokens=16))
    row = measure(lambda: list(api.prefill(document_text=text, schedule="full", max_tokens=16))[-1]["tokens"])
    return row


def pasted_text_over_http(text: str) -> dict:
    """The served app in a subprocess; its CPU and RSS measured from here."""
    import subprocess

    from gradio_client import Client

    port = 7900 + os.getpid() % 50
    server = subprocess.Popen(
        [sys.executable, "-c", "from ui.layout import build_app, launch_options; from ui.models import get_model; "
                               f"get_model(None); build_app().launch(server_name='127.0.0.1', server_port={port}, "
                               "**launch_options())"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = None
        for _ in range(240):
            try:
                client = Client(f"http://127.0.0.1:{port}/", verbose=False)
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.5)
        if client is None:
            raise RuntimeError("the app did not start")
        client.predict(document_text="warm up " * 20, schedule="full", max_tokens=16, api_name="/prefill")
        proc = psutil.Process(server.pid)
        time.sleep(1)
        cpu0, rss0 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
        began = time.perf_counter()
        tokens = client.predict(document_text=text, schedule="full", max_tokens=16, api_name="/prefill")["tokens"]
        wall = time.perf_counter() - began
        time.sleep(1)
        cpu1, rss1 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
        big = {"cpu_seconds": cpu1 - cpu0, "wall_seconds": wall, "rss_growth_mb": (rss1 - rss0) / MB, "out": tokens}
        refused = text_of(21_000_000)
        cpu0, rss0 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
        try:
            client.predict(document_text=refused, schedule="full", max_tokens=16, api_name="/prefill")
            message = "accepted"
        except Exception as err:  # noqa: BLE001 - the refusal
            message = str(err).splitlines()[0][:120]
        time.sleep(1)
        cpu1, rss1 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
        over = {"cpu_seconds": cpu1 - cpu0, "rss_growth_mb": (rss1 - rss0) / MB, "out": message}
        return {"14MB document_text": big, "21MB document_text": over, "3 x 20MB files": parallel_files(client, proc)}
    finally:
        server.terminate()
        server.wait(30)


def parallel_files(client, proc, count: int = 3, size: int = 20_000_000) -> dict:
    """Three 20 MB files sent at once to /prefill (uploaded, then read on the server)."""
    from gradio_client import handle_file

    with uploads(count, size) as paths:
        return _send_files(client, proc, paths, handle_file)


def _send_files(client, proc, paths, handle_file) -> dict:
    time.sleep(1)
    cpu0, rss0 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
    jobs = [client.submit(document_file=handle_file(str(p)), schedule="full", max_tokens=16, api_name="/prefill")
            for p in paths]
    outcomes = []
    for job in jobs:
        try:
            outcomes.append(job.result(timeout=300)["tokens"])
        except Exception as err:  # noqa: BLE001
            outcomes.append(str(err)[:60])
    time.sleep(1)
    cpu1, rss1 = sum(proc.cpu_times()[:2]), proc.memory_info().rss
    return {"cpu_seconds": cpu1 - cpu0, "rss_growth_mb": (rss1 - rss0) / MB, "out": outcomes}


@contextmanager
def uploads(count: int, size: int):
    """``count`` text files of ``size`` bytes in a temporary folder (removed afterwards)."""
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / f"upload{i}.txt" for i in range(count)]
        for path in paths:
            path.write_text(text_of(size - 1000))
        yield paths


def parallel_uploads(count: int = 3, size: int = 20_000_000) -> dict:
    from ui import documents

    with uploads(count, size) as paths:
        return _read_at_once(paths, documents)


def _read_at_once(paths, documents) -> dict:
    outcomes = []

    def read(path):
        began = time.perf_counter()
        try:
            documents.read_upload(path)
            outcomes.append(("read", time.perf_counter() - began))
        except Exception as err:  # noqa: BLE001
            outcomes.append((str(err)[:60], time.perf_counter() - began))

    def run_all():
        threads = [threading.Thread(target=read, args=(p,)) for p in paths]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return outcomes

    return measure(run_all)


def schedule_bound() -> dict:
    from ui import api

    rows = {}
    for label, kwargs in (("issue: 16,777,216 tokens, chunk 1024, 1,024 layers",
                           dict(tokens=16_777_216, schedule="im", chunk=1024, memory=1024, growth="double-inverse",
                                layers=1024)),
                          ("at the bound: 8,192 steps x 32 layers",
                           dict(tokens=8192 * 64, schedule="im", chunk=64, memory=1024, growth="double-inverse",
                                layers=32)),
                          ("16,384 steps, linear growth",
                           dict(tokens=16384 * 64, schedule="imdc", chunk=64, memory=1024, growth="linear"))):
        def call():
            try:
                out = api.schedule(**kwargs)
                return f"{len(json.dumps(out)) / MB:.1f} MB reply"
            except Exception as err:  # noqa: BLE001 - gr.Error
                return "refused: " + str(err)[:60]
        rows[label] = measure(call)
    return rows


def main() -> None:
    text = text_of(14_000_000)
    results = {"threads": os.environ.get("OMP_NUM_THREADS", "(default)"),
               "pasted_14MB_in_process": pasted_text_in_process(text),
               "parallel_uploads_3x20MB": parallel_uploads(),
               "schedule": schedule_bound()}
    if "--http" in sys.argv:
        results["pasted_over_http"] = pasted_text_over_http(text)
    results["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1, default=str))
    print(f"{'case':<58} {'CPU s':>7} {'RSS +MB':>8}  outcome")

    def show(label, row):
        print(f"{label:<58} {row['cpu_seconds']:>7.2f} {row['rss_growth_mb']:>8.1f}  {row['out']}")

    show("14 MB document_text, max_tokens 16 (in process)", results["pasted_14MB_in_process"])
    show("3 x 20 MB uploads read at once", results["parallel_uploads_3x20MB"])
    for label, row in results["schedule"].items():
        show("/schedule " + label, row)
    for label, row in results.get("pasted_over_http", {}).items():
        show(f"{label} over HTTP (server process)", row)


if __name__ == "__main__":
    main()
