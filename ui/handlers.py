"""Event functions of the Run and Compare tabs: small, and streaming where work is long.

Errors a user can cause arrive as MemstepError and leave as a toast (gr.Error, or
gr.Warning where the page can carry on); the app keeps serving the next request.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from contextlib import closing

import gradio as gr

from memstep.errors import MemstepError
from memstep.documents import tokenize_prefix
from memstep.generate import prompt_parts
from memstep.presets import preset_settings
from memstep.schedules import make_schedule

from ui.documents import (DEFAULT_EXAMPLE, TOKENIZER_FREE_EXAMPLE, DocumentSource, describe, example, read_upload,
                          uploaded_path)
from ui.figures import compare_memory_figure, compare_sizes_figure, placeholder_figure, schedule_figure
from ui.models import cached_model, context_tokens, get_model, layer_count, preview_tokenizer
from ui.inputs import flag
from ui.runs import (MAX_TOKENS_LIMIT, check_settings, document_limit, prefill_stream, prepare, settings_from,
                     whole_number)
from ui.summary import COMPARE_HEADERS, ComparedRun, compare_rows
from ui.views import RunView, answer_markdown, compact, render, stats_html

ERROR_TITLE = "memstep"


def _fail(err: Exception):
    raise gr.Error(str(err), title=ERROR_TITLE, print_exception=False) from err


# ---- document ------------------------------------------------------------------------
def default_document() -> DocumentSource:
    """The default example; while no tokenizer can load (hub unreachable on a fresh Space) an
    example that needs none, so the page still comes up."""
    try:
        return example(DEFAULT_EXAMPLE, preview_tokenizer(None)[0])
    except MemstepError:
        return example(TOKENIZER_FREE_EXAMPLE, None)


def choose_example(name: str | None, model: str | None):
    """An example picked: it becomes the document, its question fills the question box."""
    if not name:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    try:
        source = example(name, preview_tokenizer(model)[0])
    except MemstepError as err:
        _fail(err)
    return source, source.question, describe_document(source, model), None


def describe_document(source: DocumentSource, model) -> str:
    try:
        tokenizer, exact = preview_tokenizer(model)
    except MemstepError as err:  # the page keeps serving; the run will try the model again
        return f"{describe(source)}  \n⚠ {err}. The page keeps working; Run tries to load the model again."
    count = _count_tokens(source.text, tokenizer)[1]
    if count >= COUNT_LIMIT:
        return f"{describe(source)} · over {COUNT_LIMIT:,} tokens"
    return describe(source, count, exact)


def choose_upload(path: str | None, current: DocumentSource, model):
    """A file uploaded: read and checked on the server; a bad file leaves the document as it was."""
    if not path:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
    try:
        source = read_upload(uploaded_path(path))
    except MemstepError as err:
        gr.Warning(str(err), title=ERROR_TITLE)
        return current, gr.skip(), describe_document(current, model), None, gr.skip()
    return source, source.question, describe_document(source, model), gr.skip(), None


# ---- schedule preview ----------------------------------------------------------------
COUNT_LIMIT = 1 << 16  # the page counts a document's tokens up to this many (beyond any context)


_COUNTS: OrderedDict = OrderedDict()  # (digest of the text, tokenizer) -> counts: a few bytes per
COUNTS_KEPT = 64                       # document, never the (up to 20 MB) texts themselves
_COUNTS_LOCK = threading.Lock()


def _count_tokens(text: str, tokenizer) -> tuple[int, int]:
    """(prompt head tokens, document tokens up to COUNT_LIMIT) with this tokenizer."""
    key = (hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest(), tokenizer)
    with _COUNTS_LOCK:
        if key in _COUNTS:
            _COUNTS.move_to_end(key)
            return _COUNTS[key]
    counts = len(prompt_parts(tokenizer).head), len(tokenize_prefix(text, tokenizer, COUNT_LIMIT)[0])
    with _COUNTS_LOCK:  # previews run in parallel threads
        _COUNTS[key] = counts
        while len(_COUNTS) > COUNTS_KEPT:
            _COUNTS.popitem(last=False)
    return counts


def preview(doc: DocumentSource, model, schedule, growth, chunk, memory, sinks, max_tokens):
    """The schedule the run would follow, from the schedule math alone (no model work)."""
    try:
        settings = settings_from(schedule, chunk, memory, growth, None, sinks)
        tokenizer, exact = preview_tokenizer(model)
        prefix, document = _count_tokens(doc.text, tokenizer)
        limit, reason = document_limit(_whole(max_tokens), context_tokens(cached_model(model)), prefix)
        tokens = prefix + min(document, limit)
        check_settings(settings, tokens)
        layers, exact_layers = layer_count(model)
        plan = make_schedule(settings.schedule, tokens, settings.chunk, settings.memory, settings.growth,
                             layers=layers)
    except MemstepError as err:
        return (placeholder_figure(f"⚠ {err}", "Chunk and memory per step", 320),
                f"⚠ **Cannot preview this schedule:** {err}")
    held = [before + c for (before, _), c in zip(plan.cache_lengths(settings.sinks), plan.chunk_sizes)]
    cut = f", cut to {limit:,} by {reason}" if document > limit else ""
    estimate = "" if exact else " (tokens counted with the embedded tokenizer until this model is loaded)"
    if plan.layerwise:
        estimate += (f" · layer-wise budgets: layers 1-{layers // 2} follow the first curve, the rest the second; "
                     "the bars show the widest layer" + ("" if exact_layers else f" ({layers} layers assumed until "
                                                                               "the model is loaded)"))
    lines = [f"**Preview** · {plan.steps} steps over {tokens:,} tokens ({prefix} prompt + "
             f"{min(document, limit):,} document{cut}) · peak memory + chunk **{max(held):,}** tokens{estimate}"]
    if plan.steps <= 24:
        lines.append(f"chunks: {' · '.join(f'{c:,}' for c in plan.chunk_sizes)}  \n"
                     f"memory after: {' · '.join(f'{a:,}' for _, a in plan.cache_lengths(settings.sinks))}")
    return schedule_figure(plan, settings.sinks, title=f"Preview: {settings.label()}, {tokens:,} tokens"), \
        "\n\n".join(lines)


def preview_page(doc: DocumentSource, model, schedule, growth, chunk, memory, sinks, max_tokens):
    """The preview, and the controls that follow it: Run only for a valid setting, the chunk
    slider no longer than the document (the same rule as the run)."""
    figure, note = preview(doc, model, schedule, growth, chunk, memory, sinks, max_tokens)
    valid = not note.startswith("⚠")
    try:
        tokens = preview_tokens(doc, model, max_tokens)
    except MemstepError:
        return figure, note, gr.update(interactive=valid), gr.skip()
    return figure, note, gr.update(interactive=valid), gr.update(maximum=max(16, tokens))


def preview_tokens(doc: DocumentSource, model, max_tokens) -> int:
    """Tokens a run of ``doc`` would prefill (prompt head + document, cut to the limits)."""
    tokenizer, _ = preview_tokenizer(model)
    prefix, document = _count_tokens(doc.text, tokenizer)
    limit, _ = document_limit(_whole(max_tokens), context_tokens(cached_model(model)), prefix)
    return prefix + min(document, limit)


def _whole(value) -> int | None:
    return None if value is None or value == "" else whole_number(value, "max tokens", 1, MAX_TOKENS_LIMIT)


# ---- a run ---------------------------------------------------------------------------
def _run_outputs(view: RunView, step: int | None = None):
    shown = render(view, step)
    steps = max(1, view.steps)
    slider = gr.update(maximum=steps, value=len(view.records) if step is None else step + 1,
                       interactive=view.finished or view.stopped)
    return (stats_html(view, step), shown.sizes, shown.retained, shown.memory, shown.seconds, shown.text,
            answer_markdown(view), slider, view, gr.Column(visible=True), gr.Markdown(visible=False),
            _layers_plot(shown))


def _layers_plot(shown):
    """Memory per layer: shown for layer-wise budgets only."""
    return gr.Plot(shown.layers, visible=True) if shown.layers is not None else gr.Plot(visible=False)


def run_document(doc: DocumentSource, model, schedule, growth, chunk, memory, scorer, sinks, max_tokens,
                 question, full_reference, rope="compact", question_aware=False, progress=gr.Progress(),
                 request: gr.Request = None):
    """Stream a run: one update as soon as the schedule is known, then one per step, then
    the answer (and the full-cache reference answer when asked)."""
    began = time.perf_counter()
    session = _session(request)
    _STOP_REQUESTS.discard(session)  # a Stop pressed before this run is not for it
    _RUNNING.add(session)
    try:
        settings = settings_from(schedule, chunk, memory, growth, scorer, sinks, rope, question_aware)
        progress(0.0, desc="Loading the model")
        lm = get_model(model, session)
        document = prepare(doc, lm.tokenizer, _whole(max_tokens), context_tokens(lm))
        for notice in document.notices:
            gr.Warning(notice, title=ERROR_TITLE)
        # bundled examples always show the full cache's answer: computed once, then cached
        reference = flag(full_reference, "full reference") or doc.bundled
        with closing(prefill_stream(model, document.ids, settings, question, reference, document.notices,
                                    cache_reference=doc.bundled, session=session)) as stream:
            yield from _stream_run(stream, document, settings, question, reference, began, progress, session)
    except MemstepError as err:
        _fail(err)
    finally:
        _RUNNING.discard(session)
        _STOP_REQUESTS.discard(session)


# Sessions whose Stop was pressed while their run streams. Stop does not cancel the run's
# event: Gradio sends a generator's updates as diffs of the previous one, and updates still
# on their way when another event rewrote the same components were seen to garble the
# key numbers (stopped, then more steps). The run itself ends on its own "stopped" update.
_STOP_REQUESTS: set[str] = set()
_RUNNING: set[str] = set()  # sessions with a run streaming: only their Stop is kept (bounded)


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""


def _take_stop(session: str) -> bool:
    """Whether Stop was pressed for this session's run (and forget it)."""
    if session in _STOP_REQUESTS:
        _STOP_REQUESTS.discard(session)
        return True
    return False


