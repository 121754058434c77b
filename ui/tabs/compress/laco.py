"""The Compress tab's LaCo section: collapse the Run tab's model layer by layer and watch the
search walk down the stack (each candidate's similarity against T), the layer map (which
layers merged into which, which were removed, and what the baselines remove), then the
quality and cost table against the dense model and the baselines. One click loads the
collapsed model into the Run tab.

Figures and the table are pure functions of the run's events (tested without a browser);
``run_laco`` streams them; ``build_section`` wires Gradio."""

from __future__ import annotations

import re
import time

import gradio as gr
import plotly.graph_objects as go

from memstep.cancel import Cancelled
from memstep.compress.guard import CHECK_WINDOWS
from memstep.compress.laco import (CALIBRATION_SENTENCES, CALIBRATION_TOKENS, DEFAULTS, MERGES, REFERENCES,
                                    VARIANTS)
from memstep.errors import MemstepError

from ui import compressed, estimates, jobs
from ui.inputs import choice, flag, real
from ui.theme import FONT, chart_template

LEGEND_ROOM = 70  # the legend at the foot of a figure may wrap to three rows on a phone
ACCEPT, REJECT, THRESHOLD = "#16a34a", "#94a3b8", "#dc2626"
MAP_COLORS = {"kept": "#e2e8f0", "base": "#16a34a", "merged": "#f59e0b", "removed": "#ef4444"}
MAX_SENTENCES, MAX_TOKENS = 16, 256  # bounds one request's calibration work
# The app's probe: small, so a whole run (search + 4 models measured) stays around a minute on a CPU.
APP_PROBE = dict(windows=4, passkey_cases=3, passkey_tokens=1024, prefill_tokens=2048)
APP_REPEATS = 2  # timed prefills per model, the best counts: one is at the mercy of other load
TABLE_HEADERS = ["model", "layers", "removed", "params · weights", "KV / token", "perplexity (vs dense)", "passkey",
                 "prefill CPU s (saved)"]
TABLE_WIDTHS = ["19%", "7%", "17%", "14%", "9%", "13%", "8%", "13%"]
INTRO = """**LaCo** (layer collapse, EMNLP 2024 Findings) merges rear layers into an earlier one and removes
them: from layer l = H − C down to L, layers l+1 … l+C−1 are merged into layer l as
θ<sub>l</sub> + Σ<sub>k</sub> (θ<sub>l+k</sub> − θ<sub>l</sub>) (attention and MLP weights; layer l's norms stay).
A merge is kept when the final hidden states of the candidate stay close to the dense model's on a few
calibration sentences (mean cosine similarity above **T**); then the search steps down by **I**, else by 1.
The model is the one chosen on the **Run** tab. Afterwards the collapsed model, the dense one and two
layer-removal baselines at the same number of layers (block influence as in ShortGPT, uniformly spaced)
are measured on held-out text (*Pride and Prejudice*; calibration comes from *Persuasion*).
**The collapsed model is saved only if the check finds it no worse than dropping the same number of layers
by block influence** (held-out perplexity); tick *keep a worse model* to save it anyway."""
KEEP_BOX = "keep a worse model"
KEEP_NAME = f"ticking “{KEEP_BOX}”"  # how the page's refusal names the way to save anyway


# ---- pure figure and table builders ---------------------------------------------------------------
def phone_layout(fig: go.Figure, title: str, height: int, bottom: int) -> None:
    """Laid out for a phone too: a two-line title at the top, the legend at the foot, ticks Plotly spaces."""
    fig.update_layout(template=chart_template(), height=height + LEGEND_ROOM, font=FONT,
                      margin=dict(l=60, r=20, t=76, b=bottom + LEGEND_ROOM),
                      title=dict(text=title, x=0.0, xref="container", xanchor="left", y=1.0, yref="container",
                                 yanchor="top", pad=dict(t=14, l=12), font=dict(size=14)),
                      legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", xref="container",
                                  x=0.0, xanchor="left"))


