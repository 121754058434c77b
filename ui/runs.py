"""Preparing and running a document for the app.

``prefill_stream`` is the one function that touches the accelerator. On Hugging Face
ZeroGPU ``@spaces.GPU`` runs it in a forked worker, so it yields plain data only (step
records hold numpy arrays) and every figure is built outside it. Elsewhere the decorator
is a no-op, and without the ``spaces`` package it is not used at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

import numpy as np

from memstep.documents import tokenize_prefix, truncation_notice
from memstep.errors import MemstepError
from memstep.generate import prompt_parts
from memstep.presets import AUTO, ATTENTIONS, ROPE_CHOICES, Fidelity, resolve_rope
from memstep.runner import DocumentRun
from memstep.schedules import GROWTHS, SCHEDULES, check_run_settings, check_steps
from memstep.scorers import SCORERS

from ui.documents import MAX_DOCUMENT_TOKENS, DocumentSource, needle_tokens, token_spans
from ui.inputs import choice, flag, valid_unicode, whole_number
from ui.jobs import MODEL_LOCK
from ui.reference import lookup, reference_key, store
from ui.models import get_model, normalize_spec

try:  # only on Hugging Face Spaces
    import spaces
except ImportError:
    spaces = None

GPU_SECONDS = int(os.environ.get("MEMSTEP_GPU_SECONDS", "120"))
DEFAULT_MAX_TOKENS = int(os.environ.get("MEMSTEP_MAX_TOKENS", "4096"))
RESERVED_TOKENS = 128  # room after the document for the question and the answer
MAX_NEW_TOKENS = 32
# A run holds the app's only run slot: at most this many steps (the schedule math allows
# memstep.schedules.MAX_STEPS). 256 steps = 4,096 tokens at the smallest chunk the page offers (16).
MAX_RUN_STEPS = int(os.environ.get("MEMSTEP_MAX_RUN_STEPS", "256"))
MAX_SINKS = 1024
MAX_TOKENS_LIMIT = 1 << 20  # the max tokens field; the model's context cuts it further


def gpu(fn):
    """``spaces.GPU`` where the package exists (a no-op outside ZeroGPU), else nothing."""
    return spaces.GPU(duration=GPU_SECONDS)(fn) if spaces is not None else fn


@dataclass(frozen=True)
class RunSettings:
    schedule: str = "imdc"
    chunk: int = 512
    memory: int = 512
    growth: str = "linear"
    scorer: str = "chunk-attention"
    sinks: int = 4
    rope: str = AUTO  # RoPE positions as asked: auto (the run picks), compact (the reference's), document or shared
    question_aware: bool = False  # the question's attention also scores every step
    attention: str = "sdpa"  # or padded: the reference code's (m + c)^2 maps
    fidelity: Fidelity = Fidelity()  # the reference switches (memstep.presets.SWITCHES)

    def positions(self) -> str:
        """The RoPE positions a run of these settings reads at, auto picked as for a document within
        the model's context (a run records what it used: RunView.label)."""
        return resolve_rope(self.rope, schedule=self.schedule, memory=self.memory, question_aware=self.question_aware,
                            ntk=self.fidelity.ntk)

    def label(self, positions: str | None = None) -> str:
        """``positions``: the RoPE positions the run used, where known."""
        if self.schedule == "full":
            return "FULL"
        growth = f" {self.growth}" if self.schedule in ("im", "imdc") and self.growth != "linear" else ""
        scorer = f" · {self.scorer}" if self.scorer != "chunk-attention" else ""
        positions = positions or self.positions()
        rope = f" · {positions} positions" if positions != "compact" else ""
        aware = " · question-aware" if self.question_aware else ""
        ways = " · as the reference" if self.fidelity.changed() or self.attention != "sdpa" else ""
        return f"{self.schedule.upper()}{growth} c{self.chunk} M{self.memory}{scorer}{rope}{aware}{ways}"

    def run_kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def settings_from(schedule, chunk, memory, growth, scorer, sinks, rope=AUTO, question_aware=False,
                  attention="sdpa", fidelity: dict | None = None) -> RunSettings:
    """Settings from the page's controls or an API call, each checked with a one-line reason;
    ``fidelity``: the reference switches by name (memstep.presets.SWITCHES), empty ones ignored."""
    question_aware = flag(question_aware, "question_aware")
    name = choice(schedule, "schedule", [s for s in SCHEDULES if s != "custom"], "imdc")
    return RunSettings(name, whole_number(chunk, "chunk size", 1), whole_number(memory, "memory size", 0),
                       choice(growth, "growth", GROWTHS, "linear"),
                       choice(scorer, "scorer", list(SCORERS), "chunk-attention"),
                       whole_number(sinks, "sinks", 0, MAX_SINKS), choice(rope, "RoPE positions", ROPE_CHOICES, AUTO),
                       question_aware and name != "full", choice(attention, "attention", ATTENTIONS, "sdpa"),
                       Fidelity.from_settings({k: (v.strip().lower() or None) if isinstance(v, str) else v
                                               for k, v in (fidelity or {}).items()}))


def check_settings(settings: RunSettings, tokens: int, run: bool = True) -> None:
    """The checks DocumentRun makes on construction, for the preview (no model needed).
    ``tokens`` counts the prompt head and the document, as the run does. A run in the app
    also keeps to MAX_RUN_STEPS (it holds the only run slot); ``run=False``: schedule math only."""
    check_run_settings(settings.schedule, tokens, settings.chunk, settings.memory, settings.sinks)
    if run and settings.schedule != "full":
        check_steps(tokens, settings.chunk, MAX_RUN_STEPS)


