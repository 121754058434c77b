"""Event functions of the Run tab: small, and streaming where work is long (the Compare tab's:
ui/comparison.py).

Errors a user can cause arrive as MemstepError and leave as a toast (gr.Error, or
gr.Warning where the page can carry on); the app keeps serving the next request.
"""

from __future__ import annotations

import hashlib
import html
import threading
import time
from collections import OrderedDict
from contextlib import closing

import gradio as gr

from memstep.errors import MemstepError
from memstep.documents import tokenize_prefix
from memstep.generate import prompt_parts
from memstep.models import default_model, offered_models
from memstep.presets import AUTO, SWITCHES, other_value, preset_settings
from memstep.schedules import MAX_SIZE_TOKENS, make_schedule

from ui.documents import (DEFAULT_EXAMPLE, EXAMPLE_SETTINGS, TOKENIZER_FREE_EXAMPLE, DocumentSource, describe, example,
                          read_upload, uploaded_path)
from ui.fields import settle
from ui.explain import NO_QUESTION
from ui.identity import RUN_LABEL, document_label, is_compressed, model_name, model_words, page_mismatch
from ui.figures import placeholder_figure, schedule_figure
from ui.inputs import flag, valid_unicode
from ui.models import cached_model, context_tokens, get_model, layer_count, normalize_spec, preview_tokenizer
from ui.reference import lookup, reference_key
from ui.runs import (MAX_DOCUMENT_TOKENS, MAX_NEW_TOKENS, MAX_SINKS, MAX_TOKENS_LIMIT, check_settings, document_limit,
                     prefill_stream, prepare, reference_fits, settings_from, whole_number)
from ui.share import link_html, parse_query, settings_query, write_files
from ui.summary import stat_cards
from ui.timing import (about, cpu_time_measured, modeled_flops, planned_seconds, preview_config, resolved_device,
                       seconds_left, shared_note, timed)
from ui.views import RunView, answer_markdown, compact, render, stats_html, text_view

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


EXAMPLE_CONTROLS = ("chunk", "memory", "max_tokens", "rope")  # what an example may set (EXAMPLE_SETTINGS)


def choose_example(name: str | None, model: str | None, chunk=None, max_tokens=None, current=None):
    """An example picked: it becomes the document, its question fills the question box, and the
    settings it needs (the whole novel: chunk and memory 1,024, no max tokens) fill their controls;
    a chunk it leaves is kept within its tokens, as for an upload (choose_upload). The chunk
    slider's end comes, then the page's document marks (ready_outputs)."""
    if not name:
        return (gr.skip(),) * (5 + len(EXAMPLE_CONTROLS)) + ready_outputs(current, back=True)
    try:
        source = example(name, preview_tokenizer(model)[0])
    except MemstepError as err:
        _fail(err)
    needs = EXAMPLE_SETTINGS.get(name, {})
    chunk_update, end = (needs["chunk"], gr.skip()) if "chunk" in needs else _chunk_within(
        source, model, chunk, needs.get("max_tokens", max_tokens))
    controls = {**{key: needs[key] if key in needs else gr.skip() for key in EXAMPLE_CONTROLS}, "chunk": chunk_update}
    return (source, source.question, describe_document(source, model), None,
            *(controls[key] for key in EXAMPLE_CONTROLS), end, *ready_outputs(source, back=source == current))


def ready_outputs(source: DocumentSource | None, back: bool = False) -> tuple:
    """The page's document marks once a document is in place (ui/identity.py): its id and nothing
    pending. Run comes back from the preview that follows the new document (controls_changed, which
    also checks the settings): Run enabled here too would flicker off and on again when an older
    preview lands in between, and a click in that moment is lost. ``back``: no new document follows
    (a failure, a cleared box, the same document again), so Run comes back here."""
    run = gr.update(value=RUN_LABEL, interactive=True) if back else gr.skip()
    return (gr.skip() if source is None else source.doc_id, "", run)


def preparation_failed(current: DocumentSource | None):
    """Building a document failed (its message is the toast), or the upload box was cleared: the
    page goes back to the document the session holds, with Run back."""
    return (getattr(current, "example", None), *ready_outputs(current, back=True))


