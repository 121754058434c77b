"""Publishing a model folder leaves nothing behind after any kind of stop (issue 61): a temporary
folder whose process is gone (kill -9) is removed by the next command that looks into its parent,
whatever its age; --force replaces a folder in three renames and an interruption at any point
leaves the user's folder as it was; a publish removes the files of the model format it replaces
and keeps every other file; a file that appears between the no-overwrite check and the rename is
not replaced."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memstep import outputs
from memstep.errors import MemstepError
from memstep.outputs import (MARKER, PARTIAL_MARKER, PARTIAL_SUFFIX, REPLACED, check_output_folder, model_file,
                             staged_folder, sweep_partials, write_new_file)
from tests.test_outputs import FakeModel, listing
from tests.test_compress_sparse import tokenizer  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if PARTIAL_SUFFIX in p.name)


def users_folder(parent: Path) -> Path:
    """A folder of the user's: an old sharded model, its notes, a subfolder, a link."""
    out = parent / "out"
    out.mkdir()
    (out / "config.json").write_text("old config")
    (out / "model.safetensors.index.json").write_text("old index")
    (out / "model-00001-of-00002.safetensors").write_text("old shard 1")
    (out / "model-00002-of-00002.safetensors").write_text("old shard 2")
    (out / "notes.txt").write_text("keep")
    (out / "runs").mkdir()
    (out / "runs" / "log.txt").write_text("keep too")
    (out / "link").symlink_to("notes.txt")
    return out


# ---- --force: three renames ------------------------------------------------------------------------

def test_force_replaces_the_model_format_and_keeps_every_other_file(tmp_path):
    out = users_folder(tmp_path)
    notes_inode = (out / "notes.txt").stat().st_ino
    with staged_folder(out, force=True) as partial:
        FakeModel(("config.json", "model.safetensors")).save_pretrained(partial)
    files = listing(out)
    assert set(files) == {"config.json", "model.safetensors", "notes.txt", "runs", "runs/log.txt", "link"}
    assert files["config.json"] == b"config.json" and files["runs/log.txt"] == b"keep too"
    assert (out / "link").is_symlink() and os.readlink(out / "link") == "notes.txt"
    assert (out / "notes.txt").stat().st_ino == notes_inode  # carried by a hard link, not copied
    assert MARKER not in files and leftovers(tmp_path) == []  # the user's folder: not marked as memstep's


def test_model_files_are_those_of_a_saved_models_format():
    for name in ("config.json", "model.safetensors", "model-00003-of-00010.safetensors", "pytorch_model.bin",
                 "model.safetensors.index.json", "pytorch_model.bin.index.json", "tokenizer.json", "merges.txt",
                 "generation_config.json", "memstep_compress.json"):
        assert model_file(name), name
    for name in ("notes.txt", "adapter_model.safetensors", "README.md", "config.json.bak", MARKER):
        assert not model_file(name), name


@pytest.mark.parametrize("where", ["the first rename", "the second rename"])
def test_a_failure_between_the_renames_leaves_the_old_folder_as_it_was(tmp_path, monkeypatch, where):
    out = users_folder(tmp_path)
    before = listing(out)
    rename = os.rename

    def failing(src, dst):
        if where == "the first rename" and Path(dst).name == REPLACED:
            raise OSError(errno.EACCES, "Permission denied")
        return rename(src, dst)

    def second(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "rename", failing)
    if where == "the second rename":
        monkeypatch.setattr(outputs, "_rename", second)
    with pytest.raises(MemstepError) as err:
        with staged_folder(out, force=True) as partial:
            FakeModel(("config.json", "model.safetensors")).save_pretrained(partial)
    assert "\n" not in str(err.value)
    assert listing(out) == before and leftovers(tmp_path) == []


KILLED_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    from memstep import outputs

    def killed(src, dst):  # the process ends here, between the two renames, as kill -9 ends it
        os.kill(os.getpid(), signal.SIGKILL)

    outputs._rename = killed
    with outputs.staged_folder(sys.argv[1], force=True) as partial:
        (partial / "config.json").write_text("new")
        (partial / "model.safetensors").write_text("new weights")
