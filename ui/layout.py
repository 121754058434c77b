"""The page: controls on the left, the run's views on the right; Compare, Plan and
Evaluate tabs. Reads top to bottom like the page; the work is in ui/handlers.py."""

from __future__ import annotations

import importlib
import inspect
import os

import gradio as gr

from memstep.documents import SUPPORTED_EXTENSIONS
from memstep.models import allowed_models, default_model, offered_models
from memstep.presets import PRESETS, ROPE_HELP, ROPE_MODES
from memstep.schedules import GROWTHS
from memstep.scorers import SCORERS

from ui import api, handlers
from ui.documents import DEFAULT_EXAMPLE, EXAMPLES, MAX_UPLOAD_BYTES
from ui.figures import compare_memory_figure, compare_sizes_figure
from ui.runs import DEFAULT_MAX_TOKENS
from ui.summary import COMPARE_HEADERS, COMPARE_WIDTHS, stat_cards
from ui.views import answer_markdown

SCHEDULE_CHOICES = [("full", "full"), ("FM", "fm"), ("IM", "im"), ("IMDC", "imdc")]
QUEUE_SIZE = int(os.environ.get("MEMSTEP_QUEUE_SIZE", "16"))  # waiting line for runs
COMPARE_DEFAULTS = [(True, "fm", "linear"), (True, "im", "linear"), (True, "imdc", "linear")]
ROPE_CHOICES = [("compact (reference)", "compact"), ("document", "document")]
ROPE_INFO = "compact: " + ROPE_HELP["compact"] + ". document: " + ROPE_HELP["document"] + "."
OPTIONAL_TABS = [("Plan", "ui.plan_tab"), ("Evaluate", "ui.eval_tab"), ("Compress", "ui.compress_tab")]

CSS = """
.gradio-container { max-width: 1480px !important; }
#memstep-header h1 { font-size: 1.6rem; margin: 0; }
#memstep-header p { margin: 2px 0 0; color: #4b5563; }
.memstep-stats { display: flex; flex-wrap: wrap; gap: 8px; }
.memstep-stat { flex: 1 1 110px; border: 1px solid #e5e7eb; border-radius: 8px; padding: 6px 10px;
  background: #f9fafb; }
.memstep-stat-label { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: #6b7280; }
.memstep-stat-value { font-size: 15px; font-weight: 600; color: #111827; white-space: nowrap; }
#memstep-controls .gr-group, #memstep-controls { gap: 10px; }
.memstep-note { font-size: 12.5px; color: #4b5563; }
.memstep-hint { padding: 14px 16px; border: 1px dashed #cbd5e1; border-radius: 8px; color: #4b5563; }
.memstep-progress { height: 6px; margin-top: 8px; border-radius: 3px; background: #e5e7eb; overflow: hidden; }
.memstep-progress > div { height: 100%; background: #3b82f6; transition: width .3s ease; }
/* keyboard users see where they are */
button:focus-visible, input:focus-visible, select:focus-visible, textarea:focus-visible, [role="tab"]:focus-visible,
a:focus-visible { outline: 3px solid #1d4ed8 !important; outline-offset: 2px !important; }
.memstep-sr-only { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0);
  white-space: nowrap; }
#run-row { gap: 8px; }
/* tables scroll sideways instead of stacking their headers one letter per line (the header is
   a separate table from the body: both get the same minimum widths, and words never break) */
.table-wrap, .table-container { overflow-x: auto !important; }
#compare-table table, #plan-table table, #compare-table .virtual-body, #plan-table .virtual-body { min-width: 1200px; }
#compare-table th, #compare-table th *, #plan-table th, #plan-table th * { word-break: normal !important;
  overflow-wrap: normal !important; }
#compare-table .cell-wrap, #plan-table .cell-wrap, #compare-table .cell-wrap span, #plan-table .cell-wrap span {
  word-break: normal !important; overflow-wrap: normal !important; }
@media (max-width: 640px) {
  #memstep-header h1 { font-size: 1.25rem; }
  .memstep-stat { flex: 1 1 44%; }
  .js-plotly-plot .gtitle { font-size: 12px !important; }
}
"""

# Ctrl+Enter (Cmd+Enter) runs from anywhere on the Run tab.
HEAD = """
<script>
document.addEventListener("keydown", (event) => {
  if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) return;
  const run = document.querySelector("#run");
  if (run && run.offsetParent !== null && !run.disabled) { event.preventDefault(); run.click(); }
});
</script>
"""

