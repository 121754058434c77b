"""The Compress tab's "Pruning + reconstruction" section (memstep.compress.sparse).

One click prunes the Run tab's model once per chosen reconstruction technique (none, LR, BR,
BR+GP, BR+GP+CR), block by block; the per-block error curves stream as the blocks are done,
one colour per technique, solid on the calibration data and dashed on held-out text, so a
technique that fits the calibration data better but held-out text worse (overfitting) shows as
solid and dashed lines moving apart. The table gives perplexities and error reductions; each
technique's pruned model is saved in the app's store (ui/compressed.py) and loads into the Run tab in one click.

Figures and the table are pure functions of the runs' records (tested without a browser).
"""

from __future__ import annotations

import copy
import html
import os
import re
import time

import gradio as gr
import plotly.graph_objects as go

from memstep.cancel import Cancelled
from memstep.compress.sparse import RECONSTRUCTIONS, SparseConfig, SparsePruning
from memstep.errors import MemstepError

from ui import compressed, estimates, jobs
from ui.inputs import names, number, real
from ui.theme import FONT, chart_template

# Bounds on the work one request can cause (the app is meant to be public).
MAX_SAMPLES = 32
MAX_SEQ_LEN = 256
MAX_EPOCHS = 10
MAX_STEPS = 80  # optimizer steps per block: 5 epochs over 32 real + 32 added windows in batches of 4
MAX_PARAMS = int(float(os.environ.get("MEMSTEP_PRUNE_MAX_PARAMS", 6e8)))
HELD_OUT_SAMPLES = 8
TECHNIQUE_LABELS = {"none": "none", "lr": "LR", "br": "BR", "br+gp": "BR+GP", "br+gp+cr": "BR+GP+CR"}
TECHNIQUE_COLORS = {"none": "#94a3b8", "lr": "#f59e0b", "br": "#3b82f6", "br+gp": "#10b981", "br+gp+cr": "#db2777"}
PATTERNS = ["unstructured", "2:4", "4:8"]
LOG_TICKS = [m * 10.0 ** e for e in range(-6, 2) for m in (1, 2, 5)]  # 1-2-5 labels on the log axis
TABLE_HEADERS = ["technique", "calibration windows (real + generated)", "epochs = steps per block",
                 "calib. ppl (dense → pruned)",
                 "held-out ppl (dense → pruned)",
                 "final error calib.", "final error held-out", "error cut vs none (calib. / held-out)",
                 "sparsity", "seconds"]
DEFAULTS = dict(method="wanda", pattern="unstructured", sparsity=0.5, techniques=["none", "br+gp"],
                calibration="text", samples=16, seq_len=128, epochs=5, lr=1e-3)


def folder_name(technique: str) -> str:
    """One name per technique: a re-run replaces the model of the same name (ui/compressed.py)."""
    return f"sparse-{technique.replace('+', '-')}"


# ---- pure figure and table builders ----------------------------------------------------------
def error_figure(runs: list[dict], blocks: int | None = None) -> go.Figure:
    """Per-block normalized error, one colour per technique; solid calibration, dashed held-out.
    ``runs``: [{"technique": ..., "records": [BlockRecord, ...], ...}]."""
    fig = go.Figure()
    for run in runs:
        t, records = run["technique"], run["records"]
        if not records:
            continue
        x = [r.block for r in records]
        for split, key, dash in (("calibration", "error_calibration", "solid"),
                                 ("held-out", "error_held_out", "dash")):
            fig.add_trace(go.Scatter(
                x=x, y=[getattr(r, key) for r in records], mode="lines+markers", name=f"{TECHNIQUE_LABELS[t]}, {split}",
                line=dict(color=TECHNIQUE_COLORS[t], dash=dash, width=2), marker=dict(size=4),
                hovertemplate=f"{TECHNIQUE_LABELS[t]} ({split})<br>block %{{x}}: error %{{y:.4g}}<extra></extra>"))
    # laid out for a phone too: a two-line title at the top, the legend (it wraps) at the foot
    fig.update_layout(template=chart_template(), height=520, font=FONT, hovermode="closest",
                      title=dict(text="Reconstruction error after each block<br>(pruned vs dense hidden states)",
                                 x=0.0, xanchor="left", xref="container", y=1.0, yanchor="top", yref="container",
                                 pad=dict(t=14, l=12), font=dict(size=14)),
                      margin=dict(l=64, r=24, t=80, b=130),
                      legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.0, xref="container",
                                  xanchor="left", x=0.0, font=dict(size=11)))
    if not fig.data:  # nothing pruned yet: a hint instead of empty log axes
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        fig.add_annotation(text="Prune to see the error after each block", x=0.5, y=0.5, xref="paper",
                           yref="paper", showarrow=False, font=dict(size=13, color="#4b5563"))
        return fig
    fig.update_xaxes(title_text="decoder block", range=[-0.5, blocks - 0.5] if blocks else None,
                     tickmode="auto", nticks=16, showline=True,
                     linecolor="#9ca3af")
    fig.update_yaxes(title_text="||pruned − dense||² / ||dense||²", type="log", showline=True,
                     linecolor="#9ca3af", gridcolor="#eef0f3", tickvals=LOG_TICKS,
                     ticktext=[f"{v:g}" for v in LOG_TICKS])
    return fig