def run_ready(example_name, doc: DocumentSource | None, pending, doc_key, model, schedule, growth, chunk, memory,
              sinks, max_tokens, rope=AUTO, ways=None):
    """Run once a document's preparation ended (built, refused, cleared or the same again): enabled
    only for settings the preview accepts, as controls_changed sets it. A refused upload brings Run
    back (ready_outputs), and no preview follows it since no control changed: without this, Run
    came back enabled under a memory smaller than the sinks. Left alone while the page prepares
    or shows another document (a newer choice is on its way)."""
    if doc is None or page_mismatch(doc, example_name, pending, doc_key):
        return gr.skip()
    text = preview(doc, model, schedule, growth, chunk, memory, sinks, max_tokens, rope, ways)[1]
    return gr.update(value=RUN_LABEL, interactive=not text.startswith("⚠"))


def describe_document(source: DocumentSource, model) -> str:
    """The document's line under the upload box: its name, tokens, passkey, and id (the run card
    shows the same id: what a run is of)."""
    ident = f" · #{source.doc_id}"
    try:
        tokenizer, exact = preview_tokenizer(model)
    except MemstepError as err:  # the page keeps serving; the run will try the model again
        return f"{describe(source)}{ident}  \n⚠ {err}. The page keeps working; Run tries to load the model again."
    count = _count_tokens(source.text, tokenizer)[1]
    if count >= COUNT_LIMIT:
        return f"{describe(source)} · over {COUNT_LIMIT:,} tokens{ident}"
    return describe(source, count, exact) + ident


def choose_upload(path: str | None, current: DocumentSource, model, chunk=None, max_tokens=None):
    """A file uploaded: read and checked on the server; a bad file leaves the document as it was.
    The chunk slider ends at the new document's tokens (a longer chunk comes back to them, with a
    note) here, with the document: the preview that follows a new document leaves the chunk box
    alone (see controls_changed). The last two outputs: the chunk slider and its end."""
    if not path:
        return (gr.skip(),) * 7 + ready_outputs(current, back=True)
    try:
        source = read_upload(uploaded_path(path))
    except MemstepError as err:
        gr.Warning(str(err), title=ERROR_TITLE)
        return (current, gr.skip(), describe_document(current, model), None, gr.skip(), gr.skip(), gr.skip(),
                *ready_outputs(current, back=True))
    return (source, source.question, describe_document(source, model), gr.skip(), None,
            *_chunk_within(source, model, chunk, max_tokens), *ready_outputs(source, back=source == current))


def _chunk_within(doc: DocumentSource, model, chunk, max_tokens) -> tuple:
    """(the chunk slider's update, its end) for ``doc``: ended at its tokens, and the value put
    there (with a note) when it was beyond them; skipped when the tokens cannot be counted (the
    preview says why)."""
    try:
        tokens = max(16, preview_tokens(doc, model, max_tokens))
    except MemstepError:
        return gr.skip(), gr.skip()
    value, note = settle(chunk, "Chunk size c", 16, tokens, "this document's tokens")
    if note:
        gr.Warning(note, title=ERROR_TITLE)
        return gr.update(maximum=tokens, value=value), tokens
    return gr.update(maximum=tokens), tokens


# ---- schedule preview ----------------------------------------------------------------
COUNT_LIMIT = MAX_DOCUMENT_TOKENS  # the page counts a document's tokens up to this many (a whole novel)


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


def preview(doc: DocumentSource, model, schedule, growth, chunk, memory, sinks, max_tokens, rope=AUTO,
            ways=None):
    """The schedule the run would follow, from the schedule math alone (no model work), with the
    growth rounding the ticked reference boxes ask for, and the planner's estimate of its
    seconds on this machine."""
    try:
        settings = settings_from(schedule, chunk, memory, growth, None, sinks, rope)
        tokenizer, exact = preview_tokenizer(model)
        prefix, document = _count_tokens(doc.text, tokenizer)
        limit, reason = document_limit(_whole(max_tokens), context_tokens(cached_model(model)), prefix, settings)
        tokens = prefix + min(document, limit)
        check_settings(settings, tokens)
        layers, exact_layers = layer_count(model)
        rounding = reference_ways(WAY_DEFAULTS if ways is None else ways)[1]["growth_rounding"]
        plan = make_schedule(settings.schedule, tokens, settings.chunk, settings.memory, settings.growth,
                             layers=layers, rounding=rounding)
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
    lines[0] += _estimate_note(model, plan, settings.sinks)
    if plan.steps <= 24:
        lines.append(f"chunks: {' · '.join(f'{c:,}' for c in plan.chunk_sizes)}  \n"
                     f"memory after: {' · '.join(f'{a:,}' for _, a in plan.cache_lengths(settings.sinks))}")
    return schedule_figure(plan, settings.sinks, title=f"Preview: {settings.label()}, {tokens:,} tokens"), \
        "\n\n".join(lines)