@dataclass
class PreparedDocument:
    """A document's tokens as a run will prefill them, cut to the limits."""

    source: DocumentSource
    ids: list[int]
    spans: np.ndarray  # (tokens, 2): character [start, end) of each token in source.text
    prefix_tokens: int  # the chat template's head, prefilled before the document
    needle: tuple[int, int] | None  # needle tokens [start, end) in document positions
    notices: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens the run prefills: prompt head + document."""
        return self.prefix_tokens + len(self.ids)


def compact_positions(settings: RunSettings | None, context: int) -> bool:
    """Whether a run's keys stay inside the model's context whatever the document's length: compact
    positions under an evicting schedule reach sinks + M + c (and the question after them); auto
    reads a document longer than the context at compact positions."""
    return (settings is not None and settings.rope in ("compact", AUTO) and settings.schedule != "full"
            and settings.sinks + settings.memory + settings.chunk + RESERVED_TOKENS <= context)


def document_limit(max_tokens: int | None, context: int, prefix_tokens: int,
                   settings: RunSettings | None = None) -> tuple[int, str]:
    """How many document tokens a run takes, and which limit sets it: the max tokens setting, else
    the model's context, or (compact positions, see compact_positions) MAX_DOCUMENT_TOKENS."""
    if compact_positions(settings, context):
        room, reason = MAX_DOCUMENT_TOKENS - prefix_tokens, f"the app's {MAX_DOCUMENT_TOKENS:,}-token document limit"
    else:
        room, reason = context - prefix_tokens - RESERVED_TOKENS, f"the model's {context:,}-token context"
    if max_tokens is not None:
        max_tokens = whole_number(max_tokens, "max tokens", 1, MAX_TOKENS_LIMIT)
    if max_tokens is not None and max_tokens <= room:
        return int(max_tokens), "the max tokens setting"
    return room, reason


def reference_fits(tokens: int, context: int) -> bool:
    """Whether a full-cache reference run of ``tokens`` stays inside the model's context (with room
    for the question and the answer): a whole book does not, and would cost a quadratic prefill."""
    return tokens + RESERVED_TOKENS <= context


def prepare(source: DocumentSource, tokenizer, max_tokens: int | None, context: int,
            settings: RunSettings | None = None) -> PreparedDocument:
    """Tokenize ``source`` and cut it to ``max_tokens`` and the model's context (not the context
    when ``settings`` keep positions compact), with a notice."""
    prefix = len(prompt_parts(tokenizer).head)
    limit, reason = document_limit(max_tokens, context, prefix, settings)
    ids, cut = tokenize_prefix(source.text, tokenizer, limit)  # never the whole of a huge text
    if not ids:
        raise MemstepError("The document has no tokens. Pick a document with some text in it.")
    notices = [truncation_notice(source.text, tokenizer, ids, reason)] if cut else []
    spans = token_spans(source.text, tokenizer, ids)
    needle = needle_tokens(spans, source.needle_chars)
    if source.needle_chars is not None and needle is None:
        notices.append("The passkey sentence was cut off by the truncation: raise max tokens to include it.")
    return PreparedDocument(source, ids, spans, prefix, needle, notices)


@gpu
def prefill_stream(model_spec: str, ids: list[int], settings: RunSettings, question: str | None,
                   full_reference: bool = False, notices: list[str] | None = None,
                   cache_reference: bool = False, session: str | None = None) -> Iterator[tuple]:
    """Run the prefill and yield, as plain data: ("schedule", Schedule), one ("step",
    StepRecord) per step, ("result", RunResult) once the answer is in, then, when asked
    and there is a question, ("full", RunResult) of the same document with the full cache.
    ``model_spec`` as the request gave it (a compressed model's token loads for ``session``)."""
    valid_unicode(question, "question")  # the page's events come here too, not only /prefill
    lm = get_model(model_spec, session)
    run = DocumentRun(lm, ids, question=question, max_new_tokens=MAX_NEW_TOKENS, notices=notices,
                      **settings.run_kwargs())
    # A stopped run finishes its current step in its worker thread while its hooks are still
    # on the model: the next run waits for that, so two runs never hook the same layers.
    if not MODEL_LOCK.acquire(timeout=GPU_SECONDS):
        raise MemstepError("the model is still busy with a stopped run: try again in a moment")
    try:
        yield "schedule", run.schedule
        for record in run:
            yield "step", record
        yield "result", run.result
        if full_reference and run.question:
            yield "full", _reference(lm, normalize_spec(model_spec, session), ids, settings, run.question,
                                     cache_reference)
    finally:
        MODEL_LOCK.release()


def _reference(lm, model_spec: str, ids: list[int], settings: RunSettings, question: str, cached: bool):
    """The same document prefilled with the full cache, answered; for a bundled example
    (``cached``) computed once and then read back (ui/reference.py)."""
    key = reference_key(f"{model_spec}|{settings.rope}", question, ids) if cached else None
    hit = lookup(key) if key else None
    full = DocumentRun(lm, ids, schedule="full", sinks=settings.sinks, question=question,
                       max_new_tokens=MAX_NEW_TOKENS, rope=settings.rope)
    if hit is not None:
        full.result.answer, full.result.seconds = hit["answer"], hit["seconds"]
        full.result.notices.append("reference answer computed once for this example and cached")
        return full.result
    result = full.run()
    if key:
        store(key, result.answer or "", result.seconds)
    return result