def _stream_run(stream, document, settings, question, full_reference, began, progress, session=""):
    """The page updates for one run's stream of plain data; after Stop, one last update
    (the steps so far, stopped) and no more."""
    _, plan = next(stream)
    view = RunView(document, settings, plan, wants_reference=bool(full_reference))
    progress((0, plan.steps), desc="Prefilling", unit="steps")
    view.stopped = _take_stop(session)  # Stop pressed while the model loaded
    yield _run_outputs(view)
    for kind, item in ([] if view.stopped else stream):
        if _take_stop(session):
            view.stopped = True
            yield _run_outputs(view)
            return
        view.seconds = time.perf_counter() - began
        if kind == "step":
            view.records.append(compact(item))
            if len(view.records) == plan.steps:
                progress(1.0, desc="Answering from the compressed memory" if question else "Done")
            else:
                progress((len(view.records), plan.steps), desc="Prefilling", unit="steps")
        elif kind == "result":
            view.result = item
            if full_reference and item.question:
                progress(0.5, desc="Reference: the same document with the full cache")
        elif kind == "full":
            view.full = item
        yield _run_outputs(view)


def choose_preset(preset: str | None):
    """A preset picked: set the controls it fixes (scorer, RoPE positions, sinks); 'none' keeps them."""
    chosen = preset_settings(preset if preset and preset != "none" else None)
    if not chosen:
        return gr.skip(), gr.skip(), gr.skip()
    return chosen["scorer"], chosen["rope"], chosen["sinks"]