def _estimate_note(model, plan, sinks: int) -> str:
    """' · about 9 min on this machine (planned)': the planner's seconds for the run, where it can tell."""
    config = preview_config(model)
    seconds = planned_seconds(config, plan, sinks, device=resolved_device()) if config is not None else None
    return f" · **{about(seconds)}** on this machine (planned)" if seconds else ""


MEMORY_MAX = 8192  # the memory slider's end (the embedded model's context)


def preview_page(doc: DocumentSource, model, schedule, growth, chunk, memory, sinks, max_tokens, rope=AUTO,
                 ways=None, chunk_end=None, keep_chunk=False):
    """The preview, and the controls that follow it: Run only for a valid setting, the chunk
    slider no longer than the document (the same rule as the run). A size typed beyond its
    slider's ends goes to the nearest end, with a note naming the field, and the box shows it.
    The slider's end is sent only when it differs from ``chunk_end`` (the end the page holds):
    an update of the slider redraws it, and a redraw between the user's typing and Enter put
    the old number back. Returns the end the page holds afterwards, last. ``keep_chunk``: the
    chunk box is left as it is (the preview still uses a chunk within the document)."""
    memory, memory_note = settle(memory, "Memory size M", 0, MEMORY_MAX, "the largest memory this page runs")
    chunk, chunk_note = settle(chunk, "Chunk size c", 16, MAX_SIZE_TOKENS, "the least chunk this page runs")
    try:
        tokens = max(16, preview_tokens(doc, model, max_tokens,
                                        settings_from(schedule, chunk, memory, growth, None, sinks, rope)))
        chunk, note = settle(chunk, "Chunk size c", 16, tokens, "this document's tokens")
        chunk_note = None if keep_chunk and note else note or chunk_note
    except MemstepError:
        tokens = None
    for note in (chunk_note, memory_note):
        if note:
            gr.Warning(note, title=ERROR_TITLE)
    figure, text = preview(doc, model, schedule, growth, chunk, memory, sinks, max_tokens, rope, ways)
    valid = not text.startswith("⚠")
    chunk_update = {} if tokens is None or tokens == chunk_end else {"maximum": tokens}
    if chunk_note:
        chunk_update["value"] = chunk
    return (figure, text, gr.update(interactive=valid), gr.update(**chunk_update) if chunk_update else gr.skip(),
            gr.update(value=memory) if memory_note else gr.skip(), chunk_end if tokens is None else tokens)


def preview_tokens(doc: DocumentSource, model, max_tokens, settings=None) -> int:
    """Tokens a run of ``doc`` would prefill (prompt head + document, cut to the limits)."""
    tokenizer, _ = preview_tokenizer(model)
    prefix, document = _count_tokens(doc.text, tokenizer)
    limit, _ = document_limit(_whole(max_tokens), context_tokens(cached_model(model)), prefix, settings)
    return prefix + min(document, limit)


def _whole(value) -> int | None:
    return None if value is None or value == "" else whole_number(value, "max tokens", 1, MAX_TOKENS_LIMIT)


# ---- a run ---------------------------------------------------------------------------
def _run_outputs(view: RunView, step: int | None = None, query: str = ""):
    if view.stopped and not view.records:  # stopped before any step: nothing to draw, no empty charts
        return (stats_html(view), gr.skip(), gr.skip(), gr.skip(), gr.skip(), "", answer_markdown(view),
                gr.update(maximum=1, value=0, interactive=False), view, gr.Column(visible=False),
                gr.Markdown(visible=True), gr.Plot(visible=False), gr.Button(visible=False),
                gr.DownloadButton(visible=False), gr.DownloadButton(visible=False), gr.Column(visible=False))
    shown = render(view, step, query)
    steps = max(1, view.steps)
    slider = gr.update(maximum=steps, value=len(view.records) if step is None else step + 1,
                       interactive=view.finished or view.stopped)
    return (stats_html(view, step), shown.sizes, shown.retained, shown.memory, shown.seconds, shown.text,
            answer_markdown(view), slider, view, gr.Column(visible=True), gr.Markdown(visible=False),
            _layers_plot(shown), gr.Button(visible=view.finished and view.suggests_question_aware),
            *_downloads(view), gr.Column(visible=True))


