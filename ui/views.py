"""What the Run tab shows for a run at a given step: figures, key numbers, text, answers.

``RunView`` holds everything one run produced (plain data, kept in the session's state),
and ``render`` turns it into the page's views at any step, so streaming and the replay
slider draw the same things.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace

import numpy as np

from memstep.memory import format_bytes
from memstep.records import RunResult, StepRecord
from memstep.schedules import Schedule

from ui.figures import (layer_memory_figure, memory_figure, placeholder_figure, retained_map_figure, schedule_figure,
                        seconds_figure)
from ui import explain
from ui.explain import answer_markdown, passkey_story  # noqa: F401 - the answer box, re-exported for the tab
from ui.highlight import Mark, highlight_html
from ui.identity import document_label
from ui.outcome import MAX_MATCHES, answer_spans, answers_differ, history, search_spans, token_range
from ui.runs import PreparedDocument, RunSettings
from ui.summary import needle_kept, stat_cards


@dataclass
class RunView:
    document: PreparedDocument
    settings: RunSettings
    schedule: Schedule
    records: list[StepRecord] = field(default_factory=list)
    result: RunResult | None = None
    full: RunResult | None = None
    seconds: float = 0.0  # wall-clock since Run, model load and answer included
    stopped: bool = False
    wants_reference: bool = False  # a full-cache reference answer follows the run
    cpu_seconds: list[float] = field(default_factory=list)  # this process's CPU time per step (CPU runs)
    cpu_measured: bool = False  # whether cpu_seconds are the run's own work (a CPU run in this process)
    now: str = ""  # what is happening right now, with an estimate ("step 2 of 3 · about 6 s left")
    load_note: str | None = None  # set when the machine runs more work than it has cores
    planned_seconds: float | None = None  # the planner's prediction of the prefill's seconds (CPU runs)
    question: str = ""  # the question as Run sent it ('' : none asked)
    model_name: str = ""  # the model as the page names it (ui/identity.model_name)
    model_words: str = ""  # "the 135M model (SmolLM2-135M-Instruct)": what explanations call it
    named_model: bool = False  # the run card and the answer name the model (not the default one)

    def label(self, with_model: bool = False) -> str:
        """The run's settings in a line, with the RoPE positions it used (auto picks them per run);
        ``with_model``: and the model, where it is not the default one (a compressed model, say)."""
        label = self.settings.label(self.result.rope if self.result is not None else None)
        return label + (f" · {self.model_name}" if with_model and self.named_model and self.model_name else "")

    def document_label(self) -> str:
        """The run's document: its name and id (ui/identity.py)."""
        return document_label(self.document.source)

    @property
    def asked(self) -> bool:
        """Whether the run was asked a question (Run's question box, or the answer's record)."""
        return bool((self.question or (self.result.question if self.result else "") or "").strip())

    @property
    def answer_chars(self) -> list[tuple[int, int]]:
        """Where the map and the text mark the answer (characters, in the part of the document the
        run read): the true answer where it is known (ui/truths.py); else where the full cache's
        answer (a reference) appears, once it is in and differs from the compressed memory's."""
        read = int(self.document.spans[-1][1]) if len(self.document.spans) else 0
        if explain.truth(self) is not None:
            if explain.truth(self).kind == "passkey":  # the passkey's own outline and tick mark it
                return []
            chars = explain.truth_chars(self)
            return [chars] if chars is not None and chars[1] <= read else []
        if self.full is None or self.result is None or not answers_differ(self.result.answer, self.full.answer):
            return []
        return [s for s in answer_spans(self.full.answer, self.result.question, self.document.source.text)
                if s[1] <= read]

    def input_range(self, chars: tuple[int, int]) -> tuple[int, int] | None:
        """Input positions (prompt head included) of the tokens over ``chars``."""
        found = token_range(self.document.spans, chars)
        prefix = self.document.prefix_tokens
        return None if found is None else (prefix + found[0], prefix + found[1])

    @property
    def suggests_question_aware(self) -> bool:
        """A question-aware run is the next thing to try (ui/explain.py says when)."""
        return explain.suggests_question_aware(self)

    @property
    def steps(self) -> int:
        return self.schedule.steps

    @property
    def needle(self) -> tuple[int, int] | None:
        """The passkey's tokens in input positions (prompt head included)."""
        needle, prefix = self.document.needle, self.document.prefix_tokens
        return None if needle is None else (prefix + needle[0], prefix + needle[1])

    @property
    def passkey(self) -> str | None:
        """The hidden passkey, when the run's (possibly truncated) document still holds it."""
        return self.document.source.passkey if self.document.needle is not None else None

    @property
    def passkey_positions(self) -> tuple[int, int] | None:
        """The passkey's own digits in input positions (what a search for them finds), inside the
        needle sentence; the run card and the passkey's story measure these."""
        source = self.document.source
        if self.passkey is None or source.needle_chars is None:
            return None
        start, end = source.needle_chars
        at = source.text.find(str(self.passkey), start, end)
        return self.needle if at < 0 else self.input_range((at, at + len(str(self.passkey))))

    @property
    def finished(self) -> bool:
        """The run, its answer and (when asked) the reference answer are all in."""
        return self.result is not None and (self.full is not None or not self.reference_pending)

    @property
    def reference_pending(self) -> bool:
        return self.wants_reference and bool(self.result and self.result.question) and self.full is None