def _cut(value: float, reference: float | None) -> str:
    return "—" if reference in (None, 0) else f"{1 - value / reference:+.0%}"


def table_rows(runs: list[dict]) -> list[list]:
    """One row per technique; error cuts are against the 'none' run when it ran."""
    finals = {run["technique"]: run["records"][-1] for run in runs if run["records"]}
    none = finals.get("none")
    rows = []
    for run in runs:
        result, records = run.get("result"), run["records"]
        if not records:
            continue
        last = records[-1]
        done = result is not None
        ppl = result.perplexity if done else None
        cut = "—" if none is None or run["technique"] == "none" else (
            f"{_cut(last.error_calibration, none.error_calibration)} / {_cut(last.error_held_out, none.error_held_out)}")
        rows.append([
            TECHNIQUE_LABELS[run["technique"]] + ("" if done else f" (block {last.block + 1}/{last.blocks})"),
            f"{result.real_windows} + {result.generated_windows}" if done else "…",
            training_text(result) if done else "…",
            f"{ppl['calibration']['dense']:.2f} → {ppl['calibration']['pruned']:.2f}" if done else "…",
            f"{ppl['held_out']['dense']:.2f} → {ppl['held_out']['pruned']:.2f}" if done else "…",
            f"{last.error_calibration:.4g}", f"{last.error_held_out:.4g}", cut,
            f"{result.sparsity:.2%}" if done else f"{last.sparsity:.2%}",
            f"{(result.seconds if done else sum(r.seconds for r in records)):.0f}"])
    return rows


def training_text(result) -> str:
    """How one run trained each block: "5 = 40" (epochs = steps), "—" without reconstruction."""
    if not result.steps:
        return "—"
    return f"{result.epochs} = {result.steps}" if result.epochs else f"{result.steps} steps"


def mix_text(config: SparseConfig) -> str:
    """The calibration mix and the training it makes, before the run: windows, texts, epochs, steps."""
    real = config.samples if config.calibration in ("text", "add") else config.samples - config.generated_samples
    texts = f" drawn from {config.pool_texts} generated texts" if config.generated_samples else ""
    mix = f"{real} real + {config.generated_samples} self-generated windows{texts}"
    if config.reconstruct == "none":
        return mix
    return (f"{mix}; {config.epochs} epochs over {config.recon_windows} windows = {config.training_steps} steps per "
            "block")


# ---- handlers --------------------------------------------------------------------------------
def make_config(method, pattern, sparsity, calibration, samples, seq_len, epochs, lr, technique,
                train="norms") -> SparseConfig:
    """The settings of one run, with the app's caps; MemstepError on a bad value. Reconstruction
    trains ``epochs`` passes over every window, as the reference does: added windows add steps."""
    samples, seq_len, epochs = (number(v, name, 0, 1 << 20) for v, name in
                                ((samples, "samples"), (seq_len, "tokens per sample"), (epochs, "epochs")))
    sparsity, lr = real(sparsity, "sparsity"), real(lr, "the learning rate")
    if not 1 <= samples <= MAX_SAMPLES:
        raise MemstepError(f"samples must be 1-{MAX_SAMPLES} in the app (the CLI takes more)")
    if not 16 <= seq_len <= MAX_SEQ_LEN:
        raise MemstepError(f"tokens per sample must be 16-{MAX_SEQ_LEN} in the app (the CLI takes more)")
    if not 1 <= epochs <= MAX_EPOCHS:
        raise MemstepError(f"epochs must be 1-{MAX_EPOCHS} in the app (the CLI takes more)")
    if not 0 < lr <= 0.1:
        raise MemstepError("the learning rate must lie in (0, 0.1]")
    nm = None if pattern == "unstructured" else pattern
    if pattern not in PATTERNS:
        raise MemstepError(f"unknown sparsity pattern '{pattern}': choose one of {', '.join(PATTERNS)}")
    config = SparseConfig(method=method, sparsity=sparsity, nm=nm, reconstruct=technique,
                          calibration=calibration, samples=samples, seq_len=seq_len,
                          held_out_samples=HELD_OUT_SAMPLES, epochs=epochs, lr=lr,
                          batch_size=min(4, samples), train_params=train).validate()
    if technique != "none" and config.training_steps > MAX_STEPS:
        raise MemstepError(f"{epochs} epochs over {config.recon_windows} windows in batches of {config.batch_size} make "
                           f"{config.training_steps} steps per block: the app runs at most {MAX_STEPS} (fewer epochs "
                           "or samples; the CLI takes more)")
    return config