def similarity_figure(candidates: list[dict], threshold: float, depth: int | None, height: int = 360) -> go.Figure:
    """Each candidate's similarity against T, by the original index of its base layer; the
    x axis runs from the top layer down, as the search walks."""
    fig = go.Figure()
    for accepted, color, name in ((True, ACCEPT, "merged (above T)"), (False, REJECT, "kept apart (at or below T)")):
        rows = [c for c in candidates if c["accepted"] == accepted]
        fig.add_trace(go.Scatter(
            x=[c["layers"][0] for c in rows], y=[c["similarity"] for c in rows], mode="markers", name=name,
            marker=dict(color=color, size=11, symbol="circle" if accepted else "circle-open", line=dict(width=2)),
            customdata=[[c["step"] + 1, ", ".join(map(str, c["layers"])), c["layers_after"]] for c in rows],
            hovertemplate="candidate %{customdata[0]}<br>layers %{customdata[1]}<br>similarity %{y:.4f}"
                          "<br>model then has %{customdata[2]} layers<extra></extra>"))
    if candidates:
        order = sorted(candidates, key=lambda c: c["step"])
        fig.add_trace(go.Scatter(x=[c["layers"][0] for c in order], y=[c["similarity"] for c in order],
                                 mode="lines", line=dict(color="#cbd5e1", width=1), hoverinfo="skip",
                                 showlegend=False))
        last = order[-1]
        fig.add_annotation(x=last["layers"][0], y=last["similarity"], text=f"candidate {last['step'] + 1}",
                           showarrow=True, arrowhead=2, ay=-30, font=dict(size=11))
    fig.add_hline(y=threshold, line=dict(color=THRESHOLD, width=1.5, dash="dash"),
                  annotation_text=f"T = {threshold:g}", annotation_position="top left",
                  annotation_font=dict(color=THRESHOLD, size=11))
    top = max(depth or 1, 1) - 1
    phone_layout(fig, "LaCo search: similarity of each<br>candidate to the dense model", height, 76)
    fig.update_xaxes(title_text="base layer l (original numbering;<br>the search walks right)",
                     range=[top + 0.5, -0.5], tickmode="auto", nticks=10, showline=True, linecolor="#9ca3af")
    low = min([c["similarity"] for c in candidates] + [threshold, 0.0])
    fig.update_yaxes(title_text="mean cosine similarity", range=[min(low - 0.05, 0), 1.05], gridcolor="#eef0f3")
    return fig


def layer_rows(depth: int, groups: list[list[int]] | None, baselines: dict[str, list[int]]) -> list[tuple]:
    """(row label, per-layer state, per-layer text) for the map: LaCo's groups, then each
    baseline's removed layers."""
    rows = []
    if groups is not None:
        state, text = ["kept"] * depth, [""] * depth
        for group in groups:
            if len(group) > 1:
                state[group[0]], text[group[0]] = "base", f"+{len(group) - 1}"
                for i in group[1:]:
                    state[i], text[i] = "merged", f"→{group[0]}"
        rows.append(("LaCo", state, text))
    for label, removed in baselines.items():
        state = ["removed" if i in set(removed) else "kept" for i in range(depth)]
        rows.append((label, state, ["×" if s == "removed" else "" for s in state]))
    return rows


def _method_label(name: str) -> str:
    """A method's name on short lines: the map's columns are a phone's width divided by four."""
    import textwrap

    return "<br>".join(textwrap.wrap(name, 11, break_long_words=False)) or name