HEADER = """
<div id="memstep-header">
<h1>memstep · memorize step by step</h1>
<p>Prefill a long document into a language model chunk by chunk under a memory budget, and watch
what the memory keeps. Each step reads one <b>chunk</b> with the compressed <b>memory</b> of the earlier
chunks; right after each layer's attention a <b>scorer</b> cuts that layer's cache back to the step's
<b>budget</b>. The first <b>sink</b> tokens are always kept.</p>
</div>
"""

CHUNK_INFO = ("FM, IM: every chunk is c. IMDC: c sets the steps (⌈tokens/c⌉); chunks then shrink as memory "
              "grows, keeping memory + chunk level.")

RUN_HINT = ("Press **Run** (or Ctrl+Enter): each step streams the retained-token map (which positions memory keeps), "
            "memory and seconds per step, then the answer to the question and the text shaded by what the "
            "memory kept. While a run streams, the chart above follows it step by step.")

GUIDE = """
**Chunk and memory per step.** Each bar is one step: blue is the memory the step starts with (cache
entries per layer, sinks included), orange the chunk it reads; together they are what the step's
attention holds, and the red arrow marks their peak. The dark line is the memory kept after the step,
the dotted line the schedule's budget. FM keeps a fixed memory; IM grows it along the growth curve;
IMDC also shrinks the chunks as memory grows, so memory + chunk stays flat (a lower peak than FM).

**Retained tokens.** One row per step (step 1 at the top), one column per token position (prompt
head, then the document; long documents are binned). Grey: not read yet. White: read, then evicted
from every layer and KV head. Blue: kept; the darker, the more of the layers × KV heads keep it. A
new row adds the chunk just read (outlined in orange) and shows what survived of everything before.
Orange and red ticks above the map mark the sinks and the hidden passkey.

**Memory per step.** The modeled peak bytes of each step, stacked by component: KV of the memory,
KV of the chunk, the attention and scorer working set, and activations. The weights are constant and
left out so the schedule's effect stays visible. On CUDA a line shows the peak the device measured;
on a CPU there is no such counter and only the model is shown.

**Seconds per step.** Wall-clock time of each step (forward pass and eviction).

**Text.** The document shaded by the memory after the chosen step: the darker a token, the more
layer-head slots still hold it.
"""


def _model_choices() -> list[str]:
    return offered_models()  # 'embedded' only where it can load; on a Space also all it accepts


