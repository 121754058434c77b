"""What both kinds of worker share: the JSON-lines protocol and resident-memory readings.

A worker is a fresh process per configuration and length, so its peak resident memory
(VmHWM) is that configuration's peak; the resident size right after loading the model
(and one tiny warm-up forward) is reported alongside as the baseline. Imports nothing
heavy: the kvpress peer imports this module from its own virtualenv.
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


def serve_cases(lm, job: dict, run_case, began: float) -> int:
    """The worker loop both sides share: one warm-up forward (so the first cell's seconds
    are not start-up costs), the baseline, then one protocol line per case.
    ``run_case(case, reference)`` returns the cell's fields (``reference``: where the full
    cache's continuation log-probabilities are read or written, see ``divergence``); an error
    in one case is reported and the others go on."""
    import time

    import torch

    with torch.inference_mode():
        lm.model(torch.tensor([job["cases"][0]["case"]["head_ids"][:8] or [0]], device=lm.model.device))
    emit("ready", baseline_rss_bytes=resident_bytes(), load_seconds=time.perf_counter() - began,
         transformers=__import__("transformers").__version__)
    on_cuda = lm.device.startswith("cuda")
    for item in job["cases"]:
        try:
            out = run_case(item["case"], item.get("reference"))
        except Exception as err:  # report and go on: one bad cell must not lose the others
            emit("error", key=item["key"], message=f"{type(err).__name__}: {err}")
            continue
        emit("cell", key=item["key"], peak_rss_bytes=peak_resident_bytes(),
             peak_device_bytes=torch.cuda.max_memory_allocated() if on_cuda else None, **out)
    return 0
