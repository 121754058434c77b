"""Output folders (memstep.outputs): refused before any model loads when they exist and are not
empty, are files or links, or have no parent; written into a temporary sibling and renamed at the
end; nothing memstep did not create in the run is ever removed, whatever fails on the way."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from memstep.cancel import Cancelled
from memstep.cli import main
from memstep.compress.data import save_model
from memstep.errors import MemstepError
from memstep.outputs import MARKER, PARTIAL_SUFFIX, check_output_folder, forced, staged_folder

ROOT = Path(__file__).resolve().parent.parent
MEMSTEP = Path(sys.executable).parent / "memstep"


class FakeModel:
    """save_pretrained like a transformers model or tokenizer: a few files; optionally fails."""

    def __init__(self, files=("config.json", "model.safetensors"), fail: BaseException | None = None):
        self.files, self.fail = files, fail

    def save_pretrained(self, folder):
        for name in self.files:
            Path(folder, name).write_text(name)
            if self.fail is not None:
                raise self.fail


def call(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def one_line_refusal(code, err, *words):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memstep: error:"), (code, err)
    for word in words:
        assert word in lines[0], (word, lines[0])


def listing(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test: the refusals come before it."""
    import memstep.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the output folder was checked")

    monkeypatch.setattr(memstep.models, "load_model", refuse)