def compact(record: StepRecord) -> StepRecord:
    """The record with its kept positions in the smallest integer type that holds them: a
    session keeps every step of its run for replay (30 layers x 3 heads x 516 entries take
    370 KB as int64, 93 KB as uint16)."""
    dtype = np.uint16 if record.tokens_seen <= np.iinfo(np.uint16).max else np.uint32
    return replace(record, kept_positions=record.kept_positions.astype(dtype, copy=False))


@dataclass
class Rendered:
    sizes: object
    retained: object
    memory: object
    seconds: object
    text: str
    layers: object = None  # memory per layer (layer-wise budgets only)


def render(view: RunView, step: int | None = None, query: str = "") -> Rendered:
    """The views as they were after ``step`` (0-based; -1: before the first; None: the
    latest step run), the text view with the matches of ``query`` outlined."""
    records = view.records if step is None else view.records[: step + 1]
    current = records[-1].step if records else None
    replaying = step is not None and step < len(view.records) - 1
    highlight = current if (replaying or len(records) < view.steps) else None
    sizes = schedule_figure(view.schedule, view.settings.sinks, done=len(records), current=highlight)
    if records:
        # a stopped run's map shows what was read: its steps and positions, not the unread rest
        partial = view.stopped and step is None and len(records) < view.steps
        tokens, steps = (records[-1].tokens_seen, len(records)) if partial else (view.schedule.tokens, view.steps)
        answers = [r for r in map(view.input_range, view.answer_chars[:5]) if r and r[0] < tokens]
        needle = view.needle if view.needle is None or view.needle[0] < tokens else None
        retained = retained_map_figure(records, tokens, steps, prefix_tokens=view.document.prefix_tokens,
                                       sinks=view.settings.sinks, needle=needle, current=current,
                                       stopped_of=view.steps if partial else None, answers=answers,
                                       words=lambda width, columns: column_words(view.document, width, columns),
                                       document=f"document #{view.document.source.doc_id}")
    else:
        retained = placeholder_figure("Stopped before the first step ended: nothing was kept to show" if view.stopped
                                      else "The retained-token map fills in as the steps run",
                                      "Retained tokens: what memory holds after each step", 340)
    hybrid = bool(records and records[-1].layer_types)
    layers = layer_memory_figure(records[-1] if records else None, view.settings.sinks) \
        if view.schedule.layerwise or hybrid else None
    cpu = view.cpu_seconds[: len(records)] if view.cpu_measured else None
    return Rendered(sizes, retained, memory_figure(records, view.steps),
                    seconds_figure(records, view.steps, cpu=cpu, note=view.load_note),
                    text_view(view, records[-1] if records else None, query, records), layers)


WORDS_CHARS = 90  # text shown per map column under the pointer
NEIGHBOURS = 4  # tokens either side of a one-token column's token


def column_words(doc: PreparedDocument, width: int, columns: int) -> list[str]:
    """The text under each column of the retained-token map: a one-token column's token in
    ⟦brackets⟧ with its neighbours, a wider column's tokens (cut to WORDS_CHARS); the prompt's
    head, which is no part of the document, by name."""
    spans = np.asarray(doc.spans).reshape(-1, 2)
    text, prefix, count = doc.source.text, doc.prefix_tokens, len(spans)
    out = []
    for column in range(columns):
        first, last = column * width - prefix, (column + 1) * width - prefix  # document tokens [first, last)
        if last <= 0:
            out.append("the prompt's head (chat template, before the document)")
            continue
        first, last = max(first, 0), min(last, count)
        if first >= count:
            out.append("")
            continue
        if width == 1:
            lo, hi = max(0, first - NEIGHBOURS), min(count, first + NEIGHBOURS + 1)
            start, end = int(spans[first][0]), int(spans[first][1])
            words = (text[int(spans[lo][0]):start] + "⟦" + text[start:end] + "⟧"
                     + text[end:int(spans[hi - 1][1])])
        else:
            words = text[int(spans[first][0]):int(spans[last - 1][1])]
        words = " ".join(words.split())
        out.append(words if len(words) <= WORDS_CHARS else words[:WORDS_CHARS - 1] + "…")
    return out