def build_app() -> gr.Blocks:
    document = handlers.default_document()
    first_preview, first_note = handlers.preview(document, default_model(), "imdc", "linear", 512, 512, 4,
                                                 DEFAULT_MAX_TOKENS)
    with gr.Blocks(title="memstep: memorize step by step") as demo:
        gr.HTML(HEADER)
        doc_state = gr.State(document)
        view_state = gr.State(None)
        with gr.Tabs() as tabs:
            with gr.Tab("Run", id="run"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=4, min_width=330, elem_id="memstep-controls"):
                        # first in the column: visible without scrolling, a few Tab presses away
                        with gr.Row(elem_id="run-row"):
                            run = gr.Button("Run", variant="primary", elem_id="run", min_width=120)
                            stop = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
                        with gr.Group():
                            example = gr.Dropdown(list(EXAMPLES), value=DEFAULT_EXAMPLE, label="Example document",
                                                  elem_id="example")
                            upload = gr.File(label=f"…or upload a document ({' '.join(SUPPORTED_EXTENSIONS)}, up to "
                                                   f"{MAX_UPLOAD_BYTES // 2**20} MB)",
                                             file_types=list(SUPPORTED_EXTENSIONS), type="filepath", height=150,
                                             elem_id="upload")
                        doc_info = gr.Markdown(handlers.describe_document(document, default_model()),
                                               elem_id="doc-info", elem_classes="memstep-note")
                        question = gr.Textbox(document.question, label="Question (optional)", lines=1,
                                              elem_id="question")
                        schedule = gr.Radio(SCHEDULE_CHOICES, value="imdc", label="Schedule", elem_id="schedule")
                        growth = gr.Dropdown(list(GROWTHS), value="linear", label="Growth curve (IM and IMDC)",
                                             elem_id="growth")
                        chunk = gr.Slider(16, _chunk_limit(document), value=512, step=16, label="Chunk size c (tokens)", elem_id="chunk",
                                          info=CHUNK_INFO)
                        memory = gr.Slider(0, 8192, value=512, step=4, label="Memory size M (tokens)",
                                           elem_id="memory", info="Tokens kept after each step, besides the sinks "
                                           "(at least the sinks).")
                        with gr.Row():
                            sinks = gr.Number(4, label="Sinks", minimum=0, maximum=256, precision=0,
                                              elem_id="sinks", min_width=90)
                            max_tokens = gr.Number(DEFAULT_MAX_TOKENS, label="Max tokens", minimum=1, precision=0,
                                                   elem_id="max-tokens", min_width=90)
                        with gr.Row():
                            preset = gr.Dropdown(["none", *PRESETS], value="none", label="Preset", elem_id="preset",
                                                 info="reference: the paper's code (conv score, compact "
                                                      "positions, 4 sinks)", min_width=140)
                            scorer = gr.Dropdown(list(SCORERS), value="chunk-attention", label="Scorer",
                                                 elem_id="scorer", min_width=140)
                        rope = gr.Radio(ROPE_CHOICES, value="compact", label="RoPE positions", info=ROPE_INFO,
                                        elem_id="rope")
                        model = gr.Dropdown(_model_choices(), value=default_model(),
                                            allow_custom_value=allowed_models() is None,
                                            label="Model", info="'embedded': SmolLM2-135M-Instruct shipped with "
                                            "memstep. Or a hub id, a local folder or a .gguf file.",
                                            elem_id="model")
                        question_aware = gr.Checkbox(False, label="Question-aware", elem_id="question-aware",
                                                     info="Also score every step by the question's attention: its "
                                                          "tokens are read after each chunk, then dropped.")
                        full_reference = gr.Checkbox(False, label="Also answer from the full cache (reference)",
                                                     info="Bundled examples always show it (computed once, then "
                                                     "cached); for uploads it is one more prefill.",
                                                     elem_id="full-reference")
                    with gr.Column(scale=9):
                        stats = gr.HTML(stat_cards([("state", "run", "not run yet")]), elem_id="stats")
                        preview_note = gr.Markdown(first_note, elem_id="preview-note", elem_classes="memstep-note")
                        sizes_plot = gr.Plot(first_preview, label="Chunk and memory per step", show_label=False,
                                             elem_id="sizes-plot")
                        run_hint = gr.Markdown(RUN_HINT, elem_id="run-hint", elem_classes="memstep-hint")
                        # Hidden until the first streamed update: the page loads without drawing empty plots.
                        with gr.Column(visible=False, elem_id="run-views") as run_views:
                            replay_step = gr.Slider(0, 1, value=0, step=1, interactive=False, elem_id="replay",
                                                    label="Replay: the run after step (0 = before the first)")
                            retained_plot = gr.Plot(show_label=False, elem_id="retained-plot")
                            with gr.Row():
                                memory_plot = gr.Plot(show_label=False, elem_id="memory-plot", scale=3)
                                seconds_plot = gr.Plot(show_label=False, elem_id="seconds-plot", scale=2)
                            layers_plot = gr.Plot(show_label=False, elem_id="layers-plot", visible=False)
                            with gr.Column(elem_id="answer-text"):
                                answer = gr.Markdown(answer_markdown(None), elem_id="answer", container=True)
                                text = gr.HTML(elem_id="retained-text")
                        with gr.Accordion("How to read these views", open=False):
                            gr.Markdown(GUIDE)

            with gr.Tab("Compare", id="compare"):
                gr.Markdown("Run up to three configurations one after another on the **document, model, question, "
                            "sinks and max tokens chosen on the Run tab**, and compare them side by side. Ratios are "
                            "against the first FM configuration.", elem_classes="memstep-note")
                config_inputs = []
                for i, (on, name, curve) in enumerate(COMPARE_DEFAULTS, start=1):
                    with gr.Row(equal_height=True):
                        config_inputs += [
                            gr.Checkbox(on, label=f"configuration {i}", elem_id=f"cmp{i}-on", scale=1, min_width=120),
                            gr.Dropdown(SCHEDULE_CHOICES, value=name, label="schedule", elem_id=f"cmp{i}-schedule",
                                        scale=1, min_width=100),
                            gr.Dropdown(list(GROWTHS), value=curve, label="growth", scale=1, min_width=120),
                            gr.Number(512, label="chunk", precision=0, minimum=1, scale=1, min_width=90),
                            gr.Number(512, label="memory", precision=0, minimum=0, scale=1, min_width=90),
                            gr.Dropdown(list(SCORERS), value="chunk-attention", label="scorer", scale=2,
                                        min_width=140),
                            gr.Dropdown(list(ROPE_MODES), value="compact", label="RoPE positions", scale=1,
                                        min_width=120),
                            gr.Checkbox(False, label="question-aware", scale=1, min_width=120),
                        ]
                with gr.Row():
                    compare_run = gr.Button("Run comparison", variant="primary", elem_id="compare-run")
                    compare_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                compare_status = gr.Markdown(elem_id="compare-status")
                with gr.Row():
                    compare_sizes = gr.Plot(compare_sizes_figure([]), show_label=False, elem_id="compare-sizes")
                    compare_memory = gr.Plot(compare_memory_figure([]), show_label=False, elem_id="compare-memory")
                compare_table = gr.Dataframe(headers=COMPARE_HEADERS, interactive=False, wrap=True,
                                             column_widths=COMPARE_WIDTHS,
                                             elem_id="compare-table")

            for title, module in OPTIONAL_TABS:
                tab_module = _optional(module)
                if tab_module is not None:
                    with gr.Tab(title, id=title.lower()):
                        if "model_box" in inspect.signature(tab_module.build_tab).parameters:
                            tab_module.build_tab(model_box=model, tabs=tabs)  # it can load a model into Run
                        else:
                            tab_module.build_tab()

        # ---- events -----------------------------------------------------------------
        preview_inputs = [doc_state, model, schedule, growth, chunk, memory, sinks, max_tokens]
        gr.on([doc_state.change, model.change, schedule.change, growth.change, chunk.change, memory.change,
               sinks.change, max_tokens.change],
              handlers.preview_page, preview_inputs, [sizes_plot, preview_note, run, chunk],
              trigger_mode="always_last", concurrency_limit=None, show_progress="hidden", api_visibility="private")
        example.input(handlers.choose_example, [example, model], [doc_state, question, doc_info, upload],
                      concurrency_limit=None, api_visibility="private")
        upload.upload(handlers.choose_upload, [upload, doc_state, model],
                      [doc_state, question, doc_info, upload, example],
                      concurrency_limit=None, api_visibility="private")

        preset.input(handlers.choose_preset, [preset], [scorer, rope, sinks], concurrency_limit=None,
                     api_visibility="private")
        run_outputs = [stats, sizes_plot, retained_plot, memory_plot, seconds_plot, text, answer, replay_step,
                       view_state, run_views, run_hint, layers_plot]
        run.click(handlers.run_document,
                  [doc_state, model, schedule, growth, chunk, memory, scorer, sinks, max_tokens, question,
                   full_reference, rope, question_aware], run_outputs,
                  concurrency_id="prefill", concurrency_limit=1, show_progress="minimal",
                  show_progress_on=[stats], api_visibility="private")
        stop.click(handlers.stop_run, None, None, concurrency_limit=None, api_visibility="private")
        replay_step.input(handlers.replay, [replay_step, view_state],
                          [stats, sizes_plot, retained_plot, memory_plot, seconds_plot, text, layers_plot],
                          trigger_mode="always_last", concurrency_limit=None, show_progress="hidden",
                          api_visibility="private")

        comparing = compare_run.click(handlers.compare, [doc_state, model, sinks, max_tokens, question, *config_inputs],
                                      [compare_status, compare_sizes, compare_memory, compare_table],
                                      concurrency_id="prefill", concurrency_limit=1, show_progress="minimal",
                                      show_progress_on=[compare_status], api_visibility="private")
        compare_stop.click(lambda: "**Stopped.**", None, [compare_status], cancels=[comparing],
                           concurrency_limit=None, api_visibility="private")
        api.register()
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    return demo


