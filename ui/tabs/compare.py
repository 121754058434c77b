"""The Compare tab: up to three configurations run one after another on the Run tab's
document, model, question, sinks and max tokens, compared side by side."""

from __future__ import annotations

import gradio as gr

from memstep.presets import AUTO, ROPE_CHOICES
from memstep.schedules import GROWTHS
from memstep.scorers import SCORERS

from ui import handlers
from ui.figures import compare_memory_figure, compare_sizes_figure
from ui.summary import COMPARE_WIDTHS, compare_headers
from ui.tabs.run import SCHEDULE_CHOICES, RunTab

COMPARE_DEFAULTS = [(True, "fm", "linear"), (True, "im", "linear"), (True, "imdc", "linear")]


def build_tab(run: RunTab) -> None:
    gr.Markdown("Run up to three configurations one after another on the **document, model, question, "
                "sinks and max tokens chosen on the Run tab**, and compare them side by side. Ratios are "
                "against the first FM configuration.", elem_classes="memstep-note")
    config_inputs = []
    for i, (on, name, curve) in enumerate(COMPARE_DEFAULTS, start=1):
        with gr.Row(equal_height=True):
            config_inputs += [
                # minimum widths that hold their labels and values, so a phone wraps the row
                # instead of cutting them ("configura", "chunk-attent")
                gr.Checkbox(on, label=f"configuration {i}", elem_id=f"cmp{i}-on", scale=1,
                            elem_classes="memstep-wide-check"),
                gr.Dropdown(SCHEDULE_CHOICES, value=name, label="schedule", elem_id=f"cmp{i}-schedule",
                            scale=1, min_width=120),
                gr.Dropdown(list(GROWTHS), value=curve, label="growth", scale=1, min_width=120),
                gr.Number(512, label="chunk", precision=0, minimum=1, scale=1, min_width=90),
                gr.Number(512, label="memory", precision=0, minimum=0, scale=1, min_width=90),
                gr.Dropdown(list(SCORERS), value="chunk-attention", label="scorer", scale=2,
                            min_width=190),
                gr.Dropdown(list(ROPE_CHOICES), value=AUTO, label="RoPE positions", scale=1,
                            min_width=150),
                gr.Checkbox(False, label="question-aware", scale=1, elem_classes="memstep-wide-check"),
            ]
    with gr.Row():
        compare_run = gr.Button("Run comparison", variant="primary", elem_id="compare-run")
        compare_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
    compare_status = gr.Markdown(elem_id="compare-status")
    with gr.Row():
        compare_sizes = gr.Plot(compare_sizes_figure([]), show_label=False, elem_id="compare-sizes")
        compare_memory = gr.Plot(compare_memory_figure([]), show_label=False, elem_id="compare-memory")
    compare_table = gr.Dataframe(headers=compare_headers(True), interactive=False, wrap=True, max_height=900,
                                 column_widths=COMPARE_WIDTHS, elem_id="compare-table")
    shared = [run.doc_state, run.model, run.sinks, run.max_tokens, run.question]
    comparing = compare_run.click(handlers.compare, [*shared, *config_inputs], [compare_status, compare_sizes, compare_memory, compare_table],
                                  concurrency_id="prefill", concurrency_limit=1, show_progress="minimal",
                                  show_progress_on=[compare_status], api_visibility="private")
    compare_stop.click(lambda: "**Stopped.**", None, [compare_status], cancels=[comparing],
                       concurrency_limit=None, api_visibility="private")