def text_view(view: RunView, record: StepRecord | None, query: str = "",
              records: list[StepRecord] | None = None) -> str:
    """The document with the memory after ``record``'s step highlighted; the full cache's
    answer and the matches of ``query`` outlined, with what the memory keeps of each match."""
    doc = view.document
    count = len(doc.ids)
    fractions = np.full(count, np.nan)
    if record is not None:
        kept = record.global_kept_fraction()[doc.prefix_tokens:]
        fractions[: len(kept)] = kept[:count]
        which = f"{len(record.global_layers)} global layers" if record.layer_types \
            else f"{record.kept_positions.shape[0]} layers"
        caption = (f"{view.document_label()}, memory after step {record.step + 1} of {view.steps} "
                   f"({view.label()}): shade = fraction of the "
                   f"{which} × {record.kept_positions.shape[1]} KV heads that keep the token"
                   + (" (sliding layers keep their window)" if record.layer_types else "")
                   + "; grey text is not read yet.")
    else:
        caption = f"{view.document_label()}: not run yet."
    if doc.notices:
        caption += " " + " ".join(doc.notices)
    marks = [Mark(s, e, "answer", f"memstep-answer-{i}") for i, (s, e) in enumerate(view.answer_chars)]
    links = ""
    if view.answer_chars:
        links += (' <a href="#memstep-answer-0">Show the true answer in the text.</a>' if explain.truth(view) is not None
                  else ' <a href="#memstep-answer-0">Show the full cache\'s answer (a reference) in the text.</a>')
    matches = search_spans(query, doc.source.text)
    if query and query.strip():
        marks += [Mark(s, e, "match", f"memstep-match-{i}") for i, (s, e) in enumerate(matches)]
        links += search_summary(view, query, matches, view.records if records is None else records)
    text, spans, needle = doc.source.text, np.asarray(doc.spans).reshape(-1, 2), doc.source.needle_chars
    first = 0
    if count > TEXT_VIEW_TOKENS:  # a whole book: the tokens around the latest step, never the whole text
        read = record.tokens_seen - doc.prefix_tokens if record is not None else 0
        first, last = text_window(count, read)
        base = int(spans[first][0])
        text = text[base:int(spans[last - 1][1])]
        spans = spans[first:last] - base
        fractions = fractions[first:last]
        inside = lambda a, b: a >= base and b <= base + len(text)  # noqa: E731
        needle = (needle[0] - base, needle[1] - base) if needle and inside(*needle) else None
        marks = [Mark(m.start - base, m.end - base, m.kind, m.anchor) for m in marks if inside(m.start, m.end)]
        caption += (f" Showing document tokens {first + 1:,}-{last:,} of {count:,}: the text view holds at most "
                    f"{TEXT_VIEW_TOKENS:,} tokens, the last read; the map above covers the whole document.")
    return highlight_html(text, np.asarray(spans).tolist(), fractions, needle, caption, marks=marks, links=links,
                          first_token=first)


TEXT_VIEW_TOKENS = 6000  # tokens the text view shows at once (a 156k-token novel would be megabytes of HTML)


def text_window(count: int, read: int, size: int = TEXT_VIEW_TOKENS) -> tuple[int, int]:
    """Document tokens [first, last) the text view shows: ``size`` of them, ending where the reading
    got to (the newest memory and the chunk just read), or the start before the first step."""
    last = min(count, max(read, size))
    return max(0, last - size), last


def search_summary(view: RunView, query: str, matches: list[tuple[int, int]], records: list[StepRecord]) -> str:
    """The search's result line (HTML): how many matches, what the memory did with them, and a
    link to each labelled with its share of layer-head slots (or the step that evicted it)."""
    read_chars = int(view.document.spans[-1][1]) if len(view.document.spans) else 0
    query = html.escape(query.strip())
    if not matches:
        return f'<div class="memstep-search-result">No match for “{query}”.</div>'
    links, gone, kept, unread = [], [], [], 0
    for i, chars in enumerate(matches):
        positions = view.input_range(chars) if chars[1] <= read_chars else None
        h = history(records, *positions) if positions else None
        if h is None or h.read is None:
            unread += 1
            label = "not read"
        elif h.left is not None:
            gone.append(h.left)
            label = f"evicted in step {h.left}"
        else:
            kept.append(h.kept or 0.0)
            label = f"{h.kept:.0%}"
        if i < 20:
            links.append(f'<a href="#memstep-match-{i}">{i + 1}</a> ({label})')
    after = f"after step {records[-1].step + 1} of {view.steps}" if records else "before the first step"
    parts = []
    if kept:
        slots = "global layer-head" if records and records[-1].layer_types else "layer-head"
        low, high = f"{min(kept):.0%}", f"{max(kept):.0%}"
        share = low if low == high else f"{low}-{high}"  # one number when the matches round alike
        parts.append(f"{len(kept)} still in memory (kept by {share} of the {slots} slots)")
    if gone:
        parts.append(f"{len(gone)} evicted from every slot (the first in step {min(gone)})")
    if unread:
        parts.append(f"{unread} not read")
    count = f"{len(matches)}{'+' if len(matches) >= MAX_MATCHES else ''}"
    return (f'<div class="memstep-search-result"><b>{count} match{"es" * (len(matches) != 1)}</b> for “{query}” '
            f'{after}: {"; ".join(parts)}. Jump to ' + " · ".join(links) + ".</div>")


