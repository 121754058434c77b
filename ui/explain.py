"""The answer box of a run: both answers, their verdicts against the true answer, and why they
differ, in words checked against what is known.

Where the document's answer is known (every bundled example, any passkey document) both
answers are compared with it, and the explanation follows the true answer through the memory:
where it sits in the text, which step read it, what the memory kept of it. When the full cache
is wrong too, that comes first: the model does not find it even with the whole document, and
the memory's cuts (the scorer) are not blamed for it. Without a known answer (an upload) the
full cache's answer is a reference, not the truth, and the explanation follows it instead.

Pure functions of a RunView (ui/views.py), no Gradio.
"""

from __future__ import annotations

import html

from ui.outcome import answers_differ, describe_history, history, token_range
from ui.summary import needle_kept, passkey_verdict

EXCERPT_CHARS = 90  # the evidence quoted in the explanation

NO_REFERENCE_HINT = ("*No full-cache answer to compare with: tick **Also answer from the full cache** (under "
                     "Advanced) and run again to see what the whole document answers and, where they differ, "
                     "which step evicted it.*")

QUESTION_AWARE_HINT = ("**Why it can miss.** The scorer keeps what the document's own chunks attend to, and the "
                       "question is not read until the end: under a small memory a small model loses what only the "
                       "question would have voted for. **Try question-aware** (the button below) to let the question "
                       "vote at every step.")

NO_QUESTION = ("*No question was asked: this run shows what the memory keeps (the map and the text below). Type a "
               "question and run again to also see the answer from the compressed memory.*")


def truth(view):
    """The document's known answer (ui/truths.py), or None (an upload without a passkey)."""
    return getattr(view.document.source, "truth", None)


def read_chars(view) -> int:
    """Characters of the document the run read (the rest was cut by max tokens or the context)."""
    return int(view.document.spans[-1][1]) if len(view.document.spans) else 0


def truth_chars(view) -> tuple[int, int] | None:
    """Where the true answer's words sit in the document (characters), whether read or not."""
    known = truth(view)
    return None if known is None else known.answer_chars(view.document.source.text)


def truth_positions(view) -> tuple[int, int] | None:
    """The true answer's tokens in input positions, when the run read them."""
    return document_truth_positions(view.document)


def document_truth_positions(document) -> tuple[int, int] | None:
    """The true answer's tokens in input positions (prompt head included) of a prepared document,
    when the part a run reads holds them; None otherwise or when no answer is known."""
    known = getattr(document.source, "truth", None)
    chars = None if known is None else known.answer_chars(document.source.text)
    read = int(document.spans[-1][1]) if len(document.spans) else 0
    if chars is None or chars[1] > read:
        return None
    found = token_range(document.spans, chars)
    return None if found is None else (document.prefix_tokens + found[0], document.prefix_tokens + found[1])


def compressed_right(view) -> bool | None:
    known = truth(view)
    if known is None or view.result is None:
        return None
    return known.holds(view.result.answer)


def full_right(view) -> bool | None:
    known = truth(view)
    if known is None or view.full is None:
        return None
    return known.holds(view.full.answer)


def suggests_question_aware(view) -> bool:
    """A question-aware run is the next thing to try: the compressed memory missed what the full
    cache found (never when the full cache misses it too: the model, not the scorer, fails then),
    or lost the passkey; the question did not vote already."""
    if view.result is None or not view.result.question or view.settings.question_aware \
            or view.settings.schedule == "full":
        return False
    if truth(view) is not None:
        if compressed_right(view) or full_right(view) is False or truth_positions(view) is None:
            return False
        return True
    return view.full is not None and answers_differ(view.result.answer, view.full.answer)


def _said(answer: str | None) -> str:
    """An answer on one line (a model's blank lines would break the box's Markdown), escaped."""
    return html.escape(" ".join((answer or "").split()))


def _verdict(answer: str | None, view) -> str:
    known = truth(view)
    if known is None:
        return ""
    if known.kind == "passkey":
        return f" &nbsp; passkey {known.shown}: **{passkey_verdict(answer, known.shown)}**"
    return f" &nbsp; **{'✓ right' if known.holds(answer) else '✗ wrong'}**"


def answer_markdown(view) -> str:
    """The answer box (Markdown)."""
    if view is None:
        return "*Run a document with a question to see the answer from the compressed memory.*"
    if not view.asked:
        return "*Stopped.* " + NO_QUESTION if view.stopped else NO_QUESTION
    if view.result is None:
        return "*The answer appears when the prefill is done.*" if not view.stopped else "*Stopped before the answer.*"
    known = truth(view)
    question = view.result.question
    lines = [f"**Question:** {html.escape(question)} &nbsp;·&nbsp; *{html.escape(view.document_label())}*"]
    if known is not None and known.kind != "passkey":
        lines[-1] += f"  \n**True answer:** {html.escape(known.shown)}"
    lines += ["", f"**From the compressed memory ({html.escape(view.label(with_model=True))}):** "
                  f"{_said(view.result.answer)}{_verdict(view.result.answer, view)}"]
    full_name = "From the full cache" + ("" if known is not None else " (a reference, not the truth)")
    if view.reference_pending:
        lines += ["", f"**{full_name}:** *prefilling the whole document with nothing evicted…*"
                  if not view.stopped else "*Stopped before the reference answer.*"]
    if view.full is not None:
        lines += ["", f"**{full_name}:** {_said(view.full.answer)}{_verdict(view.full.answer, view)}"]
    story = answer_story(view)
    if story:
        lines += ["", story]
    elif view.full is None and not view.wants_reference and not view.stopped and known is None:
        lines += ["", NO_REFERENCE_HINT]
    if suggests_question_aware(view) and not view.reference_pending:
        lines += ["", QUESTION_AWARE_HINT]
    notices = view.result.notices or []
    if notices:
        lines += ["", "*" + " ".join(html.escape(n) for n in notices) + "*"]
    return "\n".join(lines)


