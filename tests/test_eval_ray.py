"""`memstep eval --executor ray`: the same cells as the local executor, on a local Ray of two
workers; a driver killed mid-run resumes without recomputing a finished cell (with either
executor), a task that fails is retried once and then recorded; nothing is left running.
Ray runs in a subprocess of its own (as a user runs it), never in the test's process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from memstep.cli import main
from memstep.evaluation.grid import Config
from memstep.evaluation.ray_executor import TEMP_PREFIX, Driver, task_resources, temp_root
from memstep.evaluation.scratch import clean_stale, holders
from memstep.evaluation.ray_worker import CellError
from memstep.evaluation.runner import EvalSettings, RunReport, reference_path
from memstep.evaluation.store import ResultStore
from memstep.evaluation.suite import Case

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from memstep.cli import main; sys.exit(main(sys.argv[1:]))"
# the grid: 2 haystacks x 2 depths, memstep's full cache and FM at M = 128: 8 cells
GRID = ["--lengths", "512", "--depths", "0.3,0.7", "--schedules", "full,fm", "--budgets", "128", "--chunk", "128",
        "--needles", "passkey", "--metrics", "accuracy", "--continuation-tokens", "0"]
MEASURED = {"seconds", "prefill_seconds", "peak_rss_bytes", "baseline_rss_bytes", "peak_device_bytes"}
# one torch thread a worker (xdist runs another test file beside this one); a local Ray of 2 CPUs
COMMON = ["--quiet", "--json", "--threads", "1"]
RAY = ["--executor", "ray", "--workers", "2"]


def eval_cli(*args: str, script: str = CLI, extra: tuple = ()) -> tuple[subprocess.CompletedProcess, int]:
    """`memstep eval ARGS` in a process of its own: its result and its pid (every process it starts,
    Ray's and the served workers included, carries that pid in MEMSTEP_TEST_DRIVER)."""
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    process = subprocess.Popen([sys.executable, "-c", script, *extra, "eval", *args, *COMMON], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, MEMSTEP_TEST_RUN=mark))
    out, err = process.communicate(timeout=600)
    RUNS[process.pid] = mark
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), process.pid


RUNS: dict[int, str] = {}  # driver pid -> the mark in the environment of everything it started


def cells(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "cells.jsonl").read_text().splitlines()]


def computed(cell: dict) -> dict:
    """What a cell computed (its answer, retention, KL...), without what it measured (seconds, memory)."""
    return {k: v for k, v in cell.items() if k not in MEASURED}


