"""The Compare tab: up to four configurations run one after another on the Run tab's
document, model, question, sinks and max tokens, compared side by side: what each memory keeps
(one strip per run on one token axis, the true answer marked), the schedules and memory along
the document, and a table. The event is ui/comparison.py."""

from __future__ import annotations

import gradio as gr

from memstep.presets import AUTO, ROPE_CHOICES
from memstep.schedules import GROWTHS
from memstep.scorers import SCORERS

from ui import comparison
from ui.fields import OpenNumber
from ui.figures import compare_kept_figure, compare_memory_figure, compare_sizes_figure
from ui.summary import COMPARE_WIDTHS, compare_headers
from ui.tabs.run import SCHEDULE_CHOICES, RunTab

# FM, IM and IMDC, and one cut after a full prefill, all with the question-aware scorer: which
# memory kept the answer, and at what cost
COMPARE_SCHEDULES = [c for c in SCHEDULE_CHOICES if c[1] != "full"] + [("one cut (full prefill)", comparison.ONCE)]
COMPARE_DEFAULTS = [(True, "fm"), (True, "im"), (True, "imdc"), (True, comparison.ONCE)]


def build_tab(run: RunTab) -> None:
    gr.Markdown("Run up to four configurations one after another on the **document, model, question, sinks and "
                "max tokens chosen on the Run tab**, and see what each memory keeps. **One cut** reads the whole "
                "document in one step, then cuts it to M once with the same scorer: what a press such as SnapKV or "
                "ChunkKV does after a full prefill. Ratios are against the first FM configuration.",
                elem_classes="memstep-note")
    config_inputs = []
    for i, (on, name) in enumerate(COMPARE_DEFAULTS, start=1):
        with gr.Row(equal_height=True):
            row = [
                # minimum widths that hold their labels and values, so a phone wraps the row
                # instead of cutting them ("configura", "chunk-attent")
                gr.Checkbox(on, label=f"configuration {i}", elem_id=f"cmp{i}-on", scale=1,
                            elem_classes="memstep-wide-check"),
                gr.Dropdown(COMPARE_SCHEDULES, value=name, label="schedule", elem_id=f"cmp{i}-schedule",
                            scale=1, min_width=150),
                gr.Dropdown(list(GROWTHS), value="linear", label="growth", scale=1, min_width=120),
                OpenNumber(512, label="chunk", precision=0, minimum=16, scale=1, min_width=90,
                           elem_id=f"cmp{i}-chunk"),
                OpenNumber(512, label="memory", precision=0, minimum=0, maximum=comparison.MEMORY_MAX, scale=1,
                           min_width=90, elem_id=f"cmp{i}-memory"),
                gr.Dropdown(list(SCORERS), value="chunk-attention", label="scorer", scale=2,
                            min_width=190),
                gr.Dropdown(list(ROPE_CHOICES), value=AUTO, label="RoPE positions", scale=1,
                            min_width=150),
                gr.Checkbox(True, label="question-aware", scale=1, elem_classes="memstep-wide-check"),
            ]
        config_inputs += row
        chunk, memory = row[3], row[4]  # memstep's own range checks, naming the configuration
        checked = dict(trigger_mode="always_last", concurrency_limit=None, show_progress="hidden",
                       api_visibility="private")
        chunk.change(comparison.chunk_guard(i), chunk, chunk, **checked)
        memory.change(comparison.memory_guard(i), memory, memory, **checked)
    with gr.Row():
        compare_run = gr.Button("Run comparison", variant="primary", elem_id="compare-run")
        compare_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
    compare_status = gr.Markdown(elem_id="compare-status")
    compare_kept = gr.Plot(compare_kept_figure([], 0), show_label=False, elem_id="compare-kept")
    with gr.Row():
        compare_sizes = gr.Plot(compare_sizes_figure([]), show_label=False, elem_id="compare-sizes")
        compare_memory = gr.Plot(compare_memory_figure([]), show_label=False, elem_id="compare-memory")
    compare_table = gr.Dataframe(headers=compare_headers(True), interactive=False, wrap=True, max_height=900,
                                 column_widths=COMPARE_WIDTHS, elem_id="compare-table")
    shared = [run.doc_state, run.model, run.sinks, run.max_tokens, run.question]
    comparing = compare_run.click(comparison.compare, [*shared, *config_inputs],
                                  [compare_status, compare_kept, compare_sizes, compare_memory, compare_table],
                                  concurrency_id="prefill", concurrency_limit=1, show_progress="minimal",
                                  show_progress_on=[compare_status], api_visibility="private")
    compare_stop.click(lambda: "**Stopped.**", None, [compare_status], cancels=[comparing],
                       concurrency_limit=None, api_visibility="private")