def reset_views():
    """The document changed: the previous run's views go (its answer, map and numbers belong to
    another text); the preview of the new document stays."""
    return (stat_cards([("state", "run", "not run yet")]), answer_markdown(None), None, gr.Column(visible=False),
            gr.Column(visible=False), gr.Markdown(visible=True), gr.Button(visible=False),
            gr.DownloadButton(visible=False), gr.DownloadButton(visible=False), "")


def stale_note(view: RunView | None, schedule, growth, chunk, memory, scorer, sinks, rope, question_aware, question,
               ways=None) -> str:
    """A line over the last run's views when the controls no longer match it (they stay, for
    reading, but say whose they are); '' while they match or before a run."""
    if view is None:
        return ""
    try:
        now = settings_from(schedule, chunk, memory, growth, scorer, sinks, rope, question_aware,
                            *reference_ways(WAY_DEFAULTS if ways is None else ways))
    except MemstepError:
        now = None
    asked = (view.result.question if view.result else None) or ""
    same_question = view.result is None or (question or "").strip() == asked.strip()  # asked: known at the answer
    if now == view.settings and same_question:
        return ""
    return (f"⟳ The views below are of the last run ({view.label()}"
            + (f", asked “{html.escape(asked.strip())}”" if asked.strip() else "") + "): the settings or the "
            "question have changed since. Press **Run** to see them.")


def run_failed():
    """The run raised (its message is the toast): the status says so instead of the last update's."""
    return stat_cards([("state", "run", "failed: the message says why and what to change")])


def _downloads(view: RunView) -> tuple:
    """The run's JSON and step CSV, offered once the run (and its answer) is in."""
    if view.result is None or not view.finished:
        return gr.DownloadButton(visible=False), gr.DownloadButton(visible=False)
    json_path, csv_path = write_files(view.result, view.label(),
                                      view.cpu_seconds if view.cpu_measured else None)
    return gr.DownloadButton(value=json_path, visible=True), gr.DownloadButton(value=csv_path, visible=True)


def _layers_plot(shown):
    """Memory per layer: shown for layer-wise budgets only."""
    return gr.Plot(shown.layers, visible=True) if shown.layers is not None else gr.Plot(visible=False)


RUN_OUTPUTS = 16  # the Run tab's outputs of a run update (see _run_outputs)


def _loading_update(model, doc: DocumentSource, question) -> tuple:
    """The first update of a run, before the model is loaded: the status says what it runs, and
    the answer box says at once when no question was asked."""
    now = ("loading the model: a few seconds (a model not on this machine downloads first)"
           if cached_model(model) is None else "preparing the document")
    cards = [("state", "run", "starting"), ("document", "document", document_label(doc))]
    answer = NO_QUESTION if not (question or "").strip() else "*The answer appears when the prefill is done.*"
    return (stat_cards(cards, 0.0, now=now),) + (gr.skip(),) * 5 + (answer,) + (gr.skip(),) * (RUN_OUTPUTS - 7)


# The Run tab's "as the reference code" boxes: a ticked box takes the reference's way
PADDED_WAY = "padded (m + c)² attention maps"
WAY_CHOICES = [s.label for s in SWITCHES.values()] + [PADDED_WAY]
WAY_DEFAULTS = [s.label for s in SWITCHES.values() if s.default == s.reference]


def reference_ways(ways) -> tuple[str, dict]:
    """The attention and the reference switches the ticked boxes ask for."""
    ways = set(ways or [])
    switches = {name: s.reference if s.label in ways else other_value(name) for name, s in SWITCHES.items()}
    return ("padded" if PADDED_WAY in ways else "sdpa"), switches


