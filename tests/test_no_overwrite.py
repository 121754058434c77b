"""No command overwrites or leaves behind what it did not make (issue 31): eval's results folder
refuses foreign files, run/plan --output refuse an existing file, a --force publish checks every
destination before moving anything, an empty --output is refused before the work, SIGTERM during
a save removes the temporary folder, and memstep's own stale temporary folders are swept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memstep.errors import MemstepError
from memstep.outputs import (MARKER, PARTIAL_MARKER, PARTIAL_SUFFIX, STALE_PARTIAL_SECONDS, check_results_folder,
                             staged_folder, sweep_partials, write_new_file)
from tests.test_outputs import FakeModel, call, listing, no_model_loads, one_line_refusal  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
EVAL_FAST = ["eval", "--lengths", "160", "--depths", "0.5", "--schedules", "full", "--scorers", "recency",
             "--quiet"]


# ---- memstep eval --output ----------------------------------------------------------------------

def test_acceptance_eval_refuses_a_folder_with_the_users_summary(tmp_path, no_model_loads):  # noqa: F811
    d = tmp_path / "d"
    d.mkdir()
    (d / "summary.json").write_text("mine\n")
    before = listing(d)
    code, out, err = call([*EVAL_FAST, "--output", d])
    one_line_refusal(code, err, "memstep did not write", "summary.json", "--force")
    assert listing(d) == before and out == ""  # d unchanged: not even a marker


def test_eval_writes_into_new_marked_and_legacy_folders(tmp_path):
    files = frozenset({"cells.jsonl", "summary.json"})
    new = check_results_folder(tmp_path / "new", files)
    assert json.loads((new / MARKER).read_text())["made_by"] == "memstep"
    (new / "summary.json").write_text("{}")
    assert check_results_folder(new, files) == new  # memstep's own: a rerun resumes it
    (new / "notes.txt").write_text("mine")  # a file the user put there since
    with pytest.raises(MemstepError, match=r"did not write there \(notes.txt\)"):
        check_results_folder(new, files)
    legacy = tmp_path / "legacy"  # written before memstep marked its folders
    legacy.mkdir()
    (legacy / "cells.jsonl").write_text('{"key": "k"}\n')
    with pytest.raises(MemstepError, match="cells.jsonl"):
        check_results_folder(legacy, files)
    check_results_folder(legacy, files, legacy=lambda folder: True)
    assert not (legacy / MARKER).exists()  # accepted as memstep's results, but not made by memstep here


@pytest.mark.parametrize("summary, reason", [("mine\n", "not JSON"), ("[1, 2]", "not a JSON object"),
                                             (b"\xff\xfe{", "not JSON")])
def test_acceptance_eval_force_refuses_a_summary_it_cannot_read_before_any_work(tmp_path, no_model_loads,  # noqa: F811
                                                                               summary, reason):
    d = tmp_path / "d"
    d.mkdir()
    (d / "summary.json").write_bytes(summary if isinstance(summary, bytes) else summary.encode())
    (d / "notes.txt").write_text("mine")
    before = listing(d)
    code, out, err = call([*EVAL_FAST, "--output", d, "--force"])
    one_line_refusal(code, err, "summary.json", reason, "move it away")
    assert listing(d) == before and out == ""


def test_acceptance_eval_force_onto_a_non_json_summary_in_a_fresh_process(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "summary.json").write_text("these are my notes, not JSON")
    done = subprocess.run([sys.executable, "-m", "memstep", *EVAL_FAST, "--output", str(d), "--force"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    one_line_refusal(done.returncode, done.stderr, "summary.json", "not JSON")
    assert (d / "summary.json").read_text() == "these are my notes, not JSON" and sorted(os.listdir(d)) == ["summary.json"]


def test_eval_force_leaves_the_folder_the_users(tmp_path):
    """--force lets memstep's files in beside the user's, once: the folder is not marked as memstep's,
    so the next run without --force is refused again. A folder memstep creates is marked."""
    files = frozenset({"cells.jsonl", "summary.json"})
    d = tmp_path / "d"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    assert check_results_folder(d, files, force=True) == d
    (d / "cells.jsonl").write_text('{"key": "k", "label": "x", "length": 1}\n')  # what the forced run wrote
    assert not (d / MARKER).exists()
    with pytest.raises(MemstepError, match=r"did not write there \(.*notes.txt\)"):
        check_results_folder(d, files, legacy=lambda folder: True)  # even with memstep's cells in it
    empty = tmp_path / "empty"
    empty.mkdir()
    check_results_folder(empty, files)
    assert not (empty / MARKER).exists()  # an empty folder of the user's stays the user's
    assert (check_results_folder(tmp_path / "new", files) / MARKER).exists()


def test_eval_force_writes_beside_foreign_files_and_keeps_them(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "summary.json").write_text("mine")
    check_results_folder(d, frozenset({"summary.json"}), force=True)
    assert (d / "summary.json").read_text() == "mine"  # checked, not touched: eval replaces it later


@pytest.mark.parametrize("argv", [[*EVAL_FAST, "--output", ""], ["run", "doc.txt", "--output", ""],
                                  ["compress", "laco", "--output", ""], ["compress", "sparse", "--output", ""],
                                  ["plan", "--tokens", "4096", "--output", ""]])
def test_an_empty_output_is_refused_before_any_work(tmp_path, monkeypatch, argv, no_model_loads):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.txt").write_text("A short document.")
    before = listing(tmp_path)
    code, out, err = call(argv)
    one_line_refusal(code, err, "--output")
    assert listing(tmp_path) == before


# ---- memstep run / plan --output FILE ------------------------------------------------------------

def test_run_refuses_an_existing_output_file_before_any_work(tmp_path, no_model_loads):  # noqa: F811
    doc, result = tmp_path / "doc.txt", tmp_path / "result.json"
    doc.write_text("A short document.")
    result.write_text("my results")
    code, _, err = call(["run", doc, "--output", result])
    one_line_refusal(code, err, "exists", "--force")
    assert result.read_text() == "my results"


def test_plan_output_is_new_unless_forced(tmp_path):
    result = tmp_path / "plan.json"
    result.write_text("mine")
    code, _, err = call(["plan", "--tokens", "4096", "--output", result])
    one_line_refusal(code, err, "exists")
    assert result.read_text() == "mine"
    code, _, _ = call(["plan", "--tokens", "4096", "--output", result, "--force"])
    assert code == 0 and json.loads(result.read_text())["schedule"]["tokens"] == 4096
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left


def test_write_new_file_is_whole_or_nothing(tmp_path):
    target = tmp_path / "out.json"
    write_new_file(target, "first")
    with pytest.raises(MemstepError, match="exists"):
        write_new_file(target, "second")
    assert target.read_text() == "first"
    write_new_file(target, "second", force=True)
    assert target.read_text() == "second" and [p.name for p in tmp_path.iterdir()] == ["out.json"]
    write_new_file(os.devnull, "into a device: written, not replaced")


# ---- --force publish: every destination checked first --------------------------------------------

def test_a_failed_force_publish_leaves_the_folder_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    (out / "model.safetensors").mkdir()  # a folder named like one of the model's files
    (out / "model.safetensors" / "inner").write_text("keep too")
    before = listing(out)
    with pytest.raises(MemstepError, match="nothing was written"):
        with staged_folder(out, force=True) as partial:
            FakeModel(("config.json", "tokenizer.json", "model.safetensors")).save_pretrained(partial)
    assert listing(out) == before  # not a mixed folder: config.json and tokenizer.json did not move in
    assert not [p for p in tmp_path.iterdir() if PARTIAL_SUFFIX in p.name]


# ---- debris ----------------------------------------------------------------------------------

def _partial(parent: Path, name: str, created: float | None, **marker) -> Path:
    folder = parent / f".{name}.abc{PARTIAL_SUFFIX}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    if created is not None:
        (folder / PARTIAL_MARKER).write_text(json.dumps({"made_by": "memstep", "created": created, **marker}))
    return folder


def test_a_partial_from_before_the_lock_goes_by_its_age(tmp_path):
    """Markers written before memstep locked them (no lock, no PID): swept once STALE_PARTIAL_SECONDS
    old; nothing without memstep's marker is ever touched."""
    now = time.time()
    stale = _partial(tmp_path, "old", now - STALE_PARTIAL_SECONDS - 60)
    fresh = _partial(tmp_path, "running", now - 60)  # perhaps a save of an older memstep, in progress
    unmarked = _partial(tmp_path, "theirs", None)  # named like one, without memstep's marker
    os.utime(unmarked, (now - 10 * STALE_PARTIAL_SECONDS,) * 2)
    assert sweep_partials(tmp_path) == [stale.name]
    assert not stale.exists() and fresh.exists() and unmarked.exists()