def served_workers(marks: set[str]) -> list[int]:
    """Served workers (a Ray worker's model process) of these runs still running (a test beside this
    one on another pytest-xdist worker has its own)."""
    found = []
    for pid in Path("/proc").glob("[0-9]*"):
        try:
            words = (pid / "cmdline").read_bytes().split(b"\0")
            env = (pid / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--serve" in words and any(f"MEMSTEP_TEST_RUN={mark}".encode() in env for mark in marks):
            found.append(int(pid.name))
    return found


def assert_nothing_left(*pids: int) -> None:
    """No Ray folder of these drivers' runs, no process writing into one, no served worker of theirs
    (they end with their Ray worker: waited for, at most a minute)."""
    for pid in pids:
        folder = temp_root() / f"{TEMP_PREFIX}{pid}"
        assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))[:20]
        writing = holders(folder)
        assert writing == [], [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in writing]
    marks = {RUNS[pid] for pid in pids}
    deadline = time.monotonic() + 60
    while served_workers(marks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert served_workers(marks) == []


@pytest.mark.slow
def test_ray_cells_are_the_local_cells(tmp_path, capsys):
    """The issue's acceptance grid: `--executor ray` on a local Ray of 2 workers writes the cells the
    local executor writes (same keys; same answers, retention, memory...), only the seconds and
    memory readings differ; the summary says which executor ran them, on how many workers."""
    assert main(["eval", *GRID, "--output", str(tmp_path / "local"), *COMMON]) == 0  # (its workers: processes)
    local = json.loads(capsys.readouterr().out)
    ray, pid = eval_cli(*GRID, *RAY, "--output", str(tmp_path / "ray"))
    assert ray.returncode == 0, ray.stderr
    assert ray.stderr == ""  # the progress bar is off (--quiet) and Ray says nothing
    mine, theirs = cells(tmp_path / "ray"), cells(tmp_path / "local")
    assert len(mine) == 8 and len({c["key"] for c in mine}) == 8
    assert sorted(map(computed, mine), key=lambda c: c["key"]) == sorted(map(computed, theirs), key=lambda c: c["key"])
    assert all(c["peak_rss_bytes"] >= c["baseline_rss_bytes"] > 100 * 2**20 for c in mine)
    run = json.loads(ray.stdout)["run"]
    assert run["executor"]["name"] == "ray" and 1 <= run["executor"]["workers"] <= 2 and run["executor"]["nodes"] == 1
    assert local["run"]["executor"] == {"name": "local", "workers": 2, "nodes": 1}
    assert_nothing_left(pid)


def test_without_ray_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """No Ray installed: one line naming the install command, exit 2, nothing written."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    out = tmp_path / "results"
    assert main(["eval", *GRID, "--executor", "ray", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'memstep[ray]'" in err and "ray==2.60.0" in err
    assert not out.exists()


def test_executor_arguments(tmp_path, capsys):
    for argv in (["--ray-address", "127.0.0.1:6379"], ["--workers", "2"], ["--executor", "ray", "--workers", "0"]):
        assert main(["eval", *GRID, *argv, "--output", str(tmp_path / "out")]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    import torch

    if not torch.cuda.is_available():  # CUDA asked for where there is none: one line, before any work
        assert main(["eval", *GRID, "--device", "cuda", "--output", str(tmp_path / "out")]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert task_resources(EvalSettings(threads=3)) == {"num_cpus": 3, "num_gpus": 0}
    assert task_resources(EvalSettings(threads=1, device="cuda")) == {"num_cpus": 1, "num_gpus": 1}


def test_clean_stale_removes_a_killed_runs_ray(tmp_path):
    """What a killed run's local Ray left (its folder, a process still writing into it) goes; a live
    run's folder (its lock held) stays."""
    import fcntl

    stale, live = tmp_path / f"{TEMP_PREFIX}1", tmp_path / f"{TEMP_PREFIX}2"
    for folder in (stale, live):
        (folder / "session" / "logs").mkdir(parents=True)
        (folder / "lock").touch()
    leftover = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'w'); "
                                 "print('open', flush=True); time.sleep(600)", str(stale / "session" / "logs" / "x")],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert leftover.stdout.readline() == "open\n"
        with open(live / "lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            assert holders(stale) == [leftover.pid]
            assert clean_stale(tmp_path, TEMP_PREFIX) == [stale]
        assert leftover.wait(timeout=60) == -signal.SIGKILL
        assert not stale.exists() and live.exists()
    finally:
        leftover.kill()
        leftover.wait()


# ---- the driver's bookkeeping, with a stand-in for Ray (no cluster) ---------------------------------
class FakeTask:
    def __init__(self, args):
        self.args = args


class FakeRay:
    """Runs each submitted cell when the driver asks for it, in submission order; ``cell(args)``
    plays the worker (and may raise, as a task failing twice does)."""

    class exceptions:
        RayError = RuntimeError

    def __init__(self, cell):
        self.cell, self.log, self.options, self.objects, self.most = cell, [], {}, {}, 0
        self.flying = 0

    def remote(self, **decorated):
        fake = self

        class Remote:
            def options(self, **options):
                fake.options = {**decorated, **options}
                return self

            def remote(self, *args):
                fake.flying += 1
                fake.most = max(fake.most, fake.flying)
                fake.log.append(("submit", args[2]["cases"][0]["key"]))
                return FakeTask(args)

        return lambda function: Remote()

    def put(self, value):
        ref = object()
        self.objects[ref] = value
        return ref

    def wait(self, tasks, num_returns):
        return tasks[:1], tasks[1:]

    def get(self, task):
        self.flying -= 1
        config, _, job, reference, _ = task.args
        self.log.append(("end", job["cases"][0]["key"]))
        return self.cell(config, job, self.objects.get(reference) if reference is not None else None)


def _case(depth: float) -> Case:
    return Case(length=64, depth=depth, seed=0, haystack="h.txt", start=0, passkey="1", question="q?",
                document_ids=[1] * 60, continuation_ids=[2] * 4, head_ids=[3], question_ids=[4],
                needle_tokens=(0, 5), passkey_tokens=(1, 2))


def test_driver_orders_references_and_records_failures(tmp_path):
    """Each FM cell is submitted after its case's full cache ended and gets its log-probabilities; a
    full cache that fails (twice, Ray's retry spent) is recorded with its error, and its FM cell runs
    without a reference; the others are stored; no more than 2 x workers are ever in flight."""
    settings = EvalSettings(threads=1)
    store = ResultStore(tmp_path)
    cases = [_case(d) for d in (0.2, 0.4, 0.6, 0.8)]
    full, fm = Config("memstep", "full"), Config("memstep", "fm", "linear", "recency", 32, 64, "compact")
    grid = [(full, f"full{i}", c) for i, c in enumerate(cases)] + [(fm, f"fm{i}", c) for i, c in enumerate(cases)]
    seen = {}

    def cell(config, job, reference):
        key = job["cases"][0]["key"]
        seen[key] = reference
        if key == "full2":
            raise CellError("injected")
        return {"ready": {"baseline_rss_bytes": 1}, "cell": {"answer": "1", "kl": 0.0 if key.startswith("full") else 1.0},
                "logprobs": np.full((4, 3), float(key[-1])) if key.startswith("full") else None,
                "worker": f"w{len(seen) % 2}", "node": "n"}

    ray = FakeRay(cell)
    report = RunReport(executor="ray")
    Driver(ray, settings, store, report, None, None, True, 4, None).run(grid)  # room for all 8 at once
    assert ray.options["max_retries"] == 1 and ray.options["retry_exceptions"] is True
    assert ray.options["max_calls"] == 0  # a GPU task's worker (and its model) stays, as a CPU task's does
    assert ray.most <= 8
    for i in range(4):
        assert ray.log.index(("submit", f"fm{i}")) > ray.log.index(("end", f"full{i}"))
    assert [float(seen[f"fm{i}"][0, 0]) for i in (0, 1, 3)] == [0.0, 1.0, 3.0] and seen["fm2"] is None
    assert sorted(c["key"] for c in store.cells()) == ["fm0", "fm1", "fm2", "fm3", "full0", "full1", "full3"]
    assert store.failures() == [{"label": "memstep full", "length": 64, "message": "injected", "cases": 1}]
    assert report.errors == ["memstep full: injected"] and (report.ran, report.workers, report.nodes) == (7, 2, 1)
    assert np.load(reference_path(tmp_path, cases[3], settings))[0, 0] == 3.0
    assert not reference_path(tmp_path, cases[2], settings).exists()


def test_a_failed_join_says_how_to_send_rays_token(monkeypatch):
    """Ray 2.59+ `ray start` asks for its token, and a driver sends it only under RAY_AUTH_MODE=token:
    the failed join's one line says so (and says nothing of it when the mode is already set)."""
    from memstep.errors import MemstepError
    from memstep.evaluation.ray_executor import joined_ray

    class Refusing:
        def init(self, **kwargs):
            raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6390\nmore")

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(MemstepError) as caught, joined_ray(Refusing(), "127.0.0.1:6390"):
        pass
    line = str(caught.value)
    assert "\n" not in line and "Failed to connect" in line and "RAY_AUTH_MODE=token" in line
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(MemstepError) as caught, joined_ray(Refusing(), "127.0.0.1:6390"):
        pass
    assert "RAY_AUTH_MODE" not in str(caught.value)
