"""The Compare tab's event: configurations run one after another on the Run tab's document, and
what each memory keeps, side by side.

Besides FM, IM and IMDC a configuration may be one cut after a full prefill ("once"): one step
reads the whole document, then the same scorer (question-aware where ticked) cuts every layer's
cache to M once, which is what a press such as SnapKV or ChunkKV does, here with memstep's own
scorer. The kept-token strips of every run share one token axis, with the true answer's place
marked (ui/truths.py), their memory and time beside each.
"""

from __future__ import annotations

import dataclasses
from contextlib import closing

import gradio as gr

from memstep.errors import MemstepError
from memstep.generate import prompt_parts
from memstep.memory import format_bytes
from memstep.schedules import MAX_SIZE_TOKENS, make_schedule

from ui.explain import document_truth_positions
from ui.fields import settle
from ui.handlers import _session, _whole
from ui.figures import compare_kept_figure, compare_memory_figure, compare_sizes_figure
from ui.models import context_tokens, get_model
from ui.runs import MAX_NEW_TOKENS, check_settings, prefill_stream, prepare, settings_from
from ui.summary import ComparedRun, above_weights, compare_headers, compare_rows
from ui.timing import about, cpu_time_measured, modeled_flops, seconds_left, shared_note, timed
from ui.views import compact

ERROR_TITLE = "memstep"
ONCE = "once"  # one cut after a full prefill
CONFIG_FIELDS = 8  # enabled, schedule, growth, chunk, memory, scorer, RoPE positions, question-aware
MEMORY_MAX = 8192  # as the Run tab's memory slider
TIME_NOTE = {
    True: ("Time: the CPU seconds this app's process spent on each configuration (its own work, which other jobs "
           "on the machine barely change; wall seconds beside them), and the planner's modeled FLOPs, which no load "
           "changes. Ratios against the first FM configuration; memory columns do not depend on the load."),
    False: ("Time: wall seconds of each configuration on the device, and the planner's modeled FLOPs. Ratios "
            "against the first FM configuration."),
}


def _fail(err: Exception):
    raise gr.Error(str(err), title=ERROR_TITLE, print_exception=False) from err


def _configs(values) -> list[tuple]:
    return [tuple(values[i:i + CONFIG_FIELDS]) for i in range(0, len(values), CONFIG_FIELDS)]


def configuration_settings(index: int, schedule, growth, chunk, memory, scorer, sinks, rope, question_aware):
    """One configuration's settings, a refusal naming the configuration. A one-cut configuration
    takes FM's settings; its chunk (the whole document) is set once the document is known."""
    try:
        return settings_from("fm" if schedule == ONCE else schedule, 16 if schedule == ONCE else chunk, memory,
                             growth, scorer, sinks, rope, question_aware)
    except MemstepError as err:
        raise MemstepError(f"configuration {index}: {err}") from None


def label_of(schedule: str, settings) -> str:
    """'one cut M512 · question-aware' for a one-cut run, else the settings' own label."""
    if schedule != ONCE:
        return settings.label()
    head = f"FM c{settings.chunk} M{settings.memory}"  # what settings.label() starts with
    return f"one cut M{settings.memory}" + settings.label()[len(head):]


def strip_note(run: ComparedRun, cpu: bool) -> str:
    """What a strip's second title line says: its peak memory above the weights and its time."""
    if not run.records:
        return "waiting"
    seconds = sum(run.cpu_seconds or []) if cpu and run.cpu_seconds is not None else sum(r.seconds for r in run.records)
    state = "" if run.result is not None else f" · step {len(run.records)} of {run.steps}"
    return (f"{format_bytes(above_weights(run.records))} above weights · {seconds:.1f} {'CPU-s' if cpu else 's'}"
            + (f" · answer {run.verdict}" if run.result is not None and run.verdict else "") + state)


def outputs(runs: list[ComparedRun], status: str, cpu: bool = True, tokens: int = 0, answer=None, needle=None,
            answer_label: str = "true answer"):
    """The tab's outputs: status, the kept-token strips, the overlaid schedules and memory, the table."""
    traces = [(run.label, run.records) for run in runs]
    kept = compare_kept_figure([(run.label, run.records, strip_note(run, cpu)) for run in runs], tokens,
                               answer=answer, needle=needle, answer_label=answer_label)
    return (status, kept, compare_sizes_figure(traces), compare_memory_figure(traces),
            {"headers": compare_headers(cpu), "data": compare_rows(runs)})


def guard(name: str, least: int, most: int, why: str = "", default=None):
    """A number box's own check (ui/fields.py): out of range, a message naming the field and its
    range, and the box back at the nearest end (an emptied box at ``default``)."""
    def check(value):
        used, note = settle(value, name, least, most, why, default)
        if note:
            gr.Warning(note, title=ERROR_TITLE)
            return gr.update(value=used)
        return gr.skip()

    return check


def chunk_guard(index: int):
    return guard(f"Configuration {index}, chunk", 16, MAX_SIZE_TOKENS, "the least chunk this page runs", default=512)