def run_document(doc: DocumentSource, model, schedule, growth, chunk, memory, scorer, sinks, max_tokens,
                 question, full_reference, rope=AUTO, question_aware=False, ways=None, query="", example_name=None,
                 pending="", shown_id=None, progress=gr.Progress(), request: gr.Request = None):
    """Stream a run: one update as soon as the schedule is known, then one per step, then
    the answer (and the full-cache reference answer when asked). From the page, the example menu,
    the pending mark and the document id it shows come last: a run starts only when they match the
    session's document (ui/identity.py)."""
    mismatch = page_mismatch(doc, example_name, pending, shown_id)
    if mismatch:
        _fail(MemstepError(mismatch))
    began = time.perf_counter()
    session = _session(request)
    _STOP_REQUESTS.discard(session)  # a Stop pressed before this run is not for it
    _RUNNING.add(session)
    try:
        settings = settings_from(schedule, chunk, memory, growth, scorer, sinks, rope, question_aware,
                                 *reference_ways(WAY_DEFAULTS if ways is None else ways))
        if settings.question_aware and not (question or "").strip():
            raise MemstepError("Question-aware scoring needs a question: type one in the Question box, or untick "
                               "Question-aware under Advanced (nothing was run)")
        yield _loading_update(model, doc, question)
        progress(0.0, desc="Loading the model")
        lm = get_model(model, session)
        document = prepare(doc, lm.tokenizer, _whole(max_tokens), context_tokens(lm), settings)
        check_settings(settings, document.tokens)  # the step cap: the page's preview says it first
        for notice in document.notices:
            gr.Warning(notice, title=ERROR_TITLE)
        # bundled examples always show the full cache's answer: computed once, then cached
        reference = flag(full_reference, "full reference") or doc.bundled
        if reference and not reference_fits(document.tokens, context_tokens(lm)):
            if flag(full_reference, "full reference") and question and question.strip():
                gr.Warning(f"No full-cache reference for a {document.tokens:,}-token document: past the model's "
                           f"{context_tokens(lm):,} positions it would be a whole-book prefill with quadratic "
                           "attention, and out of the model's range anyway.", title=ERROR_TITLE)
            reference = False
            if question and question.strip():
                document.notices.append(f"No full-cache reference answer: {document.tokens:,} tokens are past the "
                                        f"model's {context_tokens(lm):,} positions.")
        with closing(prefill_stream(model, document.ids, settings, question, reference, document.notices,
                                    cache_reference=doc.bundled, session=session)) as stream:
            yield from _stream_run(stream, document, settings, question, reference, began, progress, session,
                                   lm=lm, model_spec=normalize_spec(model, session), query=str(query or ""),
                                   model_given=model)
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


# While steps stream, a page update at most every UPDATE_SECONDS, and no more often than building
# it allows (the prefill keeps at least two thirds of the time): a small model's steps are faster
# than Plotly builds a page's figures.
UPDATE_SECONDS = 0.5


def _stream_run(stream, document, settings, question, full_reference, began, progress, session="", lm=None,
                model_spec="", query="", model_given=None):
    """The page updates for one run's stream of plain data; after Stop, one last update
    (the steps so far, stopped) and no more. Every update says what happens next, with an
    estimate from the run's own speed."""
    events = timed(stream)
    _, plan, _ = next(events)
    shown_model = model_given if is_compressed(model_given) else model_spec
    view = RunView(document, settings, plan, wants_reference=bool(full_reference), question=str(question or ""),
                   model_name=model_name(shown_model, lm), model_words=model_words(shown_model, lm),
                   named_model=bool(model_spec) and model_spec != normalize_spec(None))
    device = getattr(lm, "device", "cpu")
    view.cpu_measured = cpu_time_measured(device)
    view.load_note = shared_note() if view.cpu_measured else None
    config = getattr(getattr(lm, "model", None), "config", None)
    asked = len(prompt_parts(lm.tokenizer, question.strip()).tail) if settings.question_aware and question else 0
    view.planned_seconds = planned_seconds(config, plan, settings.sinks, asked, device) if config else None
    view.now = (f"step 1 of {plan.steps}: reading the first {plan.chunk_sizes[0]:,} tokens"
                + (f" · planned {about(view.planned_seconds)} in all" if view.planned_seconds else ""))
    progress((0, plan.steps), desc="Prefilling", unit="steps")
    view.stopped = _take_stop(session)  # Stop pressed while the model loaded
    yield _run_outputs(view, query=query)
    shown, drawing = time.perf_counter(), 0.0
    for kind, item, cpu in ([] if view.stopped else events):
        if _take_stop(session):
            view.stopped = True
            if kind == "step":  # the step Stop waited for has run: it counts, and shows
                view.records.append(compact(item))
                view.cpu_seconds.append(cpu)
                view.seconds = time.perf_counter() - began
            yield _run_outputs(view, query=query)
            return
        view.seconds = time.perf_counter() - began
        if kind == "step":
            view.records.append(compact(item))
            view.cpu_seconds.append(cpu)
            view.load_note = shared_note() if view.cpu_measured else None
            done = len(view.records)
            if done == plan.steps:
                view.now = (f"answering from the compressed memory: up to {MAX_NEW_TOKENS} new tokens, "
                            "a few seconds" if question and question.strip() else "finishing")
                progress(1.0, desc="Answering from the compressed memory" if question else "Done")
            else:
                left = seconds_left(sum(r.seconds for r in view.records), item.tokens_seen, plan.tokens)
                view.now = (f"step {done + 1} of {plan.steps}: reading tokens {item.tokens_seen:,}-"
                            f"{item.tokens_seen + plan.chunk_sizes[done]:,}" + (f" · {about(left)} left" if left
                                                                               else ""))
                progress((done, plan.steps), desc="Prefilling", unit="steps")
        elif kind == "result":
            item.steps = view.records  # the compact records: one copy of the steps per session
            view.result = item
            if full_reference and item.question:
                view.now = _reference_note(view, lm, model_spec)
                progress(0.5, desc="Reference: the same document with the full cache")
        elif kind == "full":
            view.full = item
            view.now = ""
        if UPDATE_SECONDS and kind == "step" and len(view.records) < plan.steps and time.perf_counter() - shown < max(
                UPDATE_SECONDS, 2 * drawing):  # (UPDATE_SECONDS 0: every step)
            continue  # steps faster than the page can draw them: the next update shows them all
        drawn = time.perf_counter()
        outputs = _run_outputs(view, query=query)
        drawing = time.perf_counter() - drawn  # building the figures: a whole book's take ~0.5 s
        yield outputs
        shown = time.perf_counter()


