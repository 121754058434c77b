"""`memstep eval --executor ray`: the grid's cells as Ray tasks, on a local Ray started for the
run or on a cluster it joins.

The cells are the ones the local executor runs (``runner.pending``), with the same keys and
the same worker code: each Ray task hands its one cell to a served worker that its Ray
worker process keeps (``python -m memstep.evaluation.worker --serve``, or the peer script
with its own python for kvpress and the HF full cache), so the model loads once per worker,
not per cell. Only this driver writes: each finished cell goes to the results folder's
``cells.jsonl`` as it arrives, so a killed run loses the cells in flight alone and a rerun,
with either executor, resumes. The full cache's continuation log-probabilities (the KL
reference) travel through Ray's object store, never through a shared disk: the driver saves
them in the results folder and hands them to the case's other cells. A task that fails is
retried once (Ray's retry), then recorded as a failure with its error, as the local executor
records one.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from memstep.errors import MemstepError
from memstep.evaluation.grid import Config
from memstep.evaluation.ray_worker import CellError, run_cell
from memstep.evaluation.scratch import locked_folder
from memstep.evaluation.runner import (REFERENCE, EvalSettings, RunReport, cell_record, grid_order, make_job,
                                       pending, reference_path, worker_command)
from memstep.evaluation.store import ResultStore
from memstep.evaluation.suite import Case

RAY_VERSION = "2.60.0"  # pyproject.toml's extra and requirements-dev.txt pin the same
INSTALL = f"pip install 'memstep[ray]' (ray=={RAY_VERSION}), or `make ray` in a checkout"
TEMP_PREFIX = "memstep-ray-"  # a local Ray's own folder under the temporary directory, one per run
RETRIES = 1


def require_ray():
    """Ray, or one line naming how to install it."""
    try:
        import ray
    except ImportError:
        raise MemstepError(f"--executor ray needs Ray: {INSTALL}") from None
    return ray


# ---- the driver ----------------------------------------------------------------------------------
def task_resources(settings: EvalSettings) -> dict:
    """What one cell asks of Ray: its torch threads as CPUs, and one GPU where the device is CUDA."""
    return {"num_cpus": settings.threads, "num_gpus": 1 if settings.device.startswith("cuda") else 0}


def capacity(ray, settings: EvalSettings) -> int:
    """How many cells the cluster's live nodes can run at once."""
    needs = task_resources(settings)
    slots = 0
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources", {})
        fits = int(have.get("CPU", 0) // needs["num_cpus"])
        if needs["num_gpus"]:
            fits = min(fits, int(have.get("GPU", 0)))
        slots += fits
    return slots


def temp_root() -> Path:
    """Where a local Ray's folder goes: the temporary directory, unless its path is too long for the
    Unix sockets Ray makes inside (about 107 characters in all)."""
    root = Path(tempfile.gettempdir())
    return root if len(str(root)) <= 40 else Path("/tmp")


@contextlib.contextmanager
def local_ray(ray, cpus: int):
    """A local Ray for this run alone, in a folder of its own that goes with it (and that the next run
    removes if this one is killed). It uses ``cpus`` CPUs, not the whole machine."""
    with locked_folder(temp_root(), TEMP_PREFIX, str(os.getpid())) as folder:
        try:
            try:
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                         _temp_dir=str(folder), logging_level=logging.ERROR)
            except Exception as err:
                raise MemstepError(f"cannot start a local Ray: {str(err).splitlines()[0][:200]}") from err
            yield
        finally:
            ray.shutdown()


def auth_hint() -> str:
    """What to try when a join fails: `ray start` has required Ray's token since Ray 2.59, and a
    driver only sends it with RAY_AUTH_MODE=token (the failure itself names neither)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return ""
    return ("; a cluster started by `ray start` asks for Ray's token: run with RAY_AUTH_MODE=token and the "
            "cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN")


@contextlib.contextmanager
def joined_ray(ray, address: str):
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as err:
        raise MemstepError(f"cannot join the Ray cluster at {address}: {str(err).splitlines()[0][:200]}"
                           f"{auth_hint()}") from err
    try:
        yield
    finally:
        ray.shutdown()


def failure_message(err: Exception) -> str:
    """One line for a task that failed twice: the cell's own error, or what Ray says happened."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, CellError) or isinstance(err, CellError):
        return str(cause if isinstance(cause, CellError) else err)
    lines = str(cause or err).strip().splitlines()
    return f"{type(cause or err).__name__}: {lines[-1] if lines else ''}"[:500]