def stats_html(view: RunView, step: int | None = None) -> str:
    """Key numbers of the run after ``step`` (None: the latest)."""
    records = view.records if step is None else view.records[: step + 1]
    last = records[-1] if records else None
    measured = max((r.bytes_measured for r in records if r.bytes_measured is not None), default=None)
    modeled = max((r.bytes_modeled for r in records), default=None)
    seconds = sum(r.seconds for r in records)
    if view.stopped:
        state = "stopped"
    elif view.result is not None and view.reference_pending:
        state = "reference run"
    elif view.finished and (step is None or step == len(view.records) - 1):
        state = "done"
    elif step is not None and view.finished:
        state = "replay"
    else:
        state = "running"
    items = [
        ("state", "run", f"{state} · {view.label(with_model=True)}"),
        ("document", "document", view.document_label()),
        ("steps", "step", f"{len(records)} / {view.steps}"),
        ("tokens", "tokens read", f"{last.tokens_seen if last else 0:,} / {view.schedule.tokens:,}"),
        ("memory", "memory kept", _memory_kept(last)),
        ("seconds", "prefill seconds", f"{seconds:.1f} s" + (f" · CPU {sum(view.cpu_seconds[:len(records)]):.1f} s"
                                                             if view.cpu_measured and records else "")
         + (f" · planned {_planned(view.planned_seconds)}" if view.planned_seconds else "")),
        ("modeled", "peak modeled", format_bytes(modeled) if modeled is not None else "—"),
        ("measured", "peak measured", format_bytes(measured) if measured is not None else "n/a on this device"),
    ]
    kept = needle_kept(last, view.passkey_positions) if last is not None else None
    if view.passkey_positions is not None:
        slots = "global-layer slots" if last is not None and last.layer_types else "slots"
        items.append(("passkey", "passkey in memory", f"{kept:.0%} of {slots}" if kept is not None else "not read yet"))
    now = "" if state in ("replay", "done") else view.now
    if state == "stopped":  # what the run was doing, and its estimate of time left, no longer hold
        now = (f"stopped after step {len(view.records)} of {view.steps}: the steps so far stay for replay"
               if view.records else f"stopped before step 1 of {view.steps} ended: nothing was read into memory")
    return stat_cards(items, None if state == "replay" else len(records) / max(view.steps, 1),
                      summary=charts_text(view, records), now=now)


def _planned(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.1f} s" if seconds >= 0.1 else "under 0.1 s"


def charts_text(view: RunView, records: list[StepRecord]) -> str:
    """The charts in words (their text alternative): sizes per step, memory kept, the passkey."""
    if not records:
        return f"{view.label()}: {view.steps} steps planned over {view.schedule.tokens:,} tokens."
    last = records[-1]
    chunks = ", ".join(f"{r.chunk_size:,}" for r in records[:24])
    kept = ", ".join(f"{max(r.layer_entries[i] for i in r.global_layers):,}" for r in records[:24])
    which = "global layer" if last.layer_types else "layer"
    text = (f"{view.label()}, after step {last.step + 1} of {view.steps}: chunks read {chunks}; memory kept "
            f"per {which} after each step {kept}; peak modeled {format_bytes(max(r.bytes_modeled for r in records))}.")
    story = passkey_story(view, records)
    return text + (" " + story.replace("**", "") if story else "")


def _memory_kept(record: StepRecord | None) -> str:
    if record is None:
        return "—"
    entries = record.layer_entries
    if record.layer_types:  # hybrid: the schedule binds the global layers; sliding ones keep their window
        kept = [entries[i] for i in record.global_layers]
        window = max((n for n, kind in zip(entries, record.layer_types) if kind == "sliding"), default=0)
        spread = f"{kept[0]:,}" if min(kept) == max(kept) else f"{min(kept):,}–{max(kept):,}"
        return f"{spread} global · {window:,} sliding (window)"
    if min(entries) == max(entries):
        return f"{entries[0]:,} per layer"
    return f"{min(entries):,}–{max(entries):,} per layer"
