"""Run the grid: one fresh worker process per (configuration, length), cells appended to
the store as they finish, finished cells never run again.

memstep configurations run in ``memstep.evaluation.worker`` with this python; kvpress
presses run in ``peers/kvpress_peer.py`` with the kvpress virtualenv's python; the plain
Hugging Face full cache runs in the same peer script with this python (no press). All
workers measure the same way, in the same run, so their seconds and peaks compare.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from memstep.evaluation.commands import (KVPRESS_PYTHON, PEER_SCRIPT, REFERENCE, ROOT,  # noqa: F401
                                         worker_command, worker_env)
from memstep.evaluation.grid import Config, alike_keys
from memstep.evaluation.process import parse_line
from memstep.evaluation.store import ResultStore
from memstep.evaluation.suite import Case
from memstep.evaluation.needles import answer_matches
from memstep.evaluation.niah import BENCHMARKS, niah_recall

LOGITS = "logits"  # under the results folder: the reference's log-probabilities, one .npy per case (not committed)


@dataclass
class EvalSettings:
    """Everything besides the configuration and the case that can change a cell's result."""

    model: str = "embedded"  # (the haystack text is part of each case)
    chunk: int = 512
    sinks: int = 4
    window: int = 32  # memstep's SnapKV observation window
    peer_window: int = 64  # kvpress SnapKVPress's default window
    max_new_tokens: int = 16
    continuation_tokens: int = 32
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 2
    prompt_form: str = "chat"  # how the questions are framed: the model's chat template or a completion

    def key_fields(self) -> dict:
        fields = dict(self.__dict__)
        fields.pop("threads")  # how fast, not what: resumed cells stay valid
        fields.pop("prompt_form")  # follows from the model (already in the key); the cells from before it keep theirs
        return fields


@dataclass
class RunReport:
    ran: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    executor: str = "local"
    workers: int = 0  # worker processes that ran cells (local: one per configuration and length)
    nodes: int = 1  # machines they ran on

    def where(self) -> str:
        """Which executor ran the cells, on how many workers (the summary's line)."""
        if self.executor == "local":
            return f"{self.workers} local worker process{'es' if self.workers != 1 else ''}, one at a time"
        return f"{self.workers} Ray worker{'s' if self.workers != 1 else ''} on {self.nodes} " \
               f"node{'s' if self.nodes != 1 else ''}"


def reference_path(folder: str | Path, case: Case, settings: EvalSettings) -> Path:
    """Where the full cache's continuation log-probabilities of ``case`` are kept."""
    fields = {"cell": case.cell, "model": settings.model, "dtype": settings.dtype,
              "continuation": case.continuation_ids}
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / LOGITS / f"{digest}.npy"


def cell_record(config: Config, case: Case, key: str, event: dict, ready: dict) -> dict:
    answer = event.get("answer") or ""
    recall = niah_recall(answer, case.kind) if case.kind in BENCHMARKS else None  # the needle test's rule
    return {
        "key": key, "config": config.to_dict(), "label": config.label, "peer": config.is_peer,
        **case.cell, "kind": case.kind, "passkey": case.passkey, "answer": answer,
        "correct": answer_matches(answer, case.passkey) if recall is None else recall == 1.0,
        **({"recall": recall} if recall is not None else {}),
        "kl": event.get("kl"), "kl_max": event.get("kl_max"), "top1": event.get("top1"),
        "needle_whole": event.get("needle_whole"), "settings": event.get("settings"),
        "continuation_nll": event.get("continuation_nll"),
        "prefill_seconds": event.get("prefill_seconds"), "seconds": event.get("seconds"),
        "peak_rss_bytes": event.get("peak_rss_bytes"), "baseline_rss_bytes": ready.get("baseline_rss_bytes"),
        "peak_device_bytes": event.get("peak_device_bytes"),
        "memory_entries": event.get("memory_entries"), "retention": event.get("retention"),
        **({"retention_layers": event["retention_layers"]} if event.get("retention_layers") else {}),
        "document_tokens": len(case.document_ids), "transformers": ready.get("transformers"),
    }


def make_job(config: Config, settings: EvalSettings, items: list[dict]) -> dict:
    """What a worker reads: the model, the configuration, the settings and the cases (``items``:
    key, case, reference)."""
    return {"model": settings.model, "device": settings.device, "dtype": settings.dtype,
            "threads": settings.threads, "prompt_form": settings.prompt_form, "config": config.to_dict(),
            "settings": settings.key_fields(), "cases": items}


