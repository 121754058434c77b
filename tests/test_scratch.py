"""Scratch folders a killed process cannot leave behind (a Ray cell's reference, a local Ray's
folder): the next folder of the same prefix removes every one whose owner is gone."""

import signal
import subprocess
import sys
from pathlib import Path

from memstep.evaluation.ray_worker import CELL_PREFIX
from memstep.evaluation.scratch import locked_folder

HOLD = ("import sys, pathlib; from memstep.evaluation.scratch import locked_folder\n"
        "with locked_folder(pathlib.Path(sys.argv[1]), sys.argv[2]) as folder:\n"
        "    (folder / 'reference.npy').write_bytes(b'x')\n"
        "    print(folder, flush=True); sys.stdin.read()\n")


def owner(root, prefix=CELL_PREFIX) -> tuple[subprocess.Popen, str]:
    """A process inside a scratch folder of its own, until its input closes."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(root), prefix], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def test_a_killed_owners_folder_goes_with_the_next_one(tmp_path):
    killed, killed_folder = owner(tmp_path)
    live, live_folder = owner(tmp_path)
    old = tmp_path / f"{CELL_PREFIX}abc123"  # what a version without the lock left: an empty folder
    old.mkdir()
    other = tmp_path / "someone-elses"
    other.mkdir()
    try:
        killed.kill()
        assert killed.wait(timeout=60) == -signal.SIGKILL
        assert (Path(killed_folder)).exists()  # kill -9: no clean-up of its own ran
        with locked_folder(tmp_path, CELL_PREFIX) as folder:
            assert folder.name.startswith(CELL_PREFIX) and folder.is_dir()
            assert not (Path(killed_folder)).exists() and not old.exists()
            assert (Path(live_folder)).exists() and other.exists()  # a live owner's, and not ours
        assert not folder.exists()
    finally:
        live.communicate("")
    assert live.returncode == 0 and not (Path(live_folder)).exists()  # its owner removed it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["someone-elses"]


def test_a_named_folder_replaces_an_unlocked_one_of_its_name(tmp_path):
    stale = tmp_path / "memstep-ray-41"
    (stale / "session").mkdir(parents=True)
    with locked_folder(tmp_path, "memstep-ray-", "41") as folder:
        assert folder == stale and not (folder / "session").exists()
    assert list(tmp_path.iterdir()) == []