def _source_model(spec, session: str = ""):
    """The Run tab's model, checked against the app's size cap (pruning works on a copy of it)."""
    from ui.models import get_model

    lm = get_model(spec, session)
    params = sum(p.numel() for p in lm.model.parameters())
    if params > MAX_PARAMS:
        raise MemstepError(f"{lm.name} has {params / 1e9:.1f}B parameters: the app prunes models up to "
                           f"{MAX_PARAMS / 1e9:.1f}B (use `memstep compress sparse` for larger ones)")
    return lm


def _private_copy(lm):
    """A private copy of a loaded model: pruning changes weights in place."""
    from memstep.models import LoadedModel

    return LoadedModel(copy.deepcopy(lm.model), lm.tokenizer, lm.name, lm.device, lm.dtype)


def _configs(method, pattern, sparsity, techniques, calibration, samples, seq_len, epochs, lr, train):
    techniques = [t for t in RECONSTRUCTIONS if t in names(techniques, "techniques", RECONSTRUCTIONS)]
    if not techniques:
        raise MemstepError("tick at least one reconstruction technique")
    return techniques, [make_config(method, pattern, sparsity, calibration, samples, seq_len, epochs, lr, t, train)
                        for t in techniques]


def _estimate(lm, configs) -> float:
    """Seconds for every technique's run; "add" reconstructs on its real and its generated windows,
    and the model writes its texts once, for the first run (the others reuse the windows)."""
    from memstep.engine import model_shape

    shape, needed = model_shape(lm.model), compressed.weight_bytes(lm.model)
    return sum(estimates.seconds(*estimates.sparse_work(
        shape, method=c.method, technique=c.reconstruct, calibration=c.calibration, samples=c.recon_windows,
        seq_len=c.seq_len, held_out=c.held_out_samples, steps=c.training_steps, batch=c.batch_size,
        generated_texts=c.pool_texts if c.generated_samples and i == 0 else 0, self_length=c.self_length),
        shape, needed) for i, c in enumerate(configs))


def estimate_note(spec, method, pattern, sparsity, techniques, calibration, samples, seq_len, epochs, lr,
                  train="norms", request: gr.Request = None) -> str:
    """What the run would take, beside the Prune button before it is pressed, with the windows,
    epochs and steps it trains; a bad setting says so."""
    if not compressed.compress_enabled():
        return ""
    try:
        _, configs = _configs(method, pattern, sparsity, techniques, calibration, samples, seq_len, epochs, lr, train)
        lm = _source_model(spec, jobs.session_of(request))
        trained = next((c for c in configs if c.reconstruct != "none"), configs[0])
        return (f"estimated **{estimates.duration(_estimate(lm, configs))}** on this machine · "
                f"{mix_text(trained)}")
    except MemstepError as err:
        return f"cannot run: {err}"


