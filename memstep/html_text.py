"""An HTML page's visible text, read under a WorkBudget (memstep.read_budget).

Python's HTMLParser streams the page (no tree is built, so neither nesting depth nor tag count
costs more than one pass). What it spends is charged before it spends it: each piece fed is
counted for its '<' (a tag, or a lone '<' the parser hands over as text one at a time) and its
'&' (an entity to decode); each tag's attributes are charged as it arrives. A tag or comment
still open after ``max_pending_chars`` is refused (the parser would scan it again with every
piece), and so is a script or style over ``max_raw_chars``.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from memstep.cancel import checkpoint
from memstep.errors import MemstepError
from memstep.read_budget import ReadLimits, WorkBudget

# Block-level HTML elements end a line; inline ones (b, a, span...) do not.
_HTML_BLOCKS = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
                "blockquote", "section", "article", "header", "footer", "title", "dt", "dd")
_HTML_PARAGRAPHS = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "title")
_HTML_HIDDEN = ("script", "style", "noscript", "template")
WHAT = "parsing steps (HTML tags, attributes, entities and '<')"


class _VisibleText(HTMLParser):
    """An HTML page's visible text, as its tags stream past (no tree is built, so neither
    nesting depth nor tag count costs more than one pass): scripts and styles dropped, the text
    of each string with its whitespace collapsed (except inside <pre>), a line break after each
    block element and a blank line after each paragraph."""

    def __init__(self, budget: WorkBudget):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.chars = self.hidden = self.pre = 0
        self.budget = budget
        self._pending: list[str] = []  # one string's pieces (a feed may split it)

    def _flush(self) -> None:
        if self._pending:
            piece = "".join(self._pending)
            self._pending = []
            self._add(piece if self.pre else re.sub(r"\s+", " ", piece), counted=True)

    def _add(self, piece: str, counted: bool = False) -> None:
        self.parts.append(piece)
        self.chars += len(piece)
        if not counted:  # (a string's text counts as it arrives: handle_data)
            self.budget.add_text(len(piece))

    def _count_tag(self, attrs) -> None:
        self._flush()
        self.budget.spend(len(attrs))  # (the tag itself was charged with its '<')

    def handle_starttag(self, tag, attrs):
        self._count_tag(attrs)
        if tag in _HTML_HIDDEN:
            self.hidden += 1  # (script and style: the parser reads their raw text up to the end tag)
        elif tag == "pre":
            self.pre += 1
        elif tag == "br":  # a void element: its line break comes now
            self._add("\n")

    def handle_startendtag(self, tag, attrs):
        self._count_tag(attrs)
        if tag in _HTML_BLOCKS:
            self._add("\n\n" if tag in _HTML_PARAGRAPHS else "\n")

    def handle_endtag(self, tag):
        if tag in _HTML_HIDDEN:
            self._pending = []
            self.hidden = max(0, self.hidden - 1)
            return
        self._flush()
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in _HTML_BLOCKS and tag != "br":
            self._add("\n\n" if tag in _HTML_PARAGRAPHS else "\n")

    def handle_data(self, data):
        if not self.hidden:
            self._pending.append(data)
            if data != "<":  # a lone '<' the parser hands over one at a time: work, not text it counts
                self.budget.add_text(len(data))

    def text(self) -> str:
        self._flush()
        return "".join(self.parts)


_HTML_FEED_CHARS = 1 << 16


def html_text(html: str, filename: str, limits: ReadLimits, budget: WorkBudget) -> str:
    """Visible text of an HTML page (see _VisibleText), read a piece at a time until the text
    holds ``max_chars``, within the budget's work (see the module's notes)."""
    parser = _VisibleText(budget)
    for start in range(0, len(html), _HTML_FEED_CHARS):
        checkpoint()
        piece = html[start:start + _HTML_FEED_CHARS]
        budget.spend(piece.count("<") + piece.count("&"))
        parser.feed(piece)
        budget.check_cpu()
        pending = len(parser.rawdata)  # what the parser holds to scan again with the next piece
        if parser.cdata_elem is None and parser.rawdata.startswith("<") and pending > limits.max_pending_chars:
            raise MemstepError(f"{filename}: a tag or comment is still open after {pending:,} characters, over the "
                               f"{limits.max_pending_chars:,} one may hold (the tag-length limit): upload an excerpt "
                               "or a .txt version")
        if pending > limits.max_raw_chars:
            raise MemstepError(f"{filename}: a <{parser.cdata_elem}> element runs over {limits.max_raw_chars:,} "
                               "characters (the script-length limit): upload an excerpt or a .txt version")
        if limits.max_chars is not None and parser.chars >= limits.max_chars:
            break  # the run cannot use more
    else:
        parser.close()
    return "\n".join(line.strip() for line in parser.text().splitlines())
