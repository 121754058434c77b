"""The true answers of the bundled examples, and whether an answer holds one.

An explanation of a run is checked against the known answer, never against the full cache's
answer alone: on the prose examples the 135M model answers wrongly even with the whole
document. Each example ships the words that count as right and the passage of the text that
gives them (where the true answer sits); a passkey document's truth is its passkey and the
needle sentence, whether bundled or uploaded. An upload without either has no known answer:
the full cache's answer is then only a reference.

Pure: text and regular expressions, no Gradio, no tokenizer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TrueAnswer:
    """``accepted``: the forms that make an answer right (any one, as whole words, case aside);
    ``evidence``: the words of the document that give it (whitespace-insensitive), the passage
    the explanation points at; ``kind``: "passkey" (digits, matched exactly) or "words"."""

    accepted: tuple[str, ...]
    evidence: str
    kind: str = "words"

    @property
    def shown(self) -> str:
        """The answer as the page names it."""
        return self.accepted[0]

    def holds(self, answer: str | None) -> bool:
        """Whether ``answer`` states the true answer."""
        answer = answer or ""
        if self.kind == "passkey":  # memstep.passkey.answer_contains_passkey's rule: the exact digits
            return any(re.search(rf"(?<![0-9]){re.escape(a)}(?![0-9])", answer) for a in self.accepted)
        return any(re.search(rf"(?<![\w]){re.escape(a)}(?![\w])", answer, re.I) for a in self.accepted)

    def evidence_chars(self, text: str) -> tuple[int, int] | None:
        """[start, end) of the evidence passage in ``text``; None when the text lacks it (a cut)."""
        pattern = r"\s+".join(re.escape(part) for part in self.evidence.split())
        match = re.search(pattern, text)
        return (match.start(), match.end()) if match else None

    def answer_chars(self, text: str) -> tuple[int, int] | None:
        """[start, end) of the true answer's own words inside the evidence passage (the passkey's
        digits, "Baronetage"); the passage itself where it does not name them."""
        passage = self.evidence_chars(text)
        if passage is None:
            return None
        inside = text[passage[0]:passage[1]]
        for form in self.accepted:
            found = re.search(rf"(?<![\w]){re.escape(form)}(?![\w])", inside, re.I)
            if found:
                return passage[0] + found.start(), passage[0] + found.end()
        return passage


def passkey_truth(passkey: str, needle_sentence: str) -> TrueAnswer:
    return TrueAnswer((str(passkey),), needle_sentence, kind="passkey")


# Example name (ui/documents.EXAMPLES) -> its true answer; the passkey examples' truths come from
# their passkeys (ui/documents.py builds them with the document).
EXAMPLE_TRUTHS = {
    "Pride and Prejudice, chapters 1-2 (2.3k tokens)": TrueAnswer(
        ("Bingley",), 'What is his name?" "Bingley."'),
    "Persuasion, chapter 1 (3.4k tokens)": TrueAnswer(
        ("Baronetage", "the Baronetage"), "never took up any book but the Baronetage"),
    "Pride and Prejudice, chapters 1-12 (23k tokens)": TrueAnswer(
        ("Bingley",), "Between him and Darcy there was a very steady friendship"),
    "Pride and Prejudice, the whole novel (156k tokens)": TrueAnswer(
        ("Darcy", "Fitzwilliam Darcy"), "visited Mrs. Bingley, and talked of Mrs. Darcy"),
}


def verdict(answer: str | None, truth: TrueAnswer | None) -> str:
    """'✓ right' / '✗ wrong' against the true answer; '' when none is known."""
    if truth is None or answer is None:
        return ""
    return "✓ right" if truth.holds(answer) else "✗ wrong"