def stop_run(request: gr.Request = None):
    """Stop pressed: the run ends after its current step with one last update (the steps so
    far stay, for replay); see _STOP_REQUESTS."""
    session = _session(request)
    if session in _RUNNING:  # a Stop with no run of its own is dropped, not stored
        _STOP_REQUESTS.add(session)


def replay(step, view: RunView | None):
    """The step slider moved: redraw the views as they were after that step."""
    if view is None:
        return (gr.skip(),) * 7
    index = min(max(int(step or 0), 0), len(view.records)) - 1  # slider k: the run after k steps
    shown = render(view, index)
    return (stats_html(view, index), shown.sizes, shown.retained, shown.memory, shown.seconds, shown.text,
            _layers_plot(shown))


# ---- comparison ----------------------------------------------------------------------
CONFIG_FIELDS = 8  # enabled, schedule, growth, chunk, memory, scorer, RoPE positions, question-aware
TIME_CAVEAT = ("Times are wall-clock seconds of one run each on a shared machine: ratios within about 10-20% "
               "are noise; the memory columns do not depend on the load.")


def _configs(values) -> list[tuple]:
    return [tuple(values[i:i + CONFIG_FIELDS]) for i in range(0, len(values), CONFIG_FIELDS)]


def _compare_outputs(runs: list[ComparedRun], status: str):
    traces = [(run.label, run.records) for run in runs]
    return (status, compare_sizes_figure(traces), compare_memory_figure(traces),
            {"headers": COMPARE_HEADERS, "data": compare_rows(runs)})