def layer_map_figure(depth: int, groups: list[list[int]] | None, baselines: dict[str, list[int]] | None = None,
                     height: int | None = None) -> go.Figure:
    """One column per method, one row per original layer (layer 0 at the top): green a LaCo
    base that absorbed layers (+n), orange a layer merged into the base it points to (→b), red
    a layer a baseline removes (×), grey a layer kept as it was. Layers run down the figure so
    each cell is wide enough for its text on a phone as on a laptop."""
    rows = layer_rows(depth, groups, baselines or {})
    names = list(MAP_COLORS)
    code = {name: i for i, name in enumerate(names)}
    scale = []
    for i, name in enumerate(names):
        scale += [[i / len(names), MAP_COLORS[name]], [(i + 1) / len(names), MAP_COLORS[name]]]
    fig = go.Figure(go.Heatmap(
        z=[[code[state[layer]] for _, state, _ in rows] for layer in range(depth)], x=[r[0] for r in rows],
        y=list(range(depth)), text=[[text[layer] for _, _, text in rows] for layer in range(depth)],
        texttemplate="%{text}", textfont=dict(size=11), colorscale=scale, zmin=-0.5, zmax=len(names) - 0.5,
        showscale=False, xgap=4, ygap=2, customdata=[[state[layer] for _, state, _ in rows] for layer in range(depth)],
        hovertemplate="%{x}, layer %{y}: %{customdata} %{text}<extra></extra>"))
    for name, label in (("base", "LaCo: merged into (+n layers)"), ("merged", "LaCo: merged away (→ base)"),
                        ("removed", "baseline: removed"), ("kept", "kept as is")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label,
                                 marker=dict(color=MAP_COLORS[name], size=11, symbol="square")))
    fig.update_layout(template=chart_template(), height=height or 190 + LEGEND_ROOM + 18 * depth, font=FONT,
                      margin=dict(l=60, r=20, t=110, b=20 + LEGEND_ROOM),
                      title=dict(text="Layer map", x=0.0, xref="container", xanchor="left", y=1.0, yref="container",
                                 yanchor="top", pad=dict(t=14, l=12), font=dict(size=14)),
                      legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", xref="container",
                                  x=0.0, xanchor="left"),
                      plot_bgcolor="white")
    fig.update_xaxes(side="top", showgrid=False, zeroline=False, tickmode="array", tickvals=[r[0] for r in rows],
                     ticktext=[_method_label(r[0]) for r in rows])
    fig.update_yaxes(title_text="original layer", autorange="reversed", tickmode="auto", nticks=16, showgrid=False,
                     zeroline=False)
    return fig


def _pct(x: float) -> str:
    return f"{x:+.0%}".replace("+", "−" if x < 0 else "+") if x else "0%"


def table_rows(models: dict) -> list[list]:
    """The quality and cost table: one row per measured model, ratios against the dense one.
    Prefill time is the process's CPU seconds: on a shared CPU wall seconds follow the other
    jobs far more than the model."""
    dense = models.get("dense")
    rows = []
    for key, row in models.items():
        removed = row.get("removed")
        removed_text = "—" if key == "dense" else (", ".join(map(str, removed)) if removed is not None else "")
        ppl = f"{row['perplexity']:,.2f}" + (f" (×{row['perplexity'] / dense['perplexity']:.2f})" if dense else "")
        seconds = "—" if row.get("prefill_cpu_seconds") is None else f"{row['prefill_cpu_seconds']:.2f}"
        if dense and key != "dense" and row.get("prefill_cpu_seconds") is not None:
            seconds += f" ({1 - row['prefill_cpu_seconds'] / dense['prefill_cpu_seconds']:.0%})"
        acc = "—" if row["passkey_accuracy"] is None else (
            f"{sum(row['passkey_correct'])}/{len(row['passkey_correct'])}")
        rows.append([row["label"], row["layers"], removed_text,
                     f"{row['params'] / 1e6:,.1f}\u00a0M · {row['weight_bytes'] / 2**20:,.0f}\u00a0MiB",
                     f"{row['kv_bytes_per_token'] / 1024:,.1f}\u00a0KiB", ppl, acc, seconds])
    return rows


def status_html(text: str, progress: float | None = None) -> str:
    from ui.summary import stat_cards

    return stat_cards([("laco-state", "LaCo", text)], progress)


