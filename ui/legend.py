"""What the retained-token views mean: the colours and the words, in one place.

The retained-token map (ui/figures.py), its colour bar and legend, the text view's legend
(ui/highlight.py), the Run tab's help ("How to read these views") and the README's legend
block are all built from the constants below, and tests/test_legend.py compares them, so a
colour and the word that names it cannot drift apart again.

    python -m ui.legend --readme README.md    # rewrite the README's legend block
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

# Colour-blind-safe roles: kept is blue (darker = more layer-head slots), evicted is orange,
# not read yet is a grey hatch (told apart by its pattern, not its colour).
UNREAD_FILL = "#f3f4f6"
UNREAD_HATCH = "#9ca3af"
EVICTED_MAP = "#f8c38a"  # the map's cells
EVICTED_TEXT = "#fde4cc"  # the text view's background: paler, so the words stay easy to read
# one slot .. all: a token kept by a few of the layer-head slots stays pale (at M = 128 of 2,270 tokens most
# tokens are kept by one slot or two, and a mid blue there read as "nearly everything kept")
KEPT_SCALE = [(0.0, "#d6e6fb"), (0.12, "#a9cbf5"), (0.4, "#4a8fe0"), (0.72, "#1d4ed8"), (1.0, "#172554")]
CHUNK_OUTLINE = "#f59e0b"
SINKS_MARK = "#c2410c"  # its name on the map: 5.2:1 on white
PASSKEY_MARK = "#dc2626"
ANSWER_MARK = "#059669"  # where the true answer sits in the document
MATCH_MARK = "#facc15"  # search matches in the text view


@dataclass(frozen=True)
class Entry:
    key: str
    look: str  # how it looks, in words ("orange")
    meaning: str  # what it means

    def sentence(self) -> str:
        return f"**{self.look}**: {self.meaning}"


UNREAD = Entry("unread", "grey hatching", "not read yet (the hatched area shrinks by one chunk per row)")
EVICTED = Entry("evicted", "orange", "read, then evicted from every layer and KV head")
KEPT = Entry("kept", "light to dark blue",
             "kept; pale blue by a single layer-head slot or a few, darker by more, navy by all of them")
CHUNK = Entry("chunk", "orange outline", "the chunk read in that step (on its row)")
SINKS = Entry("sinks", "orange tick", "the sink tokens above the map, always kept")
PASSKEY = Entry("passkey", "red tick and dotted line", "the hidden passkey")
ANSWER = Entry("answer", "green tick", "where the true answer sits in the document (an upload with no known "
               "answer: where the full cache's answer appears)")
ENTRIES = (UNREAD, EVICTED, KEPT, CHUNK, SINKS, PASSKEY, ANSWER)
# the text view: the same three states on the words
TEXT_ENTRIES = (
    Entry("unread", "grey italics", "not read yet"),
    Entry("evicted", "pale orange", "evicted from every layer-head slot"),
    Entry("kept", "blue shades", "kept; the darker, the more layer-head slots keep the token"),
)

# The colour bar of the map: what its ticks say
COLORBAR_TITLE = "kept by<br>layer-heads"
COLORBAR_TICKS = ((0.03, "one"), (0.5, "half"), (0.95, "all"))  # "all" just under the title
LEGEND_NAMES = {"unread": "not read yet", "evicted": "evicted everywhere"}


def map_colorscale() -> list[list]:
    """The map's colour scale over the kept fraction: exactly 0 is evicted (orange), anything
    above is blue from one slot to all of them."""
    return [[0.0, EVICTED_MAP], [0.001, EVICTED_MAP]] + [[max(0.001, p), c] for p, c in KEPT_SCALE]


def map_guide() -> str:
    """The help text's paragraph on the retained-token map (Markdown)."""
    items = "\n".join(f"- {entry.sentence()};" for entry in ENTRIES)
    return ("**Retained tokens.** One row per step (step 1 at the top), one column per token position "
            "(prompt head, then the document; long documents are binned). Every layer and KV head cuts its own "
            "cache, so a token can survive in some of these slots and not in others; the colour says how many "
            "keep it after that step:\n\n" + items.rstrip(";") + ".\n\nRead a column downwards to follow one "
            "token through the steps.")


def text_guide() -> str:
    """The help text's paragraph on the text view (Markdown)."""
    items = "; ".join(f"{e.look}: {e.meaning}" for e in TEXT_ENTRIES)
    return ("**Text.** The document shaded by the memory after the chosen step (" + items + "). The search box "
            "outlines every match and says how much of it the memory keeps.")


README_START, README_END = "<!-- legend:start -->", "<!-- legend:end -->"


def readme_block() -> str:
    return f"{README_START}\n{map_guide()}\n\n{text_guide()}\n{README_END}"


def write_readme(path: Path) -> bool:
    """Replace the README's legend block; False when it has none."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        return False
    path.write_text(pattern.sub(lambda _: readme_block(), text), encoding="utf-8")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="print or write the legend block of the README")
    parser.add_argument("--readme", type=Path, help="rewrite this README's legend block")
    args = parser.parse_args(argv)
    if args.readme is None:
        print(readme_block())
        return 0
    if not write_readme(args.readme):
        print(f"{args.readme} has no {README_START} ... {README_END} block")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
