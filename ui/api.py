"""Named API endpoints for gradio_client: ``/prefill`` (a whole run, streamed) and
``/schedule`` (the schedule math). They share the Run tab's code and queue."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import gradio as gr
from gradio.data_classes import FileData

from memstep.errors import MemstepError
from memstep.passkey import answer_contains_passkey
from memstep.presets import PRESETS, check_reference_run, preset_settings
from memstep.schedules import LAYERWISE, MAX_SIZE_TOKENS, make_schedule

from ui.documents import (EXAMPLES, MAX_UPLOAD_BYTES, DocumentSource, example, read_upload, uploaded_path,
                          with_needle)
from ui.inputs import choice, flag, number, text, valid_unicode
from ui.jobs import session_of
from ui.models import context_tokens, get_model
from ui.runs import (DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT, check_settings, prefill_stream, prepare, reference_fits,
                     settings_from)
from ui.summary import needle_kept


SCHEDULE_CONCURRENCY = 4
MAX_QUESTION_CHARS = 2000
MAX_LAYERS = 1024  # /schedule's layers (the layer-wise growths): far beyond any model
# A layer-wise schedule holds a budget per step and layer, and its reply lists them all: the work
# and the reply grow with steps x layers. 2^18 cells: a reply of ~2 MB in well under a second
# (docs/hardening.md); the largest page setting (256 steps x 30 layers) is 7,680.
MAX_SCHEDULE_CELLS = 1 << 18


def check_schedule_work(settings, tokens: int, layers: int) -> None:
    """Refuse, before any of it is done, a schedule whose steps x layers exceed MAX_SCHEDULE_CELLS."""
    steps = 1 if settings.schedule == "full" else -(-tokens // settings.chunk)
    cells = steps * (layers if settings.growth in LAYERWISE else 1)
    if cells > MAX_SCHEDULE_CELLS:
        raise MemstepError(f"this schedule has {steps:,} steps x {layers:,} layers = {cells:,} per-layer budgets, "
                           f"over the {MAX_SCHEDULE_CELLS:,} one request may compute: use fewer layers, fewer "
                           "steps (a larger chunk) or a growth that is not layer-wise")


def _document(document_text, file: FileData | dict | None, example_name, tokenizer=None) -> DocumentSource | None:
    """The document a call names (a bundled example needs the model's ``tokenizer``: without it,
    None, once the name is checked). Pasted text is taken like an upload: the same size limit,
    and only the prefix a run can use is ever tokenized (ui/runs.prepare)."""
    document_text = text(document_text, "document_text", 1 << 62)
    if len(document_text) > MAX_UPLOAD_BYTES:  # the uploads' limit; every character is at least a byte
        raise MemstepError(f"document_text has {len(document_text):,} characters, over the {MAX_UPLOAD_BYTES:,} "
                           f"a document may have (the {MAX_UPLOAD_BYTES / 2**20:g} MiB upload limit)")
    example_name = text(example_name, "example_name", 200)
    if file is not None and not isinstance(file, (dict, FileData)):
        raise MemstepError("document_file must be a file: use gradio_client's handle_file(path)")
    given = [bool(document_text.strip()), file is not None, bool(example_name)]
    if sum(given) != 1:
        raise MemstepError("give exactly one document: document_text, document_file or example_name "
                           f"(one of: {', '.join(EXAMPLES)})")
    if file is not None:
        return read_upload(uploaded_path(file))
    if example_name:
        if example_name not in EXAMPLES:
            raise MemstepError(f"unknown example '{example_name[:80]}': choose one of {', '.join(EXAMPLES)}")
        return None if tokenizer is None else example(example_name, tokenizer)
    return with_needle("text", document_text)


def prefill(document_text: str = "", document_file: FileData | None = None, example_name: str = "",
            schedule: str = "imdc", chunk: int = 512, memory: int = 512, growth: str = "linear",
            scorer: str = "chunk-attention", sinks: int = 4, question: str = "",
            max_tokens: int = DEFAULT_MAX_TOKENS, model: str = "", full_reference: bool = False,
            rope: str = "auto", preset: str = "", question_aware: bool = False, attention: str = "sdpa",
            sink_scoring: str = "", growth_rounding: str = "", gqa_grouping: str = "", score_rows: str = "",
            question_place: str = "", ntk: str = "", request: gr.Request = None) -> Iterator[dict]:
    """Prefill a document chunk by chunk under a memory schedule (full, fm, im, imdc).

    Give the document as text, as a file (.txt, .md, .pdf, .html) or as the name of a
    bundled example. Streams {"event": "step", ...} per step (sizes, seconds, bytes) and
    ends with {"event": "result", ...}: the settings, every step, the fraction of
    layer-head slots keeping each position, the answer to the question from the
    compressed memory and, for passkey documents, whether the passkey survived. An empty
    question asks the document's own question (bundled examples, passkey documents).
    ``rope``: auto (memstep's default: shared positions for a question-aware memory on a document
    within the model's context, else compact), compact
    (contiguous positions, the reference code's), document (true positions) or shared (one
    position per kept token in every head); the result's ``rope`` says which ran. ``preset``
    "reference" runs as the reference code (scorer conv, compact positions, 4 sinks, padded
    attention and every switch below at the reference's value);
    ``question_aware`` also scores every step by the question's attention (needs a question).
    As the reference code, one at a time (empty: memstep's default): ``attention`` sdpa or padded,
    ``sink_scoring`` strip or pool, ``growth_rounding`` divide-first or multiply-first,
    ``gqa_grouping`` model or strided, ``score_rows`` chunk or last-c, ``question_place`` after or
    prompt, ``ntk`` none or dynamic."""
    session = session_of(request)
    try:
        for name, value in dict(document_text=document_text, example_name=example_name, schedule=schedule,
                                growth=growth, scorer=scorer, question=question, model=model, rope=rope,
                                preset=preset, attention=attention, sink_scoring=sink_scoring,
                                growth_rounding=growth_rounding, gqa_grouping=gqa_grouping, score_rows=score_rows,
                                question_place=question_place, ntk=ntk).items():
            valid_unicode(value, name)  # every text field: one line for a lone surrogate
        # strict types first: a number is a number, a yes/no is true or false (bool is bool)
        for value, name in ((chunk, "chunk size"), (memory, "memory size"), (sinks, "sinks")):
            number(value, name, 0, MAX_SIZE_TOKENS)
        if max_tokens is not None:
            number(max_tokens, "max_tokens", 1, MAX_TOKENS_LIMIT)
        full_reference = flag(full_reference, "full_reference")
        question = text(question, "question", MAX_QUESTION_CHARS)
        fixed = preset_settings(choice(preset, "preset", list(PRESETS), "") or None, schedule)
        switches = {name: text(value, name, 40) for name, value in dict(
            sink_scoring=sink_scoring, growth_rounding=growth_rounding, gqa_grouping=gqa_grouping,
            score_rows=score_rows, question_place=question_place, ntk=ntk).items()}
        attention = fixed.get("attention", text(attention, "attention", 40))
        settings = settings_from(schedule, chunk, memory, growth, fixed.get("scorer", scorer),
                                 fixed.get("sinks", sinks), fixed.get("rope", rope),
                                 flag(question_aware, "question_aware"), attention,
                                 {k: fixed.get(k, v) for k, v in switches.items()})
        if preset:
            check_reference_run(settings.schedule, settings.growth)
        source = _document(document_text, document_file, example_name)
        lm = get_model(model, session)
        if source is None:
            source = example(example_name, lm.tokenizer)
        document = prepare(source, lm.tokenizer, max_tokens, context_tokens(lm), settings)
        check_settings(settings, document.tokens)
        if full_reference and not reference_fits(document.tokens, context_tokens(lm)):
            raise MemstepError(f"full_reference: a {document.tokens:,}-token document is past the model's "
                               f"{context_tokens(lm):,} positions; the full cache's answer is offered up to it")
        source, needle = document.source, document.needle
        passkey = source.passkey if needle is not None else None  # None when truncation cut it off
        needle = needle and (document.prefix_tokens + needle[0], document.prefix_tokens + needle[1])
        out = {}
        with closing(prefill_stream(model, document.ids, settings, question or source.question, full_reference,
                                    document.notices, cache_reference=source.bundled, session=session)) as stream:
            for kind, item in stream:
                if kind == "step":
                    yield {"event": "step", "steps": item.steps, **item.to_dict()}
                elif kind == "result":
                    out = {"event": "result", "document": source.name, **item.to_dict(), "passkey": passkey,
                           "passkey_kept": needle_kept(item.steps[-1], needle) if needle else None,
                           "passkey_answered": answer_contains_passkey(item.answer, passkey)
                           if passkey and item.answer is not None else None}
                elif kind == "full":
                    out["full_answer"] = item.answer
                    out["full_seconds"] = round(item.seconds, 6)
        yield out
    except MemstepError as err:
        raise gr.Error(str(err), title="memstep", print_exception=False) from err


def schedule(tokens: int, schedule: str = "imdc", chunk: int = 512, memory: int = 512, growth: str = "linear",
             sinks: int = 4, layers: int = 30) -> dict:
    """The chunk sizes and memory budgets of a schedule for a document of ``tokens`` tokens
    (pure math, no model), with each step's cache entries before and after (sinks included).
    ``layers`` (30: the embedded model) matters for the layer-wise growths only."""
    try:
        for name, value in dict(schedule=schedule, growth=growth).items():
            valid_unicode(value, name)
        for value, name in ((chunk, "chunk size"), (memory, "memory size"), (sinks, "sinks")):
            number(value, name, 0, MAX_SIZE_TOKENS)
        settings = settings_from(schedule, chunk, memory, growth, None, sinks)
        tokens = number(tokens, "tokens", 1, MAX_SIZE_TOKENS)
        layers = number(layers, "layers", 1, MAX_LAYERS)
        check_settings(settings, tokens, run=False)  # schedule math: memstep.schedules.MAX_STEPS
        check_schedule_work(settings, tokens, layers)
        plan = make_schedule(settings.schedule, tokens, settings.chunk, settings.memory, settings.growth,
                             layers=layers)
    except MemstepError as err:
        raise gr.Error(str(err), title="memstep", print_exception=False) from err
    lengths = plan.cache_lengths(settings.sinks)
    return {**plan.to_dict(), "sinks": settings.sinks, "memory_before": [b for b, _ in lengths],
            "memory_after": [a for _, a in lengths],
            "peak_memory_plus_chunk": max(b + c for (b, _), c in zip(lengths, plan.chunk_sizes))}


def register() -> None:
    """Inside a gr.Blocks: add the endpoints (runs share the Run tab's one-at-a-time queue)."""
    gr.api(prefill, api_name="prefill", concurrency_id="prefill", concurrency_limit=1)
    # The schedule math is bounded (MAX_STEPS) and quick; a small limit keeps a burst of calls
    # from taking every worker thread.
    gr.api(schedule, api_name="schedule", concurrency_id="schedule", concurrency_limit=SCHEDULE_CONCURRENCY)