def _reference_note(view: RunView, lm, model_spec: str) -> str:
    """What the reference answer costs: a cached read for a bundled example seen before, else a
    full-cache prefill estimated from this run's seconds and the planner's FLOP ratio."""
    ids = view.document.ids
    if view.document.source.bundled and lookup(reference_key(f"{model_spec}|{view.settings.rope}",
                                                             view.result.question, ids)):
        return "reference: reading the full cache's answer computed before for this example"
    estimate = None
    config = getattr(getattr(lm, "model", None), "config", None)
    if config is not None and view.records:
        compressed = modeled_flops(config, view.schedule, view.settings.sinks)
        full = modeled_flops(config, make_schedule("full", view.schedule.tokens, None, None), view.settings.sinks)
        if compressed and full:
            estimate = sum(r.seconds for r in view.records) * full / compressed
    return (f"reference: prefilling all {view.schedule.tokens:,} tokens with the full cache, then answering"
            + (f" · {about(estimate)}" if estimate else ""))


def choose_preset(preset: str | None):
    """A preset picked: set the controls it fixes (scorer, RoPE positions, sinks, the reference's
    ways); 'none' keeps them."""
    chosen = preset_settings(preset if preset and preset != "none" else None)
    if not chosen:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    ways = [s.label for name, s in SWITCHES.items() if chosen[name] == s.reference]
    return chosen["scorer"], chosen["rope"], chosen["sinks"], ways + ([PADDED_WAY] * (chosen["attention"] == "padded"))


def stop_run(request: gr.Request = None):
    """Stop pressed: the run ends after its current step with one last update (the steps so
    far stay, for replay); see _STOP_REQUESTS."""
    session = _session(request)
    if session in _RUNNING:  # a Stop with no run of its own is dropped, not stored
        _STOP_REQUESTS.add(session)


def replay(step, view: RunView | None, query: str = ""):
    """The step slider moved: redraw the views as they were after that step."""
    if view is None:
        return (gr.skip(),) * 7
    index = _replay_index(step, view)
    shown = render(view, index, query or "")
    return (stats_html(view, index), shown.sizes, shown.retained, shown.memory, shown.seconds, shown.text,
            _layers_plot(shown))


def _replay_index(step, view: RunView) -> int:
    """Slider k shows the run after k steps (0-based record index k - 1)."""
    try:
        k = int(step or 0)
    except (TypeError, ValueError):
        k = len(view.records)
    return min(max(k, 0), len(view.records)) - 1


def search_text(query, step, view: RunView | None):
    """The search box changed: the text view at the replay step with the matches outlined, and
    what the memory did with each."""
    if view is None:
        return gr.skip()
    try:  # a crafted request's lone surrogate: one line, not a traceback when the page's JSON is written
        query = valid_unicode(str(query or ""), "the search")
    except MemstepError as err:
        gr.Warning(str(err), title=ERROR_TITLE)
        return gr.skip()
    index = _replay_index(step, view)
    records = view.records[: index + 1]
    return text_view(view, records[-1] if records else None, query, records)