""")


def test_a_publish_killed_between_its_renames_is_put_back_by_the_next_command(tmp_path):
    out = users_folder(tmp_path)
    before = listing(out)
    child = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(out)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert not out.exists() and len(leftovers(tmp_path)) == 1  # the old folder sits inside the temporary one
    check_output_folder(tmp_path / "other")  # the next command that looks into the parent
    assert listing(out) == before and leftovers(tmp_path) == []


def test_a_sibling_memstep_cannot_read_does_not_stop_the_sweep(tmp_path, monkeypatch):
    (tmp_path / "locked").mkdir()
    stat = Path.stat

    def unreadable(self, *args, **kwargs):
        if self.parent.name == "locked":
            raise PermissionError(13, "Permission denied")
        return stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", unreadable)  # (as root every folder is readable: stubbed)
    assert sweep_partials(tmp_path) == []
    assert check_output_folder(tmp_path / "out") == tmp_path / "out"


def test_a_publish_killed_after_its_renames_is_finished_by_the_next_command(tmp_path):
    out = tmp_path / "out"
    (out / REPLACED).mkdir(parents=True)  # the old folder, still inside the new one
    (out / REPLACED / "model.safetensors").write_text("old")
    (out / "model.safetensors").write_text("new")
    (out / PARTIAL_MARKER).write_text(json.dumps({"made_by": "memstep", "created": time.time(), "locked": True,
                                                  "target": "out"}))  # its lock free: its process is gone
    assert sweep_partials(tmp_path) == ["out"]
    assert listing(out) == {"model.safetensors": b"new"}


def test_a_folder_taken_meanwhile_keeps_the_users_old_folder_whole(tmp_path, monkeypatch):
    """Another program makes the folder's name between the two renames: memstep cannot put the old
    folder back under its name, so it keeps it whole (never removed) and says where."""
    out = users_folder(tmp_path)
    before = listing(out)

    def taken(src, dst):
        Path(dst).mkdir()
        (Path(dst) / "theirs.txt").write_text("theirs")
        raise OSError(errno.ENOTEMPTY, "Directory not empty")

    monkeypatch.setattr(outputs, "_rename", taken)
    with pytest.raises(MemstepError, match="your old folder is kept whole"):
        with staged_folder(out, force=True) as partial:
            (partial / "config.json").write_text("new")
    kept = [p / REPLACED for p in tmp_path.iterdir() if PARTIAL_SUFFIX in p.name]
    assert len(kept) == 1 and listing(kept[0]) == before
    (out / "theirs.txt").unlink()
    out.rmdir()  # the name is free again: the next sweep puts the old folder back
    sweep_partials(tmp_path)
    assert listing(out) == before and leftovers(tmp_path) == []


# ---- kill -9 during a real save, then the next command --------------------------------------------

SLOW_SAVE = textwrap.dedent("""
    import sys, time
    import transformers

    save = transformers.PreTrainedModel.save_pretrained

    def slow(self, folder, *args, **kwargs):  # the save in progress when kill -9 comes
        save(self, folder, *args, **kwargs)
        print("saving", flush=True)
        time.sleep(600)

    transformers.PreTrainedModel.save_pretrained = slow
    from memstep.cli import main
    sys.exit(main(sys.argv[1:]))
""")
SPARSE = ["compress", "sparse", "--method", "magnitude", "--reconstruct", "none", "--samples", "2", "--seq-len", "16",
          "--held-out-samples", "1", "--quiet"]


def test_kill_9_during_a_save_then_the_next_save_leaves_no_partial_folder(tmp_path, tokenizer):
    """The issue's acceptance: kill -9 during `compress sparse --output X`, then `compress sparse
    --output Y` in the same parent: no temporary folder is left, X was never published, Y is."""
    from conftest import make_tiny_model

    source = tmp_path / "tiny"
    make_tiny_model("llama", layers=2, vocab_size=len(tokenizer)).save_pretrained(source)
    tokenizer.save_pretrained(source)
    parent = tmp_path / "models"
    parent.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, *SPARSE, "--model", str(source),
                              "--output", str(parent / "X")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "saving"
        assert len(leftovers(parent)) == 1  # the model's files are in the temporary folder
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        child.kill()
    assert leftovers(parent) and not (parent / "X").exists()
    done = subprocess.run([sys.executable, "-m", "memstep", *SPARSE, "--model", str(source), "--output",
                           str(parent / "Y")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in parent.iterdir()) == ["Y"]  # no partial folder, no X
    assert (parent / "Y" / "config.json").is_file() and (parent / "Y" / MARKER).is_file()


# ---- a file that appears between the check and the rename ----------------------------------------

@pytest.mark.parametrize("links", [True, False], ids=["hard links", "no hard links"])
def test_a_file_appearing_before_the_rename_is_not_replaced(tmp_path, monkeypatch, links):
    target = tmp_path / "result.json"
    new_partial = outputs._new_partial

    def late_file(parent, name):  # after memstep's check, before its rename: someone writes the file
        made = new_partial(parent, name)
        target.write_text("theirs")
        return made

    monkeypatch.setattr(outputs, "_new_partial", late_file)
    if not links:
        def no_links(*args, **kwargs):
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(outputs.os, "link", no_links)
    with pytest.raises(MemstepError, match="exists"):
        write_new_file(target, "memstep's")
    assert target.read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_killed_file_write_leaves_a_partial_the_next_command_removes(tmp_path):
    code = textwrap.dedent("""
        import os, signal, sys
        from memstep import outputs

        outputs._link_new = lambda temporary, target: os.kill(os.getpid(), signal.SIGKILL)
        outputs.write_new_file(sys.argv[1], "text")
    """)
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out.json")],
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert child.returncode == -signal.SIGKILL and len(leftovers(tmp_path)) == 1
    write_new_file(tmp_path / "out.json", "text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
