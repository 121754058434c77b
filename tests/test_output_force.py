"""--force and the output marker. The marker says "memstep made this folder" (the app's store
deletes only folders that carry it), so a folder that someone else made while memstep worked
never gets one, even when --force lets memstep's files into it. And --force names its folder
as the user typed it: "~/models/x" is the same folder as its expanded path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memstep import outputs
from memstep.errors import MemstepError
from memstep.outputs import MARKER, PARTIAL_SUFFIX, check_output_folder, forced, staged_folder


def files_of(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir()}


def test_a_folder_made_during_the_work_gets_no_marker_under_force(tmp_path):
    out = tmp_path / "out"
    with staged_folder(out, info={"method": "laco"}, force=True) as partial:
        (partial / "config.json").write_text("new")
        out.mkdir()  # someone makes the folder while memstep works
        (out / "theirs.txt").write_text("keep")
    assert files_of(out) == {"theirs.txt": "keep", "config.json": "new"}
    assert not [p for p in tmp_path.iterdir() if PARTIAL_SUFFIX in p.name]


def test_a_folder_made_just_before_the_rename_gets_no_marker_under_force(tmp_path, monkeypatch):
    """The folder appears between memstep's look and its rename: the rename fails (not empty)
    and memstep's files are moved in one by one, without the marker it had written."""
    out = tmp_path / "out"
    rename, made = os.rename, []

    def late_folder(src, dst):
        if Path(dst) == out and not out.exists() and not made:
            made.append(out)
            out.mkdir()
            (out / "theirs.txt").write_text("keep")
        return rename(src, dst)

    monkeypatch.setattr(outputs.os, "rename", late_folder)
    with staged_folder(out, info={"method": "laco"}, force=True) as partial:
        (partial / "config.json").write_text("new")
    assert files_of(out) == {"theirs.txt": "keep", "config.json": "new"}
    assert MARKER not in files_of(out)
    # a folder memstep makes itself still carries the marker
    with staged_folder(tmp_path / "fresh", force=True) as partial:
        (partial / "config.json").write_text("new")
    assert MARKER in files_of(tmp_path / "fresh")


def test_force_keys_expand_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "models" / "mine"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("keep")
    with pytest.raises(MemstepError, match="not empty"):
        check_output_folder(folder)
    for given, checked in (("~/models/mine", folder), (folder, "~/models/mine"), ("~/models/mine", "~/models/mine")):
        with forced(given):
            assert check_output_folder(checked) == Path(checked).expanduser()
    with forced("~/models/other"), pytest.raises(MemstepError, match="not empty"):
        check_output_folder(folder)  # --force names one folder, not every folder
