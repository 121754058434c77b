"""The Ray side of ``--executor ray``: one cell in a Ray task, handed to the served worker that its
Ray worker process keeps (``--serve``: memstep's worker with this python, the peer script with its
own). Light (no torch here: the served worker holds the model), and Ray itself is imported only
inside the task."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from memstep.evaluation.commands import REFERENCE, ROOT, worker_command, worker_env
from memstep.evaluation.grid import Config
from memstep.evaluation.process import SERVED_BY, parse_line
from memstep.evaluation.scratch import locked_folder

CELL_PREFIX = "memstep-cell-"  # a cell's scratch folder under the temporary directory


class CellError(Exception):
    """A cell that could not run: its worker reported an error, or the worker died."""


def served_key(command: list[str], env: dict) -> tuple:
    """What a served worker is: its command, its GPU (Ray sets CUDA_VISIBLE_DEVICES per task) and threads."""
    return tuple(command), env.get("CUDA_VISIBLE_DEVICES"), env.get("OMP_NUM_THREADS")


class Served:
    """A served worker process (``--serve``) that a Ray worker keeps between its tasks: its model
    stays loaded while the tasks ask for the same command and devices."""

    def __init__(self, command: list[str], env: dict):
        self.key = served_key(command, env)
        self.errors = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                        text=True, env={**env, SERVED_BY: str(os.getpid())}, cwd=ROOT)

    def run(self, job: dict) -> dict:
        """The job's events by name (its one case: "ready" and "cell" or "error")."""
        events = {}
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            for line in self.process.stdout:
                event = parse_line(line)
                if event is None:
                    continue
                if event["event"] == "done":
                    return events
                events[event["event"]] = event
        except BrokenPipeError:
            pass
        code = self.process.wait()
        self.errors.seek(0)
        tail = self.errors.read().strip().splitlines()[-1:]
        raise CellError(f"worker exited with {code}: {tail[-1] if tail else ''}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # the served worker ends at the end of its input
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.errors.close()


_SERVED: list[Served] = []  # a Ray worker's one served worker (one model in memory per worker)


def served(command: list[str], env: dict) -> Served:
    """This Ray worker's served worker for ``command``: the one it keeps, or a new one in its place."""
    if _SERVED and (_SERVED[0].key != served_key(command, env) or _SERVED[0].process.poll() is not None):
        _SERVED.pop().close()
    if not _SERVED:
        _SERVED.append(Served(command, env))
    return _SERVED[0]


def run_cell(config: dict, kvpress_python: str | None, job: dict, reference, divergence: bool) -> dict:
    """One cell, in a Ray task: ``job`` holds its one case; ``reference`` the full cache's
    log-probabilities of the case (None: the full cache itself writes them when ``divergence``).
    Returns the worker's events, which worker ran it, and the full cache's log-probabilities."""
    import ray

    config = Config.from_dict(config)
    command = worker_command(config, "--serve", kvpress_python)
    env = worker_env(job["threads"])
    # the reference's folder is locked while the cell runs: the next cell on this machine removes it
    # if this Ray worker is killed mid-cell
    with locked_folder(Path(tempfile.gettempdir()), CELL_PREFIX) as folder:
        path = os.path.join(folder, "reference.npy")
        if reference is not None:
            np.save(path, reference)
        if divergence:
            # the full cache writes its log-probabilities; another configuration reads its case's (when
            # the full cache failed there are none: it runs without KL, as under the local executor)
            job["cases"][0]["reference"] = {"write": path} if config == REFERENCE else {"read": path}
        try:
            events = served(command, env).run(job)
        except CellError:
            _SERVED.pop().close()
            raise
        if "error" in events:
            raise CellError(events["error"].get("message"))
        written = np.load(path) if divergence and config == REFERENCE and os.path.exists(path) else None
    context = ray.get_runtime_context()
    return {"ready": events.get("ready", {}), "cell": events["cell"], "logprobs": written,
            "worker": context.get_worker_id(), "node": context.get_node_id()}
