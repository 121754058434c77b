"""What both kinds of worker share: the JSON-lines protocol and resident-memory readings.

A local worker is a fresh process per configuration and length, so its peak resident memory
(VmHWM) is that configuration's peak; the resident size right after loading the model
(and one tiny warm-up forward) is reported alongside as the baseline. A served worker
(``--serve``, under Ray) keeps its model across jobs read from stdin and starts a new peak
before each cell. Imports nothing heavy: the kvpress peer imports this module from its own
virtualenv.
"""

from __future__ import annotations

import json
import sys


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def resident_bytes() -> int | None:
    """Resident memory now (VmRSS), None where /proc is missing."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_resident_bytes() -> int | None:
    """Peak resident memory of this process so far (VmHWM; ru_maxrss where /proc is missing)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib * 1024


def emit(event: str, **fields) -> None:
    """One protocol line on stdout (anything else a library prints is ignored by the reader)."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def parse_line(line: str) -> dict | None:
    """A protocol event from one line of worker output, or None for any other output."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and "event" in data else None


def load_job(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def reset_peak_resident() -> None:
    """Start a new peak (VmHWM back to the resident size now): a served worker runs many cells, each
    reports its own peak. Linux (/proc/self/clear_refs); elsewhere the peak stays the process's."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def warm_up(lm, job: dict, began: float) -> dict:
    """One tiny forward (so the first cell's seconds are not start-up costs), then the ready event's
    fields: the baseline resident size, the load time and the transformers version."""
    import time

    import torch

    with torch.inference_mode():
        lm.model(torch.tensor([job["cases"][0]["case"]["head_ids"][:8] or [0]], device=lm.model.device))
    return {"baseline_rss_bytes": resident_bytes(), "load_seconds": time.perf_counter() - began,
            "transformers": __import__("transformers").__version__}


def serve_items(lm, job: dict, run_case, fresh_peaks: bool = False) -> None:
    """One protocol line per case of ``job``: its cell, or its error (the others go on).
    ``fresh_peaks``: each cell's peaks are its own (a served worker), not the process's so far."""
    import torch

    on_cuda = lm.device.startswith("cuda")
    for item in job["cases"]:
        if fresh_peaks:
            reset_peak_resident()
            if on_cuda:
                torch.cuda.reset_peak_memory_stats()
        try:
            out = run_case(item["case"], item.get("reference"))
        except Exception as err:  # report and go on: one bad cell must not lose the others
            emit("error", key=item["key"], message=f"{type(err).__name__}: {err}")
            continue
        emit("cell", key=item["key"], peak_rss_bytes=peak_resident_bytes(),
             peak_device_bytes=torch.cuda.max_memory_allocated() if on_cuda else None, **out)


def serve_cases(lm, job: dict, run_case, began: float) -> int:
    """The worker loop both sides share: one warm-up forward, the baseline, then one protocol
    line per case. ``run_case(case, reference)`` returns the cell's fields (``reference``: where
    the full cache's continuation log-probabilities are read or written, see ``divergence``); an
    error in one case is reported and the others go on."""
    emit("ready", **warm_up(lm, job, began))
    serve_items(lm, job, run_case)
    return 0


def model_identity(job: dict) -> tuple:
    """What a served worker's loaded model depends on (a job naming another reloads it)."""
    return job.get("model"), job.get("device", "cpu"), job.get("dtype", "float32"), job.get("threads", 2)


SERVED_BY = "MEMSTEP_SERVED_BY"  # the pid of the process that started a served worker


def _exit_with_parent() -> None:
    """A served worker ends when the process that started it does (a Ray worker killed at shutdown,
    even mid-cell, or while this one was still importing): nothing is left running."""
    import os
    import threading
    import time

    parent = int(os.environ.get(SERVED_BY) or os.getppid())

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def serve_jobs(load, prepare, identity=model_identity) -> int:
    """``--serve``: jobs as JSON lines on stdin (each as a job file holds it), answered as a job
    file is, then a "done" line; the model is loaded once and kept while the jobs' ``identity``
    stays (``load(job)`` -> the model, ``prepare(lm, job)`` -> run_case). Ends at the end of
    stdin or with its parent. Each cell's peaks are its own."""
    import gc
    import time

    import torch

    _exit_with_parent()
    held, lm, ready = None, None, None
    for line in sys.stdin:
        job = json.loads(line)
        if identity(job) != held:
            lm = held = None
            gc.collect()
            began = time.perf_counter()
            torch.set_num_threads(job.get("threads", 2))
            lm = load(job)
            ready, held = warm_up(lm, job, began), identity(job)
        emit("ready", **ready)
        serve_items(lm, job, prepare(lm, job), fresh_peaks=True)
        emit("done")
    return 0
