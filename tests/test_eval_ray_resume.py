"""`memstep eval --executor ray` killed mid-run (kill -9 of its driver): a rerun resumes without
recomputing a finished cell, Ray's retry reran a failed first try, nothing of the killed run's Ray
is left, and the local executor resumes what Ray wrote. A file of its own, so pytest-xdist can
run it beside test_eval_ray.py's identity test."""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from memstep.cli import main
from test_eval_ray import CLI, COMMON, assert_nothing_left, cells, computed, eval_cli

# with the KL against the full cache: each FM cell needs its case's full-cache log-probabilities
KL_GRID = ["--lengths", "160", "--depths", "0.3,0.7", "--schedules", "full,fm", "--scorers", "recency", "--budgets", "32",
           "--chunk", "64", "--ropes", "compact", "--needles", "passkey", "--metrics", "accuracy,kl",
           "--continuation-tokens", "8"]
ONE_WORKER = ["--executor", "ray", "--workers", "1"]  # what resuming needs (one model process a run)


# The driver of the killed run: every full-cache cell fails its first try (Ray retries it), and the
# driver kills itself (SIGKILL) right after the store holds AFTER cells, with others in flight.
KILLED = CLI.replace("sys.exit(main(sys.argv[1:]))", """
import os, signal
from memstep.evaluation import ray_executor, ray_worker
from memstep.evaluation.store import ResultStore
marks, after = sys.argv[1], int(sys.argv[2])

def flaky(config, kvpress_python, job, reference, divergence):
    folder = os.path.join(marks, job["cases"][0]["key"])
    os.makedirs(folder, exist_ok=True)
    tries = len(os.listdir(folder))
    open(os.path.join(folder, str(tries)), "w").close()
    if config["schedule"] == "full" and tries == 0:
        raise ray_worker.CellError("injected")
    return ray_worker.run_cell(config, kvpress_python, job, reference, divergence)

add = ResultStore.add
def add_then_die(store, cell):
    add(store, cell)
    if len(store) >= after:
        os.kill(os.getpid(), signal.SIGKILL)

ray_executor.run_cell, ResultStore.add = flaky, add_then_die
sys.exit(main(sys.argv[3:]))""")


@pytest.mark.slow
def test_killed_driver_resumes_without_recomputing(tmp_path):
    """kill -9 of the driver after 3 of 8 cells: a rerun runs the other 5 alone (each key written
    once), the FM cells scored against full-cache log-probabilities from both runs; the killed run's
    Ray is gone (the rerun removes its folder); a failed first try was retried. Then the local
    executor resumes the same folder: the FM cells it recomputes from the saved log-probabilities
    equal Ray's."""
    out, marks = tmp_path / "ray", tmp_path / "tries"
    killed, killed_pid = eval_cli(*KL_GRID, *ONE_WORKER, "--output", str(out), script=KILLED, extra=(str(marks), "3"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    first = cells(out)
    # the full caches go first (each FM cell waits for its case's), and each failed once, then ran again
    tries = {path.name: len(list(path.iterdir())) for path in marks.iterdir()}
    assert [c["label"] for c in first] == ["memstep full"] * 3, (tries, killed.stderr[-2000:])
    assert [tries[c["key"]] for c in first] == [2, 2, 2], (tries, killed.stderr[-2000:])

    again, pid = eval_cli(*KL_GRID, *ONE_WORKER, "--output", str(out))
    assert again.returncode == 0, again.stderr
    run = json.loads(again.stdout)["run"]
    assert (run["ran"], run["skipped"]) == (5, 3), (run, again.stderr[-2000:])
    every = cells(out)
    assert len(every) == 8 and len({c["key"] for c in every}) == 8  # nothing computed twice
    assert every[:3] == first
    full = [c for c in every if c["label"] == "memstep full"]
    fm = [c for c in every if c["label"] != "memstep full"]
    assert len(full) == len(fm) == 4
    assert all(c["kl"] == 0.0 and c["top1"] == 1.0 for c in full)
    assert all(c["kl"] > 0 for c in fm)  # each scored against its case's full cache
    assert len(list((out / "logits").glob("*.npy"))) == 4
    assert_nothing_left(killed_pid, pid)

    # the local executor resumes what Ray wrote: the full cache's cells and log-probabilities stand
    local = tmp_path / "local"
    shutil.copytree(out, local)
    (local / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in full))
    assert main(["eval", *KL_GRID, "--output", str(local), *COMMON]) == 0
    assert sorted(map(computed, cells(local)[4:]), key=lambda c: c["key"]) == \
        sorted(map(computed, fm), key=lambda c: c["key"])
