"""The Compress tab's block-influence section (ShortGPT): score every layer of the Run tab's
model by how little it turns the hidden state, watch the scores arrive layer by layer, then
the layers with the lowest influence drop out one by one; the shallower model is measured
against the dense model and uniform removal and loads into the Run tab in one click.

The figure is a pure function of the run's events (tested without a browser); ``run_drop``
streams it; ``build_section`` wires Gradio. The table is LaCo's (the same measurements)."""

from __future__ import annotations

import time

import gradio as gr
import plotly.graph_objects as go

from memstep.cancel import Cancelled
from memstep.compress.drop import REMOVE_FRACTION, default_remove
from memstep.compress.laco import CALIBRATION_SENTENCES, CALIBRATION_TOKENS
from memstep.errors import MemstepError

from ui import compressed, estimates, jobs
from ui.inputs import flag
from ui.tabs.compress.laco import (APP_PROBE, APP_REPEATS, MAX_SENTENCES, MAX_TOKENS, TABLE_HEADERS, TABLE_WIDTHS,
                                   _int, _slug, phone_layout, table_rows)

KEPT, DROPPED = "#94a3b8", "#dc2626"
INTRO = """**Block influence** (ShortGPT, Men et al. 2024) scores each layer by 1 − the cosine similarity of
its input and output hidden states on a few calibration sentences: a layer that barely turns the hidden state
does little. The layers with the lowest scores are dropped at once. It is the simple baseline LaCo is measured
against; the shallower model is measured like LaCo's (perplexity on held-out *Pride and Prejudice*, passkey,
prefill CPU seconds) beside the dense model and uniformly spaced removal."""


def influence_figure(scores: list[float], dropped: list[int], depth: int, height: int = 380) -> go.Figure:
    """One bar per layer scored so far (the score: 1 − cos(input, output)); red the dropped ones."""
    fig = go.Figure()
    drop = set(dropped)
    for name, color, keep in (("kept", KEPT, False), ("dropped (lowest influence)", DROPPED, True)):
        layers = [i for i in range(len(scores)) if (i in drop) == keep]
        fig.add_trace(go.Bar(x=layers, y=[scores[i] for i in layers], name=name, marker_color=color,
                             customdata=[[dropped.index(i) + 1 if i in drop else None] for i in layers],
                             hovertemplate="layer %{x}: influence %{y:.4f}<extra></extra>"))
    phone_layout(fig, "Block influence of each layer<br>(1 − cos(input, output))", height, 60)
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text="layer", range=[-0.5, max(depth, 1) - 0.5], tickmode="auto", nticks=16)
    fig.update_yaxes(title_text="block influence", type="log" if scores and min(scores) > 0 else "linear",
                     gridcolor="#eef0f3")
    return fig


def status_html(text: str, progress: float | None = None) -> str:
    from ui.summary import stat_cards

    return stat_cards([("drop-state", "Block influence", text)], progress)


def _settings(remove, sentences, tokens) -> dict:
    return dict(remove=_int(remove, "layers to drop", 0),
                sentences=_int(sentences, "calibration sentences", 1, MAX_SENTENCES),
                tokens=_int(tokens, "tokens per sentence", 2, MAX_TOKENS))


def _estimate(lm, settings: dict, evaluate: bool) -> float:
    from memstep.engine import model_shape

    shape = model_shape(lm.model)
    # LaCo's count with no candidate: the calibration forward, then the models measured (an upper bound: 4 of them)
    return estimates.seconds(*estimates.laco_work(
        shape, sentences=settings["sentences"], tokens=settings["tokens"], C=2, L=0, H=1, evaluate=bool(evaluate),
        probe=APP_PROBE, repeats=APP_REPEATS), shape, compressed.weight_bytes(lm.model))


def estimate_note(model_spec, remove, sentences, tokens, evaluate, request: gr.Request = None) -> str:
    from ui.models import get_model

    if not compressed.compress_enabled():
        return ""
    try:
        settings = _settings(remove, sentences, tokens)
        lm = get_model(model_spec, jobs.session_of(request))
        return f"estimated **{estimates.duration(_estimate(lm, settings, flag(evaluate, 'measure')))}** on this machine"
    except MemstepError as err:
        return f"cannot run: {err}"