def prune(spec, method, pattern, sparsity, techniques, calibration, samples, seq_len, epochs, lr, train="norms",
          request: gr.Request = None):
    """Stream (status, figure, table, saved-model dropdown) while each technique prunes the model.
    The work runs in a job of its own (ui/jobs.py): Stop, a cancelled request or a visitor gone end
    it within seconds. One press starts it: the estimate stands beside the button beforehand."""
    from ui.models import forget

    session = jobs.session_of(request)
    reservations: list = []
    try:
        compressed.check_enabled()
        techniques, configs = _configs(method, pattern, sparsity, techniques, calibration, samples, seq_len, epochs,
                                       lr, train)
        lm = _source_model(spec, session)
        needed, estimate = compressed.weight_bytes(lm.model), _estimate(lm, configs)
        compressed.make_room(needed * len(techniques), session=session)  # all of this run's models fit together
        for technique in techniques:
            reservations.append(compressed.Reservation(session, folder_name(technique), needed))
            forget(str(reservations[-1].path))  # an earlier model of that name, loaded, is about to be replaced
    except MemstepError as err:
        for reservation in reservations:
            reservation.release()
        raise gr.Error(str(err)) from err

    def work():
        shared = None  # the calibration windows: the first run makes them (the model writes its texts once)
        for technique, config, reservation in zip(techniques, configs, reservations):
            process = SparsePruning(_private_copy(lm), config, output=str(reservation.path),
                                    info={"app": True, "technique": technique}, calibration=shared)
            yield "start", technique, process
            for record in process:
                yield "block", technique, record
            yield "done", technique, process.result
            shared = process.calibration
            del process

    runs: list[dict] = []
    saved: list[tuple[str, str]] = []
    blocks = len(lm.model.model.layers)
    status, began = f"preparing (estimated {estimates.duration(estimate)})…", time.monotonic()
    try:
        for item in jobs.stream(work, session):
            if item is jobs.HEARTBEAT:  # nothing new: the clock moves, and a Stop can get in
                yield f"{status} · {time.monotonic() - began:.0f} s", gr.skip(), gr.skip(), gr.skip()
                continue
            kind, technique, value = item
            i = techniques.index(technique) + 1
            head = f"**{TECHNIQUE_LABELS[technique]}** ({i}/{len(techniques)})"
            if kind == "start":
                runs.append({"technique": technique, "records": value.records, "result": None})
                status = f"{head}: preparing calibration data ({mix_text(value.config)}) and dense perplexity…"
                yield status, error_figure(runs, blocks), table_rows(runs), gr.update()
            elif kind == "block":
                status = (f"{head}: block {value.block + 1}/{value.blocks} pruned to {value.sparsity:.1%} — error "
                          f"{value.error_calibration:.4g} (calibration), {value.error_held_out:.4g} (held-out)")
                yield status, error_figure(runs, blocks), table_rows(runs), gr.update()
            else:
                runs[-1]["result"] = value
                folder = reservations[i - 1].path
                saved.append((compressed.shown(folder), compressed.token(folder, session)))
                status = f"{head}: done, saved as `{compressed.shown(folder)}`"
                yield status, error_figure(runs, blocks), table_rows(runs), gr.update(choices=saved, value=saved[-1][1])
    except Cancelled:
        yield ("**Stopped.** The curves show the blocks done so far; the technique that was running saved nothing.",
               gr.skip(), gr.skip(),
               gr.update(choices=saved, value=saved[-1][1]) if saved else gr.skip())
        return
    except MemstepError as err:
        raise gr.Error(str(err)) from err
    finally:
        for reservation in reservations:
            reservation.release()
    last = runs[-1]["result"]
    texts = f" drawn from {last.generated_texts} generated texts" if last.generated_windows else ""
    trained = next((r["result"] for r in runs if r["result"].steps), None)
    training = (f"; reconstruction {trained.epochs} epochs over {trained.real_windows + trained.generated_windows} "
                f"windows = {trained.steps} steps per block" if trained else "")
    done = (f"**Done.** Calibration: {last.real_windows} real + {last.generated_windows} self-generated windows of "
            f"{last.settings['seq_len']} tokens{texts}{training}. Solid lines: calibration data; dashed: held-out "
            "text. Pick a pruned model below and load it into the Run tab.")
    if calibration != "text":  # let the user see what the model wrote for itself
        sample = re.sub(r"[\s*_`#\[\]<>|~\\]+", " ", runs[-1]["result"].calibration_preview[-1]).strip()
        done += f" A self-generated calibration sample begins: *{html.escape(sample[:240])}…*"
    yield done, error_figure(runs, blocks), table_rows(runs), gr.update(choices=saved, value=saved[-1][1])


load_into_run = compressed.loader("prune first: there is no pruned model to load yet")


def stop_pruning(request: gr.Request = None):
    jobs.stop(jobs.session_of(request))
    return "**Stopped.** The curves show the blocks done so far."