def run_group(config: Config, cases: list[Case], keys: list[str], settings: EvalSettings,
              store: ResultStore, report: RunReport, on_cell: Callable[[dict], None] | None = None,
              kvpress_python=None, divergence: bool = False) -> None:
    """One worker process for ``cases`` (one length) under ``config``; with ``divergence``
    the full cache saves its continuation log-probabilities and every other configuration
    is scored against them."""
    def reference(case: Case) -> dict | None:
        if not divergence:
            return None
        path = str(reference_path(store.folder, case, settings))
        return {"write": path} if config == REFERENCE else {"read": path}

    job = make_job(config, settings, [{"key": k, "case": c.to_dict(), "reference": reference(c)}
                                      for k, c in zip(keys, cases)])
    by_key = dict(zip(keys, cases))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(job, handle)
    env = worker_env(settings.threads)
    report.workers += 1
    ready: dict = {}
    try:
        with tempfile.TemporaryFile("w+") as errors:
            process = subprocess.Popen(worker_command(config, handle.name, kvpress_python), stdout=subprocess.PIPE,
                                       stderr=errors, text=True, env=env, cwd=ROOT)
            for line in process.stdout:
                event = parse_line(line)
                if event is None:
                    continue
                if event["event"] == "ready":
                    ready = event
                elif event["event"] == "cell" and event.get("key") in by_key:
                    record = cell_record(config, by_key[event["key"]], event["key"], event, ready)
                    store.add(record)
                    report.ran += 1
                    if on_cell:
                        on_cell(record)
                elif event["event"] == "error":
                    report.errors.append(f"{config.label}: {event.get('message')}")
                    store.add_failure(config.label, cases[0].length, str(event.get("message")))
            code = process.wait()
            if code != 0:
                errors.seek(0)
                tail = errors.read().strip().splitlines()[-3:]
                report.errors.append(f"{config.label} worker exited with {code}: {' | '.join(tail)}")
                store.add_failure(config.label, cases[0].length, f"worker exited with {code}: {tail[-1] if tail else ''}")
    finally:
        os.unlink(handle.name)


def grid_order(configs: list[Config], divergence: bool) -> list[Config]:
    """The configurations in the order they run: with ``divergence`` memstep's full cache first (added
    when the grid lacks it), the reference every other configuration is scored against."""
    if divergence:
        return [REFERENCE] + [c for c in configs if c != REFERENCE]
    return list(configs)


def pending(configs: list[Config], cases: list[Case], settings: EvalSettings, store: ResultStore,
            divergence: bool = False):
    """(configuration, [(key, case)] still to run, how many are done) per length and configuration,
    the longest length first (where the configurations differ most), so an interrupted run has
    whole lengths rather than whole configurations. A cell is done when any key it may sit under
    is stored; with ``divergence`` the full cache runs again on a case whose saved log-probabilities
    are gone, so every compressed cell can be scored against it."""
    fields = settings.key_fields()
    for length in sorted({c.length for c in cases}, reverse=True):
        group = [c for c in cases if c.length == length]
        for config in configs:
            keys = [alike_keys(config, c.cell, fields) for c in group]
            todo = [(k[0], c) for k, c in zip(keys, group) if not any(key in store for key in k)
                    or (divergence and config == REFERENCE and not reference_path(store.folder, c, settings).exists())]
            yield config, todo, len(group) - len(todo)


def run_grid(configs: list[Config], cases: list[Case], settings: EvalSettings, store: ResultStore,
             on_cell: Callable[[dict], None] | None = None, kvpress_python=None,
             divergence: bool = False) -> RunReport:
    """Every (configuration, case) cell not yet in the store (``pending``), one worker process per
    configuration and length, one at a time."""
    configs = grid_order(configs, divergence)
    for config in configs:  # a missing peer virtualenv fails before any work, not halfway
        worker_command(config, "-", kvpress_python)
    report = RunReport()
    for config, todo, done in pending(configs, cases, settings, store, divergence):
        report.skipped += done
        if todo:
            run_group(config, [c for _, c in todo], [k for k, _ in todo], settings, store, report,
                      on_cell, kvpress_python, divergence)
    return report