def answer_story(view) -> str | None:
    """Why the answers are what they are (Markdown), or None when there is nothing to explain yet."""
    if view.result is None or not view.result.question or view.reference_pending:
        return None
    if truth(view) is None:
        return reference_story(view)
    first = truth_story(view)
    where = passkey_story(view) if truth(view).kind == "passkey" else whereabouts(view)
    return "\n\n".join(part for part in (first, where) if part)


def truth_story(view) -> str | None:
    """The first words: how the two answers stand against the true answer. The full cache's
    failure comes first when it fails: the model does not find the answer even with nothing
    evicted, so no memory schedule or scorer is blamed for it."""
    known, compressed, full = truth(view), compressed_right(view), full_right(view)
    shown = f"“{html.escape(known.shown)}”"
    model = html.escape(getattr(view, "model_words", "") or "the model")
    if full is False:
        blame = (f"{model[0].upper()}{model[1:]} does not find it even with the whole document, so the memory's cuts "
                 "are not what fails here")
        if compressed:
            return (f"**The full cache is wrong; the compressed memory is right.** The true answer is {shown}: {blame}, "
                    "and the compressed memory's answer names it all the same.")
        return f"**Neither answer is right: the full cache is wrong too.** The true answer is {shown}. {blame}."
    if full is True and not compressed:
        return (f"**Why the answers differ.** The full cache is right ({shown}) and the compressed memory is not: "
                "the memory lost what the whole document holds.")
    if full is True and compressed:
        return f"**Both answers are right** ({shown})."
    if compressed is False:
        return f"**The compressed memory's answer is wrong** (the true answer is {shown})."
    return f"**The compressed memory's answer is right** ({shown})."


def whereabouts(view) -> str | None:
    """Where the true answer sits in the text and what the memory kept of it."""
    known, chars = truth(view), truth_chars(view)
    text = view.document.source.text
    if chars is None:
        return None
    passage = known.evidence_chars(text) or chars
    quote = " ".join(text[passage[0]:passage[1]].split())
    if len(quote) > EXCERPT_CHARS:
        quote = quote[:EXCERPT_CHARS - 1] + "…"
    at = f"{chars[0] / max(len(text), 1):.0%} into the document (“{html.escape(quote)}”)"
    positions = truth_positions(view)
    if positions is None:
        return (f"**Where it sits.** {at}: beyond the part of the document this run read, so no memory could hold "
                "it. Raise **Max tokens** (under Advanced) to include it.")
    return f"**Where it sits.** {at}: it was {describe_history(history(view.records, *positions), view.steps)}."


def reference_story(view) -> str | None:
    """Without a known answer: where the full cache's answer (a reference, not the truth) sits in
    the document, which step read it and which evicted it, when the two answers differ."""
    if view.full is None or not answers_differ(view.result.answer, view.full.answer):
        return None
    chars = view.answer_chars
    head = "**Why the answers differ.** This document has no known answer: the full cache's answer is a reference, not the truth. "
    if not chars:
        return head + ("Its answer does not appear word for word in the document, so the page cannot point at the "
                       "tokens it came from.")
    positions = [p for p in map(view.input_range, chars) if p]
    histories = [history(view.records, *p) for p in positions]
    where = view.document.source.text
    first = chars[0][0] / max(len(where), 1)
    quoted = html.escape(where[chars[0][0]:chars[0][1]])
    if len(histories) == 1:
        return (f"{head}The full cache answered from “{quoted}” ({first:.0%} into the document): it was "
                f"{describe_history(histories[0], view.steps)}.")
    gone = [h for h in histories if h.left is not None]
    kept = [h.kept or 0.0 for h in histories]
    detail = (f"{len(gone)} of them left the memory (the first in step {min(h.left for h in gone)})"
              if gone else "none left the memory entirely")
    return (f"{head}The full cache's answer “{quoted}” appears {len(histories)} times in the document (first at "
            f"{first:.0%}); {detail}, and after the last step the memory keeps {max(kept):.0%} of the layer-head "
            "slots of the best-kept one.")


def passkey_story(view, records=None) -> str | None:
    """One line on what happened to the passkey's digits: the step that read them, and the step
    in which they left the memory (no layer-head slot kept any of their tokens), or that they
    stayed (the share the run card and the search show for them)."""
    digits = view.passkey_positions
    if digits is None or view.passkey is None:
        return None
    records = view.records if records is None else records
    shares = [(r.step + 1, needle_kept(r, digits)) for r in records]
    read = next((step for step, kept in shares if kept is not None), None)
    if read is None:
        return None
    gone = next((step for step, kept in shares if kept is not None and kept == 0), None)
    where = f"The passkey ({view.passkey}) was read in step {read} of {view.steps}"
    if gone is not None:
        return (f"**What happened to the passkey.** {where} and **left the memory in step {gone}**: after it, no "
                "layer or KV head kept any of its tokens, so the compressed memory cannot know the number.")
    last = shares[-1][1]
    slots = "global layer-head" if records[-1].layer_types else "layer-head"  # hybrid: sliding layers keep a window
    if view.schedule.name == "full" or last >= 0.999:
        return f"**What happened to the passkey.** {where} and stayed: every {slots} slot still holds it."
    return (f"**What happened to the passkey.** {where} and stayed, faintly: {last:.0%} of the {slots} slots "
            "still hold its tokens after the last step.")
