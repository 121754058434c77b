"""The Run tab, in the order of the story it tells: on the left Run, the document, the question,
the schedule, c and M (the rest under "Advanced"); on the right the live status and the answer
beside Run, then the retained-token map tied to the text (point at it, click it), then how the run
went (chunk and memory, bytes, seconds per step), streamed step by step. The event functions
are in ui/handlers.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from memstep.documents import SUPPORTED_EXTENSIONS
from memstep.models import allowed_models, default_model, offered_models
from memstep.presets import AUTO, PRESETS, ROPE_CHOICES, ROPE_HELP
from memstep.schedules import GROWTHS
from memstep.scorers import SCORERS

from ui import handlers, identity, legend
from ui.fields import OpenNumber, OpenSlider
from ui.documents import DEFAULT_EXAMPLE, DOCUMENT_STATE_SECONDS, EXAMPLES, MAX_UPLOAD_BYTES
from ui.runs import DEFAULT_MAX_TOKENS, MAX_SINKS, MAX_TOKENS_LIMIT
from ui.summary import stat_cards
from ui.views import answer_markdown

SCHEDULE_CHOICES = [("full", "full"), ("FM", "fm"), ("IM", "im"), ("IMDC", "imdc")]
# every mode memstep offers (presets.ROPE_CHOICES), the reference's named as such
ROPE_OPTIONS = [(f"{mode} (reference)" if mode == PRESETS["reference"]["rope"] else mode, mode) for mode in ROPE_CHOICES]
ROPE_INFO = ". ".join(f"{mode}: {ROPE_HELP[mode]}" for mode in ROPE_CHOICES) + "."

CHUNK_INFO = ("FM, IM: every chunk is c. IMDC: c sets the steps (⌈tokens/c⌉); chunks then shrink as memory "
              "grows, keeping memory + chunk level.")

RUN_HINT = ("Press **Run** (or Ctrl+Enter): the status above follows each step with the time left; the answer "
            "comes here, beside Run. Then the retained-token map (point at it to read its tokens, click to move "
            "the text and the replay there), the text shaded by what the memory kept, and how it ran: chunk and "
            "memory, bytes and seconds per step.")

GUIDE = """
**Chunk and memory per step.** Each bar is one step: blue is the memory the step starts with (cache
entries per layer, sinks included), orange the chunk it reads; together they are what the step's
attention holds, and the red arrow marks their peak. The dark line is the memory kept after the step,
the dotted line the schedule's budget. FM keeps a fixed memory; IM grows it along the growth curve;
IMDC also shrinks the chunks as memory grows, so memory + chunk stays flat (a lower peak than FM).

{retained}

**Memory per step.** The modeled peak bytes of each step, stacked by component: KV of the memory,
KV of the chunk, the attention and scorer working set, and activations. The weights are constant and
left out so the schedule's effect stays visible. On CUDA a line shows the peak the device measured;
on a CPU there is no such counter and only the model is shown.

**Seconds per step.** Bars: wall-clock seconds of each step (forward pass and eviction); diamonds:
the CPU seconds the app's process spent on it (on a CPU run). On a machine shared with other jobs wall
seconds follow the load, CPU seconds much less: the chart says when the load is above the cores.