def try_question_aware():
    """The one-click rerun: tick question-aware (the run follows)."""
    return True


def share_link(example_name, doc: DocumentSource, schedule, growth, chunk, memory, sinks, max_tokens, scorer, rope,
               question_aware, question, model):
    """The link that reopens these settings (an uploaded document cannot travel in a link)."""
    bundled = bool(getattr(doc, "bundled", False))
    query = settings_query(example_name if bundled else None, schedule, growth, chunk, memory, sinks, max_tokens,
                           scorer, rope, question_aware, question, model,
                           default_question=getattr(doc, "question", ""), default_model=default_model())
    return link_html(query, uploaded=not bundled)


def controls_changed(example_name, doc: DocumentSource, model, schedule, growth, chunk, memory, sinks, max_tokens,
                     scorer, rope, ways, question_aware, question, view: RunView | None, chunk_end=None,
                     event: gr.EventData = None):
    """Every view that follows the Run tab's controls, from one listener: the preview (and the
    controls it settles), the stale-views line and the share link. One listener, not three, since
    Gradio re-sends a deferred change event to every listener of it when an 'always_last' listener
    finishes: two such listeners on one control re-trigger each other for as long as they overlap.
    After a new document (or example) the chunk box is left alone: that handler put the chunk
    within the document already, and Gradio reads the slider here as it was before, so a chunk
    put back from that old value landed over the one the user typed next."""
    target = getattr(event, "target", None)
    new_document = isinstance(target, gr.State) or getattr(target, "elem_id", None) == "example"
    sinks, sinks_note = settle(sinks, "Sinks", 0, MAX_SINKS, default=4)
    max_tokens, max_note = settle(max_tokens, "Max tokens", 1, MAX_TOKENS_LIMIT)
    for note in (sinks_note, max_note):
        if note:
            gr.Warning(note, title=ERROR_TITLE)
    shown = preview_page(doc, model, schedule, growth, chunk, memory, sinks, max_tokens, rope, ways, chunk_end,
                         keep_chunk=new_document)
    stale = stale_note(view, schedule, growth, chunk, memory, scorer, sinks, rope, question_aware, question, ways)
    share = share_link(example_name, doc, schedule, growth, chunk, memory, sinks, max_tokens, scorer, rope,
                       question_aware, question, model)
    # the example menu shows another document than the session's: it is being built. (Not the page's
    # pending mark: this listener, run for the new document, could read it before its reset landed.)
    if page_mismatch(doc, example_name, "", getattr(doc, "doc_id", None)):
        shown = (*shown[:2], gr.skip(), *shown[3:])  # Run stays as the page set it: preparing
    else:
        shown = (*shown[:2], gr.update(value=RUN_LABEL, interactive=shown[2]["interactive"]), *shown[3:])
    boxes = tuple(gr.update(value=value) if note else gr.skip() for value, note in ((sinks, sinks_note),
                                                                                      (max_tokens, max_note)))
    return (*shown, stale, share, *boxes)


def open_link(request: gr.Request):
    """The page opened with settings in its address (?schedule=fm&chunk=256&example=...): set
    the controls to them; a value that does not pass its check is dropped with a note."""
    params = getattr(request, "query_params", None) or {}
    chosen, refused = parse_query(params, offered_models())
    for reason in refused:
        gr.Warning(f"The link's {reason}; that setting keeps its default.", title=ERROR_TITLE)
    keys = ("example", "schedule", "growth", "chunk", "memory", "sinks", "max_tokens", "scorer", "rope",
            "question_aware", "model")
    needs = EXAMPLE_SETTINGS.get(chosen.get("example"), {})  # what the link leaves out, the example sets
    updates = [chosen.get(key, needs.get(key, gr.skip())) for key in keys]
    model = chosen.get("model") or default_model()
    doc_updates = (gr.skip(),) * 4
    if "example" in chosen:
        source, question, info = choose_example(chosen["example"], model)[:3]
        doc_updates = (source, question, info, source.doc_id)
    if "question" in chosen:
        doc_updates = (doc_updates[0], chosen["question"], *doc_updates[2:])
    return (*updates, *doc_updates)
