"""The README speaks to a newcomer: what memstep is first, the two set-up commands near the
top, no development bookkeeping, and every picture and local link it shows exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _body() -> list[str]:
    """The README's lines after the Spaces front matter (which must come first on a Space)."""
    lines = README.splitlines()
    assert lines[0] == "---", "the Hugging Face Spaces front matter must open the file"
    end = lines.index("---", 1)
    assert any(line.startswith("sdk: gradio") for line in lines[:end]) and "app_file: app.py" in lines[:end]
    return lines[end + 1:]


def test_what_memstep_is_comes_first_then_the_two_commands():
    body = _body()
    first_heading = next(i for i, line in enumerate(body) if line.startswith("# "))
    demo = next(i for i, line in enumerate(body) if line.startswith("make demo"))
    test = next(i for i, line in enumerate(body) if line.startswith("make test"))
    prose = " ".join(body[first_heading:demo])
    assert "chunk by chunk" in prose and "memory" in prose and "![" in prose  # the why, and a picture
    assert first_heading < demo < test < 45, (demo, test)


def test_no_development_bookkeeping():
    for pattern in (r"\bissue \d+", r"\(issue", r"\bGoal \d\b", r"\bNOT met\b", r"this session", r"was lent",
                    r"were available to"):
        assert not re.search(pattern, README, re.I), pattern


def test_every_local_picture_and_link_exists():
    targets = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)|<img src=\"([^\"]+)\"|\]\(((?:docs|assets|results)/[^)#\s]*)",
                         README)
    paths = {p for group in targets for p in group if p and not p.startswith("http")}
    assert paths and all((ROOT / p).exists() for p in paths), sorted(p for p in paths if not (ROOT / p).exists())