@pytest.mark.parametrize("method", ["laco", "sparse"])
def test_acceptance_an_existing_folder_is_kept_and_refused_within_seconds(tmp_path, method):
    """The issue's acceptance command, as a user types it (a fresh process)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    done = subprocess.run([str(MEMSTEP), "compress", method, "--output", "out"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    one_line_refusal(done.returncode, done.stderr, "not empty", "--force")
    assert (out / "keep").read_text() == "mine" and listing(out) == {"keep": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial folder either


@pytest.mark.parametrize("method", ["laco", "sparse"])
def test_file_link_and_missing_parent_are_refused_before_any_model_loads(tmp_path, method, no_model_loads):
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"\x00user data")
    code, _, err = call(["compress", method, "--output", a_file])
    one_line_refusal(code, err, "is a file")
    assert a_file.read_bytes() == b"\x00user data"

    code, _, err = call(["compress", method, "--output", tmp_path / "missing" / "out"])
    one_line_refusal(code, err, "does not exist")
    assert not (tmp_path / "missing").exists()  # a missing parent is not created silently

    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    code, _, err = call(["compress", method, "--output", tmp_path / "link"])
    one_line_refusal(code, err, "symbolic link")

    code, _, err = call(["compress", method, "--force"])
    one_line_refusal(code, err, "--force needs --output")

    code, _, err = call(["compress", method, "--output", tmp_path / ("x" * 300)])
    one_line_refusal(code, err, "too long")


def test_home_folder_is_never_a_target(tmp_path, monkeypatch, no_model_loads):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("keep")
    monkeypatch.setenv("HOME", str(home))
    code, _, err = call(["compress", "laco", "--output", "~"])
    one_line_refusal(code, err, "not empty")
    assert (home / ".bashrc").read_text() == "keep"


def test_a_new_folder_is_staged_then_renamed_with_a_marker(tmp_path):
    out = tmp_path / "model"
    seen = {}

    class Spy(FakeModel):
        def save_pretrained(self, folder):
            seen["folder"] = Path(folder)
            assert not out.exists()  # nothing carries the name until the model is complete
            super().save_pretrained(folder)

    save_model(Spy(), FakeModel(("tokenizer.json",)), out, info={"method": "laco"})
    assert seen["folder"].parent == tmp_path and seen["folder"].name.endswith(PARTIAL_SUFFIX)
    assert not seen["folder"].exists()
    assert set(listing(out)) == {"config.json", "model.safetensors", "tokenizer.json", "memstep_compress.json", MARKER}
    assert json.loads((out / MARKER).read_text())["made_by"] == "memstep"
    assert oct(out.stat().st_mode & 0o777) == "0o755"


def test_an_empty_folder_is_filled_and_force_keeps_other_files(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    save_model(FakeModel(), FakeModel(("tokenizer.json",)), empty)
    assert set(listing(empty)) == {"config.json", "model.safetensors", "tokenizer.json"}  # no marker: not memstep's

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    (mine / "config.json").write_text("old")
    with pytest.raises(MemstepError, match="not empty"):
        save_model(FakeModel(), FakeModel(("tokenizer.json",)), mine)
    assert listing(mine) == {"config.json": b"old", "notes.txt": b"keep"}
    with forced(mine):  # the command line's --force
        save_model(FakeModel(), FakeModel(("tokenizer.json",)), mine)
    files = listing(mine)
    assert files["notes.txt"] == b"keep" and files["config.json"] == b"config.json"  # same name: replaced
    assert MARKER not in files and not [p for p in tmp_path.iterdir() if PARTIAL_SUFFIX in p.name]


@pytest.mark.parametrize("failure, words", [
    (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
    (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
    (Cancelled("stopped"), None),
])
def test_a_failure_midway_removes_only_the_temporary_folder(tmp_path, failure, words):
    (tmp_path / "sibling.txt").write_text("keep")
    before = listing(tmp_path)
    with pytest.raises(MemstepError if words else Cancelled) as caught:
        save_model(FakeModel(fail=failure), FakeModel(), tmp_path / "out")
    if words:
        assert words in str(caught.value) and "\n" not in str(caught.value)
    assert listing(tmp_path) == before  # no *.partial left, no output, the sibling untouched


def test_a_folder_that_appears_during_the_work_is_not_overwritten(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(MemstepError, match="not empty"):
        with staged_folder(out) as partial:
            (partial / "config.json").write_text("new")
            out.mkdir()
            (out / "theirs.txt").write_text("keep")
    assert listing(out) == {"theirs.txt": b"keep"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_unwritable_parent_is_refused_before_the_work(tmp_path, monkeypatch, no_model_loads):
    # os.access is what the check asks (as root every real folder is writable, so it is stubbed)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(MemstepError, match="permission denied"):
        check_output_folder(tmp_path / "out")
    code, _, err = call(["compress", "sparse", "--output", tmp_path / "out"])
    one_line_refusal(code, err, "permission denied")


def test_os_errors_on_the_way_are_one_line(tmp_path, monkeypatch):
    """The command line's safety net: an OSError or a decode error that escapes a command."""
    from memstep.cli import common

    for error, words in ((PermissionError(errno.EACCES, "Permission denied", "/srv/doc.txt"), "permission denied"),
                         (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
                         (OSError(errno.ENAMETOOLONG, "File name too long", "x" * 5000), "too long"),
                         (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not readable text")):
        def boom(error=error):
            raise error
        code, err = None, io.StringIO()
        with redirect_stderr(err):
            code = common.run_command(boom)
        one_line_refusal(code, err.getvalue(), words)
        assert len(err.getvalue()) < 1100


@pytest.mark.parametrize("verb", [["run", "DOC"], ["compress", "laco", "--calibration", "DOC"]])
def test_long_and_odd_file_names_are_one_line(tmp_path, verb, no_model_loads):
    for name in ("x" * 5000 + ".txt", "a\nb.txt", "nul\0.txt", str(tmp_path / ("y" * 300) / "doc.txt")):
        argv = [name if part == "DOC" else part for part in verb]
        code, _, err = call(argv)
        one_line_refusal(code, err)


def test_a_tilde_name_of_no_user_is_refused_in_one_line(tmp_path, monkeypatch):
    """'~0' names the home folder of a user '0': where there is none, pathlib raises a RuntimeError;
    memstep says so in one line instead (found by the file-name property test)."""
    from memstep.errors import MemstepError
    from memstep.outputs import check_new_file

    monkeypatch.chdir(tmp_path)
    with pytest.raises(MemstepError, match="no user 'nosuchuser0' on this machine"):
        check_new_file("~nosuchuser0/out.json")
