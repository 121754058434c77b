"""Write a benchmark's Markdown table into its block of docs/benchmarks.md, dated, so every
table there is produced by its script:

    <!-- bench-app:start -->
    ...the table, the date and the command that produced it...
    <!-- bench-app:end -->
"""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def write_block(name: str, markdown: str, command: str, doc: Path = DOC, when: datetime.date | None = None,
                measured: str | None = None) -> None:
    """Replace the block ``name`` of ``doc`` with ``markdown`` and a line saying when and how it
    was made (``measured``: the date of the measurements when the table is rendered from an
    earlier run's JSON); raises when the block is missing (nothing else in the file changes)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = doc.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc} has no {start} ... {end} block")
    day = (when or datetime.date.today()).isoformat()
    made = f"*Produced by `{command}` on {day}" + (f" from the measurements of {measured}" if measured else "") + ".*"
    block = f"{start}\n{markdown.strip()}\n\n{made}\n{end}"
    doc.write_text(pattern.sub(lambda _: block, text), encoding="utf-8")


def committed_on(path: Path) -> str | None:
    """The date (YYYY-MM-DD) of the last commit of ``path``, or None outside git."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None