def run_drop(model_spec, remove, sentences, tokens, evaluate, request: gr.Request = None):
    """Stream (status, influence figure, table, load button, saved model)."""
    from memstep.compress.data import calibration_texts
    from memstep.compress.drop import DropRun
    from memstep.compress.quality import make_probe

    from ui.models import forget, get_model

    session, reservation = jobs.session_of(request), None
    try:
        compressed.check_enabled()
        settings, evaluate = _settings(remove, sentences, tokens), flag(evaluate, "measure")
        lm = get_model(model_spec, session)
        depth = len(lm.model.model.layers)
        settings["remove"] = settings["remove"] or default_remove(depth)
        estimate = _estimate(lm, settings, evaluate)
        name = f"{_slug(lm.name)}-block-influence-drop{settings['remove']}-cal{settings['sentences']}x{settings['tokens']}"
        reservation = compressed.Reservation(session, name, compressed.weight_bytes(lm.model))
        forget(str(reservation.path))  # an earlier model of that name, loaded, is about to be replaced
        run = DropRun(lm, calibration_texts(settings["sentences"]), remove=settings["remove"],
                      probe=make_probe(lm.tokenizer, **APP_PROBE) if evaluate else None, output=reservation.path,
                      repeats=APP_REPEATS, max_tokens=settings["tokens"])
    except MemstepError as err:
        if reservation is not None:
            reservation.release()
        raise gr.Error(str(err), print_exception=False) from None
    scores, dropped, models, skip = [], [], {}, gr.skip()
    state, progress = f"scoring the layers… (estimated {estimates.duration(estimate)})", 0.0
    measured_total = 3 if evaluate else 0
    try:
        yield status_html(state, progress), influence_figure([], [], depth), [], gr.update(interactive=False), None
        began = time.monotonic()
        for event in jobs.stream(lambda: iter(run), session):
            if event is jobs.HEARTBEAT:
                yield status_html(f"{state} · {time.monotonic() - began:.0f} s", progress), skip, skip, skip, skip
                continue
            kind = event["event"]
            if kind == "influence":
                scores.append(event["influence"])
                state = f"layer {event['layer']}: influence {event['influence']:.4f}"
                progress = 0.3 * len(scores) / depth
            elif kind == "drop":
                dropped.append(event["layer"])
                state = (f"drop {event['rank']} of {settings['remove']}: layer {event['layer']} (influence "
                         f"{event['influence']:.4f}) · {event['layers_after']} layers")
                progress = 0.3 + 0.2 * len(dropped) / settings["remove"]
            elif kind == "model":
                models[event["key"]] = event
                state = f"measured {event['label']}: perplexity {event['perplexity']:.2f}"
                progress = 0.5 + 0.5 * len(models) / max(measured_total, 1)
            elif kind == "saved":
                state = f"saved the shallower model as {compressed.shown(event['folder'])}"
            else:
                continue
            yield status_html(state, progress), influence_figure(scores, dropped, depth), table_rows(models), skip, skip
    except Cancelled:
        yield (status_html(f"stopped after {len(scores)} of {depth} layers scored · nothing saved", progress),
               skip, skip, skip, skip)
        return
    except MemstepError as err:
        raise gr.Error(str(err), print_exception=False) from None
    finally:
        reservation.release()
    result = run.search.result
    done = (f"done: {result.layers_before} → {result.layers_after} layers, dropped "
            f"{', '.join(map(str, result.removed))} · ready to load into Run")
    yield (status_html(done, 1.0), influence_figure(scores, dropped, depth), table_rows(models),
           gr.update(interactive=bool(run.report["saved"])),
           compressed.token(run.report["saved"], session) if run.report["saved"] else None)


def stop_drop(request: gr.Request = None):
    jobs.stop(jobs.session_of(request))
    return status_html("stopped · nothing saved")


load_into_run = compressed.loader("drop layers first: there is no shallower model to load")


def build_section(model_box=None, tabs=None) -> dict:
    gr.Markdown(INTRO, elem_classes="memstep-note")
    model_input = model_box if model_box is not None else gr.State(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            remove = gr.Number(0, label=f"layers to drop (0: {REMOVE_FRACTION:.0%} of them, as ShortGPT)", precision=0,
                               minimum=0, elem_id="drop-remove")
            with gr.Row():
                sentences = gr.Number(CALIBRATION_SENTENCES, label=f"calibration sentences (≤ {MAX_SENTENCES})",
                                      precision=0, minimum=1, maximum=MAX_SENTENCES, elem_id="drop-sentences")
                tokens = gr.Number(CALIBRATION_TOKENS, label=f"tokens each (≤ {MAX_TOKENS})", precision=0, minimum=2,
                                   maximum=MAX_TOKENS, elem_id="drop-tokens")
            evaluate = gr.Checkbox(True, label="measure against the dense model and uniform removal",
                                   elem_id="drop-evaluate")
            with gr.Row(equal_height=True):
                start = gr.Button("Drop layers", variant="primary", elem_id="drop-run",
                                  interactive=compressed.compress_enabled(), min_width=100)
                stop = gr.Button("Stop", variant="stop", elem_id="drop-stop", min_width=80)
            gr.Markdown(estimate_note, inputs=[model_input, remove, sentences, tokens, evaluate],
                        elem_id="drop-estimate", elem_classes="memstep-note")
            load = gr.Button("Load the shallower model into Run", interactive=False, elem_id="drop-load")
            if not compressed.compress_enabled():
                gr.Markdown(compressed.DISABLED, elem_classes="memstep-note")
        with gr.Column(scale=8):
            status = gr.HTML(status_html("not run yet" if compressed.compress_enabled() else "off in this public app"),
                             elem_id="drop-status")
            plot = gr.Plot(influence_figure([], [], 30), show_label=False, elem_id="drop-influence")
            table = gr.Dataframe(headers=TABLE_HEADERS, interactive=False, wrap=True, elem_id="drop-table",
                                 column_widths=TABLE_WIDTHS, label="quality and cost against the dense model")
    folder = gr.State(None)
    running = start.click(run_drop, [model_input, remove, sentences, tokens, evaluate], [status, plot, table, load, folder],
                          concurrency_id="prefill", concurrency_limit=1, show_progress="minimal",
                          show_progress_on=[status], api_visibility="private")
    stop.click(stop_drop, None, [status], cancels=[running], concurrency_limit=None, api_visibility="private")
    if model_box is not None and tabs is not None:
        load.click(load_into_run, [folder], [model_box, tabs], concurrency_limit=None, api_visibility="private").then(
            None, js=compressed.SHOW_MODEL_JS, api_visibility="private")
    return {"run": start, "status": status, "plot": plot, "table": table, "load": load}