# ---- the run --------------------------------------------------------------------------------------
def _slug(model_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", model_name.split("/")[-1].lower()).strip("-") or "model"


def folder_name(model_name: str, settings: dict) -> str:
    """A folder name in the app's store (ui/compressed.py) that says what made the model."""
    base = _slug(model_name)
    s = settings
    return (f"{base}-laco-{s['variant']}-{s['reference']}-C{s['C']}L{s['L']}H{s['H']}I{s['I']}T{s['T']:g}"
            f"-cal{s['sentences']}x{s['tokens']}" + ("-run" if s.get("merge") == "run" else ""))


def _int(value, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # the page sends numbers: so must a caller
        raise MemstepError(f"{name} must be a whole number (got {str(value)[:40]!r})")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise MemstepError(f"{name} must be a whole number (got {value!r})") from None
    if number != value and not (isinstance(value, float) and value.is_integer()):
        raise MemstepError(f"{name} must be a whole number (got {value!r})")
    if number < low or (high is not None and number > high):
        raise MemstepError(f"{name} must be between {low} and {high} (got {number})" if high is not None
                           else f"{name} must be at least {low} (got {number})")
    return number


def _settings(C, L, H, I, T, variant, reference, sentences, tokens, merge) -> dict:  # noqa: E741
    """The page's LaCo settings checked (one readable line for a bad one)."""
    settings = dict(C=_int(C, "C", 2), L=_int(L, "L", 0), H=_int(H, "H", 0), I=_int(I, "I", 1),
                    sentences=_int(sentences, "calibration sentences", 1, MAX_SENTENCES),
                    tokens=_int(tokens, "tokens per sentence", 2, MAX_TOKENS),
                    variant=choice(variant, "merge", VARIANTS, "paper"),
                    reference=choice(reference, "compare candidates with", REFERENCES, "dense"),
                    merge=choice(merge, "merge into a merged layer", MERGES, "chained"))
    settings["T"] = real(T, "T")
    return settings


def _estimate(lm, settings: dict, evaluate: bool) -> float:
    from memstep.engine import model_shape

    shape = model_shape(lm.model)
    return estimates.seconds(*estimates.laco_work(
        shape, sentences=settings["sentences"], tokens=settings["tokens"], C=settings["C"], L=settings["L"],
        H=settings["H"], evaluate=bool(evaluate), probe=APP_PROBE, repeats=APP_REPEATS, check=not evaluate), shape,
        compressed.weight_bytes(lm.model))


def estimate_note(model_spec, C, L, H, T, sentences, tokens, evaluate, request: gr.Request = None) -> str:
    """What the run would take, shown beside the Collapse button before it is pressed (recomputed
    whenever a setting changes); a bad setting says so instead."""
    from ui.models import get_model

    if not compressed.compress_enabled():
        return ""
    try:
        settings = _settings(C, L, H, 1, T, "paper", "dense", sentences, tokens, "chained")
        lm = get_model(model_spec, jobs.session_of(request))
        settings["H"] = settings["H"] or len(lm.model.model.layers) - 1
        return f"estimated **{estimates.duration(_estimate(lm, settings, flag(evaluate, 'measure')))}** on this machine"
    except MemstepError as err:
        return f"cannot run: {err}"


def run_laco(model_spec, C, L, H, I, T, variant, reference, sentences, tokens, evaluate,  # noqa: E741
             merge="chained", keep_worse=False, request: gr.Request = None):
    """Stream (status, similarity plot, layer map, guard verdict, table, load button, saved model,
    keep-the-baseline button, the baseline's layers). The work runs in a job of its own
    (ui/jobs.py): Stop, a cancelled request or a visitor gone end it within seconds. One press
    starts it: the estimate stands beside the button beforehand. With ``evaluate`` off the check
    alone runs (perplexity of the dense model, LaCo and block influence); either way the model is
    saved only when the check finds it no worse, or ``keep_worse``."""
    from memstep.compress.collapse_run import LABELS, CollapseRun
    from memstep.compress.data import calibration_texts
    from memstep.compress.laco import settings_warnings
    from memstep.compress.quality import make_check_probe, make_probe

    from ui.models import forget, get_model

    session, reservation = jobs.session_of(request), None
    try:
        compressed.check_enabled()
        settings = _settings(C, L, H, I, T, variant, reference, sentences, tokens, merge)
        variant, reference, evaluate = settings["variant"], settings["reference"], flag(evaluate, "measure")
        keep_worse = flag(keep_worse, KEEP_BOX)
        lm = get_model(model_spec, session)
        settings["H"] = settings["H"] or len(lm.model.model.layers) - 1  # 0: the top layer's index, as the notebook
        probe = make_probe(lm.tokenizer, **APP_PROBE) if evaluate else make_check_probe(lm.tokenizer)
        texts = calibration_texts(settings["sentences"])
        estimate = _estimate(lm, settings, evaluate)
        reservation = compressed.Reservation(session, folder_name(lm.name, settings), compressed.weight_bytes(lm.model))
        forget(str(reservation.path))  # an earlier model of that name, loaded, is about to be replaced
        run = CollapseRun(lm, texts, variants=(variant,), probe=probe, output=reservation.path, repeats=APP_REPEATS,
                          C=settings["C"], L=settings["L"], H=settings["H"], I=settings["I"], T=settings["T"],
                          reference=reference, merge=settings["merge"], max_tokens=settings["tokens"],
                          keep_worse=keep_worse, keep_name=KEEP_NAME)
    except MemstepError as err:
        if reservation is not None:
            reservation.release()
        raise gr.Error(str(err), print_exception=False) from None
    for warning in settings_warnings(settings["C"]):
        gr.Warning(warning)
    search = run.searches[variant]
    depth, total = len(search.dense_layers), max(1, search.H - search.C - search.L + 1)
    measured_total = 4 if evaluate else 3  # the check alone: dense, LaCo, block influence
    candidates, groups, baselines, models = [], None, {}, {}
    no_button, skip = gr.update(interactive=False), gr.skip()
    state = f"measuring the dense model's layer inputs… (estimated {estimates.duration(estimate)})"
    progress, began, verdict = 0.0, time.monotonic(), ""
    try:
        yield (status_html(state, progress), similarity_figure([], settings["T"], depth),
               layer_map_figure(depth, [[i] for i in range(depth)]), "", [], no_button, None,
               gr.update(visible=False), None)
        for event in jobs.stream(lambda: iter(run), session):
            if event is jobs.HEARTBEAT:  # nothing new: the clock moves, and a Stop can get in
                yield (status_html(f"{state} · {time.monotonic() - began:.0f} s", progress), *[skip] * 8)
                continue
            kind = event["event"]
            if kind == "candidate":
                candidates.append(event)
                state = (f"candidate {len(candidates)}: layers {', '.join(map(str, event['layers']))} · similarity "
                         f"{event['similarity']:.3f} {'>' if event['accepted'] else '≤'} T → "
                         f"{'merged' if event['accepted'] else 'kept apart'} · {event['layers_after']} layers")
                groups = _groups_so_far(depth, candidates)
                progress = min(len(candidates) / total, 1.0) * (0.5 if evaluate else 1.0)
            elif kind == "result":
                groups = event["groups"]
                state = (f"search done: {event['layers_before']} → {event['layers_after']} layers "
                         f"({event['pruning_ratio']:.0%} of the layers removed) in {event['seconds']:.1f} s")
                progress = 0.5 if evaluate else 0.95
            elif kind == "saved":
                state = f"saved the collapsed model as {compressed.shown(event['folder'])}"
                if event.get("kept_worse"):
                    verdict = verdict_html(run.report["guard"], kept=True)
            elif kind == "refused":
                state = "not saved: the check finds LaCo's model worse"
                verdict = verdict_html(run.report["guard"], refused=event["message"])
            elif kind == "guard":
                verdict = verdict_html(event)
                state = "compared with block influence at the same layer count"
            elif kind == "model":
                models[event["key"]] = event
                if "removed" in event and event["key"] in ("block-influence", "uniform"):
                    baselines[LABELS[event["key"]]] = event["removed"]
                state = f"measured {event['label']}: perplexity {event['perplexity']:.2f}"
                progress = 0.5 + 0.5 * min(len(models) / measured_total, 1.0)
            else:
                continue
            yield (status_html(state, progress), similarity_figure(candidates, settings["T"], depth),
                   layer_map_figure(depth, groups, baselines), verdict, table_rows(models), no_button, None, skip, skip)
    except Cancelled:
        where = f"after candidate {len(candidates)} of about {total}" if candidates else "before the first candidate"
        yield (status_html(f"stopped {where} · nothing saved", progress), *[skip] * 8)
        return
    except MemstepError as err:
        raise gr.Error(str(err), print_exception=False) from None
    finally:
        reservation.release()
    result = search.result
    if run.report["refused"]:
        after = " · not saved: the check finds it worse than block influence"
    elif not result.removed:
        after = " · lower T or C to collapse more"
    else:
        after = " · ready to load into Run" + (" (kept although worse, as asked)" if run.report["kept_worse"] else "")
    done = (f"done: {result.layers_before} → {result.layers_after} layers, removed "
            f"{', '.join(map(str, result.removed)) or 'none'}{after}")
    worse = bool(run.report["guard"] and run.report["guard"]["worse"])
    baseline = {"spec": model_spec, "removed": models["block-influence"]["removed"]} if worse else None
    yield (status_html(done, 1.0), similarity_figure(candidates, settings["T"], depth),
           layer_map_figure(depth, groups, baselines), verdict, table_rows(models),
           gr.update(interactive=bool(run.report["saved"]), value=LOAD_LABEL),
           compressed.token(run.report["saved"], session) if run.report["saved"] else None,
           gr.update(visible=worse, interactive=worse), baseline)


LOAD_LABEL = "Load the collapsed model into Run"
KEEP_LABEL = "Keep block influence's model instead"


def verdict_html(verdict: dict | None, refused: str | None = None, kept: bool = False) -> str:
    """The guard's verdict above the table: a warning when LaCo did worse, saying whether its
    model was saved (``refused``: the refusal's line; ``kept``: saved as asked although worse)."""
    if verdict is None:  # nothing removed: nothing to compare (and nothing the page's check refuses)
        return ""
    if verdict["worse"]:
        if refused:
            then = (f"<b>Not saved.</b> Keep block influence's model instead, or tick “{KEEP_BOX}” and collapse "
                    "again to save LaCo's anyway.")
        elif kept:
            then = f"<b>Saved anyway</b>, as “{KEEP_BOX}” asked."
        else:
            then = "Keep the baseline's model instead?"
        return (f"<div class='memstep-guard memstep-guard-worse' role='alert'><b>LaCo's model is worse than dropping "
                f"the same {verdict['removed_layers']} layers by block influence:</b> perplexity "
                f"{verdict['perplexity']:,.2f} against {verdict['baseline_perplexity']:,.2f} (dense "
                f"{verdict['dense_perplexity']:,.2f}). {then}</div>")
    return (f"<div class='memstep-guard'>LaCo's model is no worse than block influence at {verdict['layers']} layers: "
            f"perplexity {verdict['perplexity']:,.2f} against {verdict['baseline_perplexity']:,.2f}.</div>")


def keep_baseline(baseline, request: gr.Request = None):
    """Save the block-influence model the run measured (rebuilt from the Run tab's model) in the
    app's store; the load button then loads it."""
    from memstep.compress.baselines import remove_layers
    from memstep.compress.data import save_model

    from ui.models import forget, get_model

    session = jobs.session_of(request)
    try:
        compressed.check_enabled()
        if not isinstance(baseline, dict) or not isinstance(baseline.get("removed"), list):
            raise MemstepError("run LaCo first: there is no baseline to keep")
        lm = get_model(baseline.get("spec"), session)
        depth = len(lm.model.model.layers)
        removed = baseline["removed"]
        if not removed or not all(isinstance(i, int) and 0 <= i < depth for i in removed) or len(removed) >= depth:
            raise MemstepError("the baseline's layers do not fit this model: run LaCo again")
        name = f"{_slug(lm.name)}-block-influence-{'-'.join(map(str, removed))}"
        with compressed.Reservation(session, name, compressed.weight_bytes(lm.model)) as reservation:
            forget(str(reservation.path))  # an earlier model of that name, loaded, is about to be replaced
            model = remove_layers(lm.model, removed, info={"method": "block-influence", "removed": removed})
            save_model(model, lm.tokenizer, reservation.path, info=model.config.memstep_compress)
    except MemstepError as err:
        raise gr.Error(str(err), print_exception=False) from None
    return (gr.update(interactive=True, value="Load block influence's model into Run"),
            compressed.token(reservation.path, session), gr.update(interactive=False, value="Kept: block influence"),
            status_html(f"kept block influence's model (layers {', '.join(map(str, removed))} dropped) as "
                        f"{compressed.shown(reservation.path)} · ready to load into Run", 1.0))


def _groups_so_far(depth: int, candidates: list[dict]) -> list[list[int]]:
    """The groups after the accepted candidates so far (each accepted candidate records the
    original layers its merged layer stands for)."""
    owner = {i: [i] for i in range(depth)}
    for c in candidates:
        if c["accepted"]:
            merged = c["merged"]
            for i in merged:
                owner.pop(i, None)
            owner[merged[0]] = list(merged)
    return [owner[k] for k in sorted(owner)]


load_into_run = compressed.loader("run LaCo first: there is no collapsed model to load")


def stop_laco(request: gr.Request = None):
    jobs.stop(jobs.session_of(request))
    return status_html("stopped · nothing saved")


def build_section(model_box=None, tabs=None) -> dict:
    """The LaCo section, inside an open tab of the Compress tab."""
    gr.Markdown(INTRO, elem_classes="memstep-note")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            with gr.Row():
                C = gr.Number(DEFAULTS["C"], label="C · layers per merge", precision=0, minimum=2, elem_id="laco-c")
                I = gr.Number(DEFAULTS["I"], label="I · step after a merge", precision=0, minimum=1,  # noqa: E741
                              elem_id="laco-i")
            with gr.Row():
                L = gr.Number(DEFAULTS["L"], label="L · lowest base layer", precision=0, minimum=0, elem_id="laco-l")
                H = gr.Number(0, label="H · top layer index (0: the last)", precision=0, minimum=0, elem_id="laco-h")
            T = gr.Slider(0.01, 1.0, value=DEFAULTS["T"], step=0.01, label="T · similarity threshold", elem_id="laco-t")
            variant = gr.Radio([("paper formula", "paper"), ("released notebook", "notebook")], value="paper",
                               label="merge", elem_id="laco-variant",
                               info="notebook: what the authors' code computes (the last merged layer's weights)")
            reference = gr.Radio([("dense model", "dense"), ("model so far", "current")], value="dense",
                                 label="compare candidates with", elem_id="laco-reference")
            merge = gr.Radio([("chained (paper)", "chained"), ("one RDSC per run", "run")], value="chained",
                             label="merge into a merged layer", elem_id="laco-merge",
                             info="run: a window that takes in a merged layer merges the original layers anew")
            with gr.Row():
                sentences = gr.Number(CALIBRATION_SENTENCES, label=f"calibration sentences (≤ {MAX_SENTENCES})",
                                      precision=0, minimum=1, maximum=MAX_SENTENCES, elem_id="laco-sentences")
                tokens = gr.Number(CALIBRATION_TOKENS, label=f"tokens each (≤ {MAX_TOKENS})", precision=0,
                                   minimum=2, maximum=MAX_TOKENS, elem_id="laco-tokens")
            evaluate = gr.Checkbox(True, label="measure against the dense model and baselines",
                                   info=f"perplexity ({APP_PROBE['windows']}×256 held-out tokens), passkey "
                                        f"({APP_PROBE['passkey_cases']} cases at 1k tokens), prefill of "
                                        f"{APP_PROBE['prefill_tokens']} tokens (CPU seconds, best of {APP_REPEATS}), "
                                        "uniform removal. Off: the check alone (perplexity of the dense model, LaCo "
                                        f"and block influence on {CHECK_WINDOWS}×256 tokens)",
                                   elem_id="laco-evaluate")
            keep_worse = gr.Checkbox(False, label=KEEP_BOX, elem_id="laco-keep-worse",
                                     info="save LaCo's model even when the check finds it worse than block "
                                          "influence at the same layer count")
            with gr.Row(equal_height=True):
                start = gr.Button("Collapse", variant="primary", elem_id="laco-run",
                                  interactive=compressed.compress_enabled(), min_width=100)
                stop = gr.Button("Stop", variant="stop", elem_id="laco-stop", min_width=80)
            model_input = model_box if model_box is not None else gr.State(None)
            gr.Markdown(estimate_note, inputs=[model_input, C, L, H, T, sentences, tokens, evaluate],
                        elem_id="laco-estimate", elem_classes="memstep-note")
            load = gr.Button(LOAD_LABEL, interactive=False, elem_id="laco-load")
            if not compressed.compress_enabled():
                gr.Markdown(compressed.DISABLED, elem_classes="memstep-note")
            gr.Markdown("The collapsed model is saved as a model folder: the Run tab takes it like any model "
                        "(fewer layers, less KV per token), and `memstep plan --model FOLDER` (or its "
                        "config.json on the Plan tab) plans it.", elem_classes="memstep-note")
        with gr.Column(scale=8):
            status = gr.HTML(status_html("not run yet" if compressed.compress_enabled() else "off in this public app"),
                             elem_id="laco-status")
            sim_plot = gr.Plot(similarity_figure([], DEFAULTS["T"], 30), show_label=False, elem_id="laco-similarity")
            map_plot = gr.Plot(layer_map_figure(30, [[i] for i in range(30)]), show_label=False, elem_id="laco-map")
            verdict = gr.HTML("", elem_id="laco-verdict")
            table = gr.Dataframe(headers=TABLE_HEADERS, interactive=False, wrap=True, elem_id="laco-table",
                                 column_widths=TABLE_WIDTHS,
                                 label="quality and cost against the dense model and the baselines")
            keep = gr.Button(KEEP_LABEL, visible=False, elem_id="laco-keep")
    folder, baseline = gr.State(None), gr.State(None)
    running = start.click(run_laco, [model_input, C, L, H, I, T, variant, reference, sentences, tokens, evaluate, merge,
                                     keep_worse],
                          [status, sim_plot, map_plot, verdict, table, load, folder, keep, baseline],
                          concurrency_id="prefill", concurrency_limit=1, show_progress="minimal",
                          show_progress_on=[status], api_visibility="private")
    stop.click(stop_laco, None, [status], cancels=[running], concurrency_limit=None, api_visibility="private")
    keep.click(keep_baseline, [baseline], [load, folder, keep, status], concurrency_id="prefill", concurrency_limit=1,
               api_visibility="private")
    if model_box is not None and tabs is not None:
        load.click(load_into_run, [folder], [model_box, tabs], concurrency_limit=None, api_visibility="private").then(
            None, js=compressed.SHOW_MODEL_JS, api_visibility="private")
    return {"run": start, "load": load, "status": status, "similarity": sim_plot, "map": map_plot, "table": table,
            "verdict": verdict, "keep": keep}