def _chunk_limit(document) -> int:
    """The chunk slider's end: the default document's tokens (the preview keeps it updated)."""
    try:
        return max(16, handlers.preview_tokens(document, default_model(), DEFAULT_MAX_TOKENS))
    except Exception:  # noqa: BLE001 - no tokenizer yet (hub unreachable): the model's context
        return 8192


def _optional(module: str):
    """A tab module written elsewhere (ui/plan_tab.py, ui/eval_tab.py): None while absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        return None


def launch_options() -> dict:
    """Arguments of demo.launch() that shape the page and the server's upload limit."""
    theme = gr.themes.Soft(primary_hue="blue", neutral_hue="slate",
                           font=[gr.themes.Font(name) for name in ("Inter", "Segoe UI", "system-ui", "sans-serif")],
                           font_mono=[gr.themes.Font(name) for name in ("ui-monospace", "monospace")])
    return {"theme": theme, "css": CSS + _table_css(), "head": HEAD, "max_file_size": MAX_UPLOAD_BYTES}


def _table_css() -> str:
    """Body cells as wide as their header cells (Gradio draws the header as its own table):
    each column's share of the tables' 1200 px minimum (header words fit their cells)."""
    plan = _optional("ui.plan_tab")
    tables = [("compare-table", COMPARE_WIDTHS), ("plan-table", getattr(plan, "TABLE_WIDTHS", []))]
    return "".join(f"#{table} th:nth-child({i}), #{table} .body-cell:nth-child({i}) "
                   f"{{ min-width: {12 * float(width.rstrip('%')):.0f}px; }}\n"
                   for table, widths in tables for i, width in enumerate(widths, start=1))
