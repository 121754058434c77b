"""Write a benchmark's Markdown table into its block of docs/benchmarks.md, dated, so every
table there is produced by its script:

    <!-- bench-app:start -->
    ...the table, the date and the command that produced it...
    <!-- bench-app:end -->
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
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


def save_or_render(args, measure, table, script: str, argv, doc: Path = DOC) -> str:
    """A trace script's last part: unless ``args.render``, ``measure(args)`` and save it as ``args.output``
    (JSON); then print ``table`` of the saved measurements and, with ``args.block``, write it into that
    block of ``doc`` with the command that made it (``script`` and ``argv``, default the command line)."""
    if not args.render:
        saved = measure(args)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(saved, indent=1))
    text = table(json.loads(args.output.read_text()))
    print(text)
    if args.block:
        words = argv if argv is not None else sys.argv[1:]
        write_block(args.block, text, f"python benchmarks/{script} " + " ".join(words), doc=doc)
    return text


def committed_on(path: Path) -> str | None:
    """The date (YYYY-MM-DD) of the last commit of ``path``, or None outside git."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None
