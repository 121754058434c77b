"""The resumable result store: one JSON line per finished cell in ``cells.jsonl``.

Appending a line per cell means an interrupted run loses at most the cell in flight, and
a rerun skips every key already present. ``summary.json`` beside it is rebuilt from the
cells after each run. Cells written by an older memstep are read in today's form
(``grid.upgrade_cell``), under their own keys.
"""

from __future__ import annotations

import json
from pathlib import Path

from memstep.errors import MemstepError
from memstep.evaluation.grid import upgrade_cell

CELLS = "cells.jsonl"
SUMMARY = "summary.json"
FAILURES = "failures.jsonl"  # a configuration that could not run a case: its reason, one line each


class ResultStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MemstepError(f"cannot create the output folder {self.folder}: {err.strerror}") from err
        self.path = self.folder / CELLS
        self._cells = {cell["key"]: cell for cell in self._read()}

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        cells = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                cell = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interrupted run: that cell simply runs again
            if isinstance(cell, dict) and "key" in cell:
                cells.append(upgrade_cell(cell))
        return cells

    def __contains__(self, key: str) -> bool:
        return key in self._cells

    def __len__(self) -> int:
        return len(self._cells)

    def cells(self) -> list[dict]:
        return list(self._cells.values())

    def add(self, cell: dict) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(cell, sort_keys=True) + "\n")
        self._cells[cell["key"]] = cell

    def add_failure(self, label: str, length: int, message: str) -> None:
        """Record why ``label`` failed at ``length`` (a press that does not run on a model)."""
        with (self.folder / FAILURES).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"label": label, "length": length, "message": message}, sort_keys=True) + "\n")

    def failures(self) -> list[dict]:
        """The recorded failures, one per (configuration, length, reason), with how many cases hit each."""
        path = self.folder / FAILURES
        found: dict[tuple, dict] = {}
        for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            key = (item["label"], item["length"], item["message"])
            found.setdefault(key, {**item, "cases": 0})["cases"] += 1
        return list(found.values())

    def write_summary(self, summary: dict) -> Path:
        path = self.folder / SUMMARY
        path.write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return path


def load_summary(folder: str | Path) -> dict | None:
    """The summary of a results folder, or None when it has none yet; MemstepError (one line) when
    its summary.json is not a summary memstep can read."""
    path = Path(folder) / SUMMARY
    if not path.is_file() and not path.is_symlink():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as err:
        summary = err
    if not isinstance(summary, dict):
        reason = "not JSON" if isinstance(summary, (ValueError, UnicodeError)) else (
            "unreadable" if isinstance(summary, OSError) else "not a JSON object")
        raise MemstepError(f"{folder}: its {SUMMARY} is not a summary memstep can read ({reason}); memstep eval "
                           "never replaces a file it cannot read, even with --force: move it away, or give "
                           "another --output folder")
    return summary