{text}
""".format(retained=legend.map_guide(), text=legend.text_guide())


@dataclass
class RunTab:
    """The Run tab's inputs that other tabs read (Compare runs on the same document and model),
    and the controls a link sets (ui/share.py)."""

    doc_state: gr.State
    model: gr.Dropdown
    question: gr.Textbox
    sinks: gr.Number
    max_tokens: gr.Number
    controls: dict = field(default_factory=dict)  # name -> component, for the page's link


# Every chart of the tab saved as PNG in the browser (Plotly's own export, drawn again from its
# layout, so light even in dark mode): nothing to install on the server, works on a Space.
CHARTS_PNG_JS = """() => {
  // the files are named by the run's settings (the state card: "done · FM c256 M256"), like the downloads
  const state = document.querySelector('#stats [data-stat="state"] .memstep-stat-value')?.innerText || "";
  const label = (state.split("·").slice(1).join("·") || "run").trim().toLowerCase().replace(/[^a-z0-9]+/g, "-")
    .replace(/^-|-$/g, "");
  for (const id of ["sizes-plot", "retained-plot", "memory-plot", "seconds-plot", "layers-plot"]) {
    const chart = document.querySelector(`#${id} .js-plotly-plot`);
    if (chart && chart.offsetParent !== null && window.Plotly) {
      window.Plotly.downloadImage(chart, {format: "png", filename: `memstep-${label}-${id.replace("-plot", "")}`,
                                          scale: 2});
    }
  }
}"""


# After Run on a narrow screen (the columns stacked), scroll to the live status.
SHOW_STATUS_JS = """(...inputs) => {
  if (window.innerWidth < 1000) {
    // at once, and again once the run's first update has redrawn the status (a redraw cancels a scroll)
    const show = () => document.querySelector("#stats")?.scrollIntoView({block: "start"});
    show();
    setTimeout(show, 400);
  }
  return inputs;  // the run's inputs, unchanged
}"""

# Stop pressed while a run streams: the status says so at once; the run ends on its own "stopped"
# update once the step under way has finished (a long step takes a while).
STOPPING_JS = """() => {
  const state = document.querySelector('#stats [data-stat="state"] .memstep-stat-value');
  if (!state || !/^(starting|running|reference run)/.test(state.innerText)) return;
  state.innerText = state.innerText.replace(/^(starting|running|reference run)/, "stopping");
  let now = document.querySelector("#memstep-now");
  if (!now) {
    now = document.createElement("p");
    now.className = "memstep-now";
    now.id = "memstep-now";
    document.querySelector("#stats .memstep-stats")?.after(now);
  }
  now.innerText = "stopping… the step under way finishes first, then the run stops (its steps stay for replay)";
}"""

MAP_POINTER = ('<span id="memstep-map-token">Point at the map (or tap it) to read the tokens there; click (or tap '
               "again) to show them in the text and move the replay to that step.</span>")


def _model_choices() -> list[str]:
    return offered_models()  # 'embedded' only where it can load; on a Space also all it accepts


def build_tab() -> RunTab:
    """Build the tab's controls and views inside the current gr.Tab, and wire its events."""
    document = handlers.default_document()
    first_preview, first_note = handlers.preview(document, default_model(), "imdc", "linear", 512, 512, 4,
                                                 DEFAULT_MAX_TOKENS)
    doc_state = gr.State(document, time_to_live=DOCUMENT_STATE_SECONDS)  # (ui/documents.py)
    view_state = gr.State(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=330, elem_id="memstep-controls"):
            # first in the column: visible without scrolling, a few Tab presses away
            with gr.Row(elem_id="run-row"):
                run = gr.Button(identity.RUN_LABEL, variant="primary", elem_id="run", min_width=120)
                stop = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
            # what a newcomer needs: the document, the question, the schedule, c and M
            with gr.Group():
                example = gr.Dropdown(list(EXAMPLES), value=document.example or DEFAULT_EXAMPLE,
                                      label="Example document", elem_id="example")
                upload = gr.File(label=f"…or upload a document ({' '.join(SUPPORTED_EXTENSIONS)}, up to "
                                       f"{MAX_UPLOAD_BYTES // 2**20} MB)",
                                 file_types=list(SUPPORTED_EXTENSIONS), type="filepath", height=150,
                                 elem_id="upload")
            doc_info = gr.Markdown(handlers.describe_document(document, default_model()),
                                   elem_id="doc-info", elem_classes="memstep-note")
            # what the page shows, for Run to carry (ui/identity.py): the document's id, and a mark
            # while a document is being prepared; the hidden button marks an upload's start
            doc_key = gr.Textbox(document.doc_id, visible=False, elem_id="doc-key")
            pending = gr.Textbox("", visible=False, elem_id="doc-pending")
            upload_started = gr.Button("upload started", elem_id="upload-started", elem_classes="memstep-hidden")
            question = gr.Textbox(document.question, label="Question (optional)", lines=1,
                                  elem_id="question")
            schedule = gr.Radio(SCHEDULE_CHOICES, value="imdc", label="Schedule", elem_id="schedule")
            chunk = OpenSlider(16, _chunk_limit(document), value=512, step=16, label="Chunk size c (tokens)", elem_id="chunk",
                              info=CHUNK_INFO)
            memory = OpenSlider(0, handlers.MEMORY_MAX, value=512, step=4, label="Memory size M (tokens)",
                               elem_id="memory", info="Tokens kept after each step, besides the sinks "
                               "(at least the sinks).")
            # the paper's finer settings, folded: each keeps a default that runs
            with gr.Accordion("Advanced: question-aware, growth, sinks, scorer, RoPE, model", open=False,
                              elem_id="advanced"):
                question_aware = gr.Checkbox(False, label="Question-aware", elem_id="question-aware",
                                             info="Also score every step by the question's attention: its "
                                                  "tokens are read after each chunk, then dropped.")
                full_reference = gr.Checkbox(False, label="Also answer from the full cache (reference)",
                                             info="Bundled examples always show it (computed once, then "
                                             "cached); for uploads it is one more prefill.",
                                             elem_id="full-reference")
                growth = gr.Dropdown(list(GROWTHS), value="linear", label="Growth curve (IM and IMDC)",
                                     elem_id="growth")
                with gr.Row():
                    sinks = OpenNumber(4, label="Sinks", minimum=0, maximum=MAX_SINKS, precision=0,
                                       elem_id="sinks", min_width=90)
                    max_tokens = OpenNumber(DEFAULT_MAX_TOKENS, label="Max tokens", minimum=1,
                                            maximum=MAX_TOKENS_LIMIT, precision=0, elem_id="max-tokens",
                                            min_width=90)
                with gr.Row():
                    preset = gr.Dropdown(["none", *PRESETS], value="none", label="Preset", elem_id="preset",
                                         info="reference: the paper's code exactly (conv score, compact "
                                              "positions, 4 sinks, every box below)", min_width=140)
                    scorer = gr.Dropdown(list(SCORERS), value="chunk-attention", label="Scorer",
                                         elem_id="scorer", min_width=140)
                rope = gr.Radio(ROPE_OPTIONS, value=AUTO, label="RoPE positions", info=ROPE_INFO,
                                elem_id="rope")
                ways = gr.CheckboxGroup(handlers.WAY_CHOICES, value=handlers.WAY_DEFAULTS,
                                        label="As the reference code",
                                        info="Ticked: the reference code's way; unticked: memstep's. The "
                                             "reference preset ticks them all.", elem_id="ways")
                model = gr.Dropdown(_model_choices(), value=default_model(),
                                    allow_custom_value=allowed_models() is None,
                                    label="Model", info="'embedded': SmolLM2-135M-Instruct shipped with "
                                    "memstep. 'gemma3-270m': Gemma 3 270M, a base model with sliding-window and "
                                    "global layers, under Google's Gemma terms of use (ai.google.dev/gemma/terms). "
                                    "Or a hub id, a local folder or a .gguf file.",
                                    elem_id="model")
        # the story's order: status and answer first (beside Run), the map and its words, then the how
        with gr.Column(scale=9, elem_id="memstep-results"):
            stats = gr.HTML(stat_cards([("state", "run", "not run yet")]), elem_id="stats")
            stale = gr.Markdown(elem_id="stale-note", elem_classes="memstep-note")
            answer = gr.Markdown(answer_markdown(None), elem_id="answer", container=True)
            with gr.Row(elem_id="keep-row"):
                try_aware = gr.Button("Try question-aware", variant="primary", visible=False,
                                      elem_id="try-question-aware", min_width=160)
                run_json = gr.DownloadButton("Run JSON", visible=False, elem_id="download-json",
                                             min_width=110, variant="secondary")
                steps_csv = gr.DownloadButton("Steps CSV", visible=False, elem_id="download-csv",
                                              min_width=110, variant="secondary")
            run_hint = gr.Markdown(RUN_HINT, elem_id="run-hint", elem_classes="memstep-hint")
            # Hidden until the first streamed update: the page loads without drawing empty plots.
            with gr.Column(visible=False, elem_id="run-views") as run_views:
                # the map and the words side by side from 1,200 px (the page's CSS), stacked below
                with gr.Row(elem_id="map-and-text", equal_height=False):
                    with gr.Column(elem_id="map-column", min_width=0):
                        retained_plot = gr.Plot(show_label=False, elem_id="retained-plot")
                        gr.HTML(MAP_POINTER, elem_id="map-token", elem_classes="memstep-note")
                        replay_step = gr.Slider(0, 1, value=0, step=1, interactive=False, elem_id="replay",
                                                label="Replay: the run after step (0 = before the first)")
                    with gr.Column(elem_id="answer-text", min_width=0):
                        search = gr.Textbox(label="Search the document", placeholder="a word, a name, a number…",
                                            elem_id="search", lines=1, max_lines=1)
                        text = gr.HTML(elem_id="retained-text")
            # the preview (before a run) and the how (after): the schedule, its numbers, its link
            preview_note = gr.Markdown(first_note, elem_id="preview-note", elem_classes="memstep-note")
            share = gr.HTML(elem_id="share-link", elem_classes="memstep-note")
            sizes_plot = gr.Plot(first_preview, label="Chunk and memory per step", show_label=False,
                                 elem_id="sizes-plot")
            with gr.Column(visible=False, elem_id="run-charts") as run_charts:
                with gr.Row():
                    memory_plot = gr.Plot(show_label=False, elem_id="memory-plot", scale=3)
                    seconds_plot = gr.Plot(show_label=False, elem_id="seconds-plot", scale=2)
                layers_plot = gr.Plot(show_label=False, elem_id="layers-plot", visible=False)
                charts_png = gr.Button("Charts as PNG", elem_id="download-png", min_width=120,
                                       variant="secondary")
            with gr.Accordion("How to read these views", open=False):
                gr.Markdown(GUIDE)


    chunk_end = gr.State(None)  # the chunk slider's end as the page holds it (handlers.preview_page)
    # A new document: Run is disabled in the browser at once ("preparing the document…"), before the
    # server builds it, and comes back with it (ui/identity.py).
    preparing = dict(fn=None, inputs=None, outputs=[run, pending], js=identity.PREPARING_JS, api_visibility="private")
    example.input(**preparing)
    upload_started.click(**preparing)
    upload.upload(**preparing)
    ready = [doc_key, pending, run]
    # once a preparation ends, Run follows the settings again (handlers.run_ready)
    run_ready = dict(fn=handlers.run_ready, inputs=[example, doc_state, pending, doc_key, model, schedule, growth,
                                                    chunk, memory, sinks, max_tokens, rope, ways],
                     outputs=[run], concurrency_limit=None, show_progress="hidden", api_visibility="private")
    chosen = example.input(handlers.choose_example, [example, model, chunk, max_tokens, doc_state],
                           [doc_state, question, doc_info, upload, chunk, memory, max_tokens, rope, chunk_end, *ready],
                           concurrency_limit=None, api_visibility="private")
    chosen.success(**run_ready)
    chosen.failure(handlers.preparation_failed, [doc_state], [example, *ready], api_visibility="private").then(
        **run_ready)
    upload.upload(handlers.choose_upload, [upload, doc_state, model, chunk, max_tokens],
                  [doc_state, question, doc_info, upload, example, chunk, chunk_end, *ready],
                  concurrency_limit=None, api_visibility="private").then(**run_ready)
    upload.clear(handlers.preparation_failed, [doc_state], [example, *ready], api_visibility="private").then(
        **run_ready)

    preset.input(handlers.choose_preset, [preset], [scorer, rope, sinks, ways], concurrency_limit=None,
                 api_visibility="private")
    run_outputs = [stats, sizes_plot, retained_plot, memory_plot, seconds_plot, text, answer, replay_step,
                   view_state, run_views, run_hint, layers_plot, try_aware, run_json, steps_csv, run_charts]
    run_inputs = [doc_state, model, schedule, growth, chunk, memory, scorer, sinks, max_tokens, question,
                  full_reference, rope, question_aware, ways, search, example, pending, doc_key]
    # a new document: the last run's answer, map and numbers are of another text ("multiple": it
    # never defers, so it never re-sends the change to the listener that follows the controls)
    doc_state.change(handlers.reset_views, None, [stats, answer, view_state, run_views, run_charts, run_hint,
                                                  try_aware, run_json, steps_csv, text], trigger_mode="multiple",
                     concurrency_limit=None, show_progress="hidden", api_visibility="private")
    searching = dict(trigger_mode="always_last", concurrency_limit=None, show_progress="hidden",
                     api_visibility="private")
    running = dict(concurrency_id="prefill", concurrency_limit=1, show_progress="minimal", show_progress_on=[stats],
                   api_visibility="private")
    failed = dict(fn=handlers.run_failed, inputs=None, outputs=[stats], api_visibility="private",
                  show_progress="hidden")
    # The views that follow the controls (preview, stale-views line, share link) are one listener: see
    # handlers.controls_changed. A run moving the views on (view_state) changes only the stale line.
    follow_inputs = [example, doc_state, model, schedule, growth, chunk, memory, sinks, max_tokens, scorer, rope, ways,
                     question_aware, question, view_state, chunk_end]
    gr.on([c.change for c in follow_inputs if c not in (view_state, chunk_end)], handlers.controls_changed,
          follow_inputs, [sizes_plot, preview_note, run, chunk, memory, chunk_end, stale, share, sinks, max_tokens],
          trigger_mode="always_last", concurrency_limit=None, show_progress="hidden", api_visibility="private")
    view_state.change(handlers.stale_note, [view_state, schedule, growth, chunk, memory, scorer, sinks, rope,
                                            question_aware, question, ways], [stale],
                      trigger_mode="always_last", concurrency_limit=None, show_progress="hidden",
                      api_visibility="private")
    # on a phone the status sits below the controls: Run brings it into view
    run.click(handlers.run_document, run_inputs, run_outputs, js=SHOW_STATUS_JS, **running).failure(**failed)
    try_aware.click(handlers.try_question_aware, None, [question_aware], api_visibility="private").then(
        handlers.run_document, run_inputs, run_outputs, js=SHOW_STATUS_JS, **running).failure(**failed)
    search.change(handlers.search_text, [search, replay_step, view_state], [text], **searching)
    charts_png.click(None, None, None, js=CHARTS_PNG_JS)
    stop.click(handlers.stop_run, None, None, js=STOPPING_JS, concurrency_limit=None, api_visibility="private")
    replay_step.input(handlers.replay, [replay_step, view_state, search],
                      [stats, sizes_plot, retained_plot, memory_plot, seconds_plot, text, layers_plot],
                      trigger_mode="always_last", concurrency_limit=None, show_progress="hidden",
                      api_visibility="private")
    controls = dict(example=example, schedule=schedule, growth=growth, chunk=chunk, memory=memory, sinks=sinks,
                    max_tokens=max_tokens, scorer=scorer, rope=rope, question_aware=question_aware, model=model,
                    doc_state=doc_state, question=question, doc_info=doc_info, share=share, doc_key=doc_key)
    return RunTab(doc_state, model, question, sinks, max_tokens, controls)


def _chunk_limit(document) -> int:
    """The chunk slider's end: the default document's tokens (the preview keeps it updated)."""
    try:
        return max(16, handlers.preview_tokens(document, default_model(), DEFAULT_MAX_TOKENS))
    except Exception:  # noqa: BLE001 - no tokenizer yet (hub unreachable): the model's context
        return 8192