def compare(doc: DocumentSource, model, sinks, max_tokens, question, request: gr.Request = None, *config_values,
            progress=gr.Progress()):
    """Run the ticked configurations one after another on the same document; stream the
    overlaid plots and the summary table after every step. (``request`` is Gradio's: it comes
    before the configurations, which arrive as the remaining inputs.)"""
    session = _session(request)
    try:
        settings = [settings_from(s, c, m, g, sc, sinks, r, qa) for on, s, g, c, m, sc, r, qa
                    in _configs(config_values) if on]
        if not settings:
            raise MemstepError("no configuration is ticked: tick at least one to compare")
        progress(0.0, desc="Loading the model")
        lm = get_model(model, session)
        document = prepare(doc, lm.tokenizer, _whole(max_tokens), context_tokens(lm))
        runs, labels = [], set()
        for s in settings:  # check every configuration before running any
            check_settings(s, document.tokens)
            plan = make_schedule(s.schedule, document.tokens, s.chunk, s.memory, s.growth,
                                 layers=lm.model.config.num_hidden_layers)
            label = s.label()
            while label in labels:
                label += "′"
            labels.add(label)
            needle = document.needle
            runs.append(ComparedRun(label, s.schedule, [], plan.steps,
                                    passkey=None if needle is None else document.source.passkey,
                                    needle=None if needle is None else (document.prefix_tokens + needle[0],
                                                                        document.prefix_tokens + needle[1])))
        for notice in document.notices:
            gr.Warning(notice, title=ERROR_TITLE)
        total = sum(r.steps for r in runs)
        done = 0
        name = document.source.name
        yield _compare_outputs(runs, f"Running {len(runs)} configurations on **{name}** ({document.tokens:,} "
                                     "tokens)…")
        for s, run in zip(settings, runs):
            with closing(prefill_stream(model, document.ids, s, question, False, document.notices,
                                        session=session)) as stream:
                for kind, item in stream:
                    if kind == "step":
                        run.records.append(compact(item))
                        done += 1
                        progress((done, total), desc=f"{run.label}: step {len(run.records)} of {run.steps}",
                                 unit="steps")
                    elif kind == "result":
                        run.result = item
                    else:
                        continue
                    yield _compare_outputs(runs, f"**{run.label}**: step {len(run.records)} of {run.steps}")
        yield _compare_outputs(runs, f"**Done**: {len(runs)} configurations on **{name}**, {document.tokens:,} "
                                     f"tokens ({len(document.ids):,} document tokens). {TIME_CAVEAT} "
                                     + " ".join(document.notices))
    except MemstepError as err:
        _fail(err)