def memory_guard(index: int):
    return guard(f"Configuration {index}, memory", 0, MEMORY_MAX, "the largest memory this page runs", default=512)


def compare(doc, model, sinks, max_tokens, question, request: gr.Request = None, *config_values,
            progress=gr.Progress()):
    """Run the ticked configurations one after another on the same document; stream the kept-token
    strips, the overlaid plots and the summary table after every step, and say what runs now.
    (``request`` is Gradio's: it comes before the configurations, the remaining inputs.)"""
    session = _session(request)
    try:
        chosen = [(i, c[1]) + (configuration_settings(i, c[1], c[2], c[3], c[4], c[5], sinks, c[6], c[7]),)
                  for i, c in enumerate(_configs(config_values), start=1) if c[0]]
        if not chosen:
            raise MemstepError("no configuration is ticked: tick at least one to compare")
        asked = (question or "").strip()  # what each configuration is asked (the Run tab's question box)
        for i, _, s in chosen:
            if s.question_aware and not asked:
                raise MemstepError(f"configuration {i} is question-aware but the Run tab's question box is empty: type "
                                   "a question there, or untick question-aware (nothing was run)")
        yield ("**Loading the model**: a few seconds (a model not on this machine downloads first)…",
               gr.skip(), gr.skip(), gr.skip(), gr.skip())
        progress(0.0, desc="Loading the model")
        lm = get_model(model, session)
        document = prepare(doc, lm.tokenizer, _whole(max_tokens), context_tokens(lm))
        chosen = [(i, kind, dataclasses.replace(s, chunk=document.tokens) if kind == ONCE else s)
                  for i, kind, s in chosen]
        cpu = cpu_time_measured(lm.device)
        question_tokens = len(prompt_parts(lm.tokenizer, asked).tail) if asked else 0
        truth = getattr(document.source, "truth", None)
        answer = document_truth_positions(document)
        needle = None if document.needle is None else (document.prefix_tokens + document.needle[0],
                                                       document.prefix_tokens + document.needle[1])
        runs, labels = [], set()
        for i, kind, s in chosen:  # check every configuration before running any
            try:
                check_settings(s, document.tokens)
            except MemstepError as err:
                raise MemstepError(f"configuration {i}: {err}") from None
            plan = make_schedule(s.schedule, document.tokens, s.chunk, s.memory, s.growth,
                                 layers=lm.model.config.num_hidden_layers)
            label = label_of(kind, s)
            while label in labels:
                label += "′"
            labels.add(label)
            runs.append(ComparedRun(label, s.schedule if kind != ONCE else ONCE, [], plan.steps,
                                    passkey=None if needle is None else document.source.passkey, needle=needle,
                                    cpu_seconds=[] if cpu else None,
                                    flops=modeled_flops(lm.model.config, plan, s.sinks,
                                                        question_tokens if s.question_aware else 0),
                                    truth=truth))
        for notice in document.notices:
            gr.Warning(notice, title=ERROR_TITLE)
        shown = dict(cpu=cpu, tokens=document.tokens, answer=answer, needle=needle)
        total = sum(r.steps for r in runs)
        done = 0
        name = document.source.name
        yield outputs(runs, f"Running {len(runs)} configurations on **{name}** ({document.tokens:,} tokens)…", **shown)
        for n, ((_, _, s), run) in enumerate(zip(chosen, runs), start=1):
            head = f"**{run.label}** ({n} of {len(runs)})"
            with closing(prefill_stream(model, document.ids, s, question, False, document.notices,
                                        session=session)) as stream:
                for kind, item, seconds in timed(stream):
                    if kind == "step":
                        run.records.append(compact(item))
                        if run.cpu_seconds is not None:
                            run.cpu_seconds.append(seconds)
                        done += 1
                        progress((done, total), desc=f"{run.label}: step {len(run.records)} of {run.steps}",
                                 unit="steps")
                        if len(run.records) == run.steps:
                            now = (f"answering the question from the compressed memory (up to {MAX_NEW_TOKENS} "
                                   "tokens, a few seconds)…" if asked else "finishing…")
                        else:
                            left = seconds_left(sum(r.seconds for r in run.records), item.tokens_seen,
                                                document.tokens)
                            now = (f"step {len(run.records)} of {run.steps} done"
                                   + (f", {about(left)} left for this configuration" if left else "") + "…")
                    elif kind == "result":
                        item.steps = run.records
                        run.result = item
                        now = "done."
                    else:
                        continue
                    yield outputs(runs, f"{head}: {now}", **shown)
        note = shared_note() if cpu else None
        where = ("The dotted line marks the true answer." if answer is not None else
                 "This document has no known answer to mark." if truth is None else
                 "The true answer lies beyond the part read (max tokens).")
        yield outputs(runs, f"**Done**: {len(runs)} configurations on **{name}**, {document.tokens:,} tokens "
                            f"({len(document.ids):,} document tokens). {where} {TIME_NOTE[cpu]}"
                            + (f" ({note.capitalize()}.)" if note else "") + " " + " ".join(document.notices), **shown)
    except MemstepError as err:
        _fail(err)