def save_logprobs(path: Path, logprobs: np.ndarray) -> None:
    """The full cache's log-probabilities as the local executor saves them (``save_reference``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, logprobs)
    tmp.replace(path)  # a reader never sees half a file


def run_grid_ray(configs: list[Config], cases: list[Case], settings: EvalSettings, store: ResultStore,
                 on_cell: Callable[[dict], None] | None = None, kvpress_python=None, divergence: bool = False,
                 address: str | None = None, workers: int | None = None) -> RunReport:
    """Every cell not yet in the store, as Ray tasks: on the cluster at ``address``, else on a local
    Ray of ``workers`` x the threads' CPUs (default: the machine's cores). At most ``workers`` cells
    run at once (default: as many as the cluster's nodes fit), the grid's order kept: the longest
    length first, each case's full cache before the cells scored against it."""
    ray = require_ray()
    configs = grid_order(configs, divergence)
    for config in configs:  # a missing peer virtualenv fails before any work, not halfway
        worker_command(config, "-", kvpress_python)
    report = RunReport(executor="ray")
    cells = []
    for config, todo, done in pending(configs, cases, settings, store, divergence):
        report.skipped += done
        cells += [(config, key, case) for key, case in todo]
    if not cells:
        report.nodes = 0
        return report  # nothing to run: no Ray started
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        session = joined_ray(ray, address)
    else:
        if workers is None:
            workers = max(1, (os.cpu_count() or 1) // settings.threads)
        session = local_ray(ray, workers * settings.threads)
    with session:
        Driver(ray, settings, store, report, on_cell, kvpress_python, divergence, workers, address).run(cells)
    return report


class Driver:
    """Submits the cells in the grid's order, a few more than run at once, and stores each as it ends."""

    def __init__(self, ray, settings, store, report, on_cell, kvpress_python, divergence, workers, address):
        self.ray, self.settings, self.store, self.report = ray, settings, store, report
        self.on_cell, self.kvpress_python, self.divergence = on_cell, kvpress_python, divergence
        self.workers, self.address = workers, address
        resources = task_resources(settings)
        self.task = ray.remote(max_calls=0)(run_cell).options(max_retries=RETRIES, retry_exceptions=True,
                                                                   **resources)
        self.refs: dict[Path, object] = {}  # each case's reference log-probabilities, put in the object store once
        self.uses: Counter = Counter()  # the cells still to be scored against each reference
        self.waiting: dict[Path, list] = {}  # cells whose case's full cache is still running
        self.ready: list = []  # (rank, cell) to submit, by the grid's order
        self.flight: dict = {}  # task -> (rank, cell)
        self.ran_by: set = set()
        self.ran_on: set = set()
        self.slots, self.checked = 0, 0.0

    def reference_of(self, case: Case) -> Path:
        return reference_path(self.store.folder, case, self.settings)

    def run(self, cells: list) -> None:
        rerun = {self.reference_of(case) for config, _, case in cells if config == REFERENCE} if self.divergence \
            else set()
        for rank, (config, key, case) in enumerate(cells):
            if self.divergence and config != REFERENCE:
                path = self.reference_of(case)
                self.uses[path] += 1
                if path in rerun:  # its full cache runs in this run: it waits for it
                    self.waiting.setdefault(path, []).append((rank, (config, key, case)))
                    continue
            heapq.heappush(self.ready, (rank, (config, key, case)))
        while self.ready or self.flight:
            self.submit()
            done, _ = self.ray.wait(list(self.flight), num_returns=1)
            for task in done:
                self.finish(task, *self.flight.pop(task))
        assert not self.waiting, "a cell waited for a full cache that never ran"

    def window(self) -> int:
        """Cells in flight: twice what runs at once, so no worker waits for the driver. On a cluster,
        ``workers`` when given (an autoscaler adds the nodes they need), else as many as its live
        nodes fit, read again every few seconds."""
        if self.workers:
            return 2 * self.workers
        if time.monotonic() - self.checked > 10:
            self.slots, self.checked = capacity(self.ray, self.settings), time.monotonic()
            if self.slots == 0 and not self.flight:
                need = task_resources(self.settings)
                raise MemstepError(f"no node of the Ray cluster at {self.address} has {need['num_cpus']} CPUs"
                                   + (" and a GPU" if need["num_gpus"] else "") + " to run a cell (see --threads, "
                                   "--device; --workers N waits for an autoscaler to add nodes)")
        return 2 * max(1, self.slots)

    def submit(self) -> None:
        while self.ready and len(self.flight) < self.window():
            rank, cell = heapq.heappop(self.ready)
            config, key, case = cell
            reference = None
            if self.divergence and config != REFERENCE:
                path = self.reference_of(case)
                if path not in self.refs and path.exists():
                    self.refs[path] = self.ray.put(np.load(path))
                reference = self.refs.get(path)
            job = make_job(config, self.settings, [{"key": key, "case": case.to_dict(), "reference": None}])
            task = self.task.remote(config.to_dict(), None if self.kvpress_python is None else str(self.kvpress_python),
                                    job, reference, self.divergence)
            self.flight[task] = (rank, cell)

    def finish(self, task, rank: int, cell: tuple) -> None:
        config, key, case = cell
        try:
            result = self.ray.get(task)
        except Exception as err:  # failed twice (Ray retried it once): recorded, the others go on
            if not isinstance(err, (CellError, self.ray.exceptions.RayError)):
                raise
            message = failure_message(err)
            self.report.errors.append(f"{config.label}: {message}")
            self.store.add_failure(config.label, case.length, message)
            result = None
        if self.divergence and config == REFERENCE:
            path = self.reference_of(case)
            if result is not None and result["logprobs"] is not None:
                save_logprobs(path, result["logprobs"])
                if self.uses[path]:
                    self.refs[path] = self.ray.put(result["logprobs"])
            for waiting in self.waiting.pop(path, []):  # scored against it, or without KL if it failed
                heapq.heappush(self.ready, waiting)
        elif self.divergence:
            path = self.reference_of(case)
            self.uses[path] -= 1
            if self.uses[path] == 0:
                self.refs.pop(path, None)
        if result is None:
            return
        record = cell_record(config, case, key, result["cell"], result["ready"])
        self.store.add(record)
        self.report.ran += 1
        self.ran_by.add(result["worker"])
        self.ran_on.add(result["node"])
        self.report.workers, self.report.nodes = len(self.ran_by), len(self.ran_on)
        if self.on_cell:
            self.on_cell(record)