# ---- layout ----------------------------------------------------------------------------------
def build_section(model_box=None, tabs=None) -> None:
    gr.Markdown(
        "Prunes every linear layer of every decoder block of the **Run tab's model** (embeddings and LM head are "
        "kept), block by block, then fits the surviving weights to the dense model's outputs with the mask fixed "
        "(*Rethinking Pruning LLMs*, EMNLP 2024). **LR**: each layer alone; **BR**: the whole block; **GP**: the "
        "block's targets come from the dense model instead of the dense block on the pruned inputs; **CR**: two "
        "consecutive blocks together. Each ticked technique runs once, one after another.",
        elem_classes="memstep-note")
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=320, elem_id="sparse-controls"):
            method = gr.Radio(["magnitude", "wanda", "sparsegpt"], value=DEFAULTS["method"], label="Mask",
                              elem_id="sparse-method")
            pattern = gr.Radio(PATTERNS, value=DEFAULTS["pattern"], label="Sparsity pattern", elem_id="sparse-pattern")
            sparsity = gr.Slider(0.1, 0.9, value=DEFAULTS["sparsity"], step=0.05, label="Sparsity (unstructured)",
                                 elem_id="sparse-sparsity")
            techniques = gr.CheckboxGroup([(TECHNIQUE_LABELS[t], t) for t in RECONSTRUCTIONS],
                                          value=DEFAULTS["techniques"], label="Reconstruction techniques",
                                          elem_id="sparse-techniques")
            calibration = gr.Radio([("Persuasion (text)", "text"), ("text + self-generated added (reference)", "add"),
                                    ("self-generated", "self"), ("half of each", "both")],
                                   value=DEFAULTS["calibration"], label="Calibration data",
                                   info="added: the model writes a text per sample; as many windows, drawn from them "
                                        "at random offsets, join the real ones (the reference code's gen_add)",
                                   elem_id="sparse-calibration")
            with gr.Row():
                samples = gr.Number(DEFAULTS["samples"], label=f"Samples (1-{MAX_SAMPLES})", precision=0,
                                    elem_id="sparse-samples", min_width=80)
                seq_len = gr.Number(DEFAULTS["seq_len"], label=f"Tokens each (16-{MAX_SEQ_LEN})", precision=0, elem_id="sparse-seq-len", min_width=80)
            with gr.Row():
                epochs = gr.Number(DEFAULTS["epochs"], label=f"Epochs per block (1-{MAX_EPOCHS})", precision=0,
                                   elem_id="sparse-epochs", min_width=80,
                                   info="passes over every window, as the reference trains: more windows, more steps")
                lr = gr.Number(DEFAULTS["lr"], label="Learning rate (Adam)", elem_id="sparse-lr",
                               min_width=80)
            train = gr.Radio([("every block parameter (reference)", "norms"), ("linear weights only", "linear")],
                             value="norms", label="Reconstruction trains", elem_id="sparse-train")
            with gr.Row(equal_height=True):
                start = gr.Button("Prune", variant="primary", elem_id="sparse-run",
                                  interactive=compressed.compress_enabled(), min_width=100)
                stop = gr.Button("Stop", elem_id="sparse-stop", min_width=80)
            model_input = model_box if model_box is not None else gr.State(None)
            gr.Markdown(estimate_note, inputs=[model_input, method, pattern, sparsity, techniques, calibration, samples,
                                               seq_len, epochs, lr, train],
                        elem_id="sparse-estimate", elem_classes="memstep-note")
        with gr.Column(scale=9):
            status = gr.Markdown("Pick a mask, a pattern and the techniques to compare, then **Prune**. The embedded "
                                 "model takes a few minutes per technique on a 2-core CPU."
                                 if compressed.compress_enabled() else compressed.DISABLED, elem_id="sparse-status")
            plot = gr.Plot(error_figure([]), elem_id="sparse-plot", show_label=False)
            table = gr.Dataframe(headers=TABLE_HEADERS, interactive=False, wrap=True, elem_id="sparse-table")
            with gr.Row(equal_height=True):
                pruned = gr.Dropdown([], label="Pruned model", elem_id="sparse-pruned", scale=4)
                load = gr.Button("Load into the Run tab", elem_id="sparse-load", scale=1)
    running = start.click(prune, [model_input, method, pattern, sparsity,
                                  techniques, calibration, samples, seq_len, epochs, lr, train],
                          [status, plot, table, pruned], concurrency_id="prefill", concurrency_limit=1,
                          show_progress="minimal", show_progress_on=[status], api_visibility="private")
    stop.click(stop_pruning, None, [status], cancels=[running], concurrency_limit=None, api_visibility="private")
    if model_box is not None and tabs is not None:
        load.click(load_into_run, [pruned], [model_box, tabs], concurrency_limit=None, api_visibility="private").then(
            None, js=compressed.SHOW_MODEL_JS, api_visibility="private")