def test_a_partial_whose_process_is_gone_is_swept_whatever_its_age(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    dead = _partial(tmp_path, "dead", time.time(), pid=int(gone.stdout), host=socket.gethostname())
    alive = _partial(tmp_path, "alive", time.time(), pid=os.getpid(), host=socket.gethostname())
    elsewhere = _partial(tmp_path, "elsewhere", time.time(), pid=int(gone.stdout), host="another-machine")
    assert sweep_partials(tmp_path) == [dead.name]
    assert alive.exists() and elsewhere.exists()


def test_a_save_in_progress_holds_its_lock_and_is_never_swept(tmp_path):
    with staged_folder(tmp_path / "model") as partial:
        assert json.loads((partial / PARTIAL_MARKER).read_text())["locked"]
        FakeModel().save_pretrained(partial)
        assert sweep_partials(tmp_path) == [] and partial.exists()  # its lock is held: a save running
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [MARKER, "config.json", "model.safetensors"]


def test_a_new_save_sweeps_dead_partials_beside_it(tmp_path):
    killed = _partial(tmp_path, "killed", time.time(), locked=True)  # its lock is free: its process is gone
    with staged_folder(tmp_path / "model") as partial:
        assert (partial / PARTIAL_MARKER).exists()  # marked from its first moment
        FakeModel().save_pretrained(partial)
    assert not killed.exists()
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [MARKER, "config.json", "model.safetensors"]


SAVE_THEN_WAIT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from memstep.cli.common import run_command
    from memstep.outputs import staged_folder

    def save():
        with staged_folder(sys.argv[1]) as partial:
            (partial / "model.safetensors").write_bytes(b"0" * 4096)
            print("saving", flush=True)
            # the save in progress when SIGTERM comes, in short steps as a save's writes are: one long
            # sleep wakes for the handler only when the kernel hands the signal to the main thread
            # (handed to another thread, it ran out the test's 30 s wait)
            for _ in range(300):
                time.sleep(0.1)
        return 0

    sys.exit(run_command(save))
""")


def test_sigterm_during_a_save_leaves_no_folder(tmp_path):
    target = tmp_path / "X"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", SAVE_THEN_WAIT, str(target)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    assert child.stdout.readline().strip() == "saving"
    assert [p for p in tmp_path.iterdir() if PARTIAL_SUFFIX in p.name]  # the temporary folder is there
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 143 and err.strip() == "memstep: terminated"
    assert list(tmp_path.iterdir()) == []  # no folder beside X, no X
