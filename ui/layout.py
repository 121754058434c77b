"""The page: a header and five tabs (Run, Compare, Plan, Evaluate, Compress), each built by
its module in ui/tabs/; the page's CSS and launch options. Reads top to bottom like the page."""

from __future__ import annotations

import os

import gradio as gr

from ui import api, handlers, uploads
from ui.documents import MAX_UPLOAD_BYTES
from ui.summary import COMPARE_WIDTHS
from ui.theme import dark_css
from ui.tabs import compare as compare_tab
from ui.tabs import compress as compress_tab
from ui.tabs import evaluate as evaluate_tab
from ui.tabs import plan as plan_tab
from ui.tabs import run as run_tab
from ui.tabs.compress import laco as laco_section

QUEUE_SIZE = int(os.environ.get("MEMSTEP_QUEUE_SIZE", "16"))  # waiting line for runs

CSS = """
.gradio-container { max-width: 1480px !important; }
#memstep-header h1 { font-size: 1.6rem; margin: 0; }
#memstep-header p { margin: 2px 0 0; color: var(--body-text-color-subdued); }
.memstep-stats { display: flex; flex-wrap: wrap; gap: 8px; }
.memstep-stat { flex: 1 1 110px; min-width: 0; border: 1px solid var(--border-color-primary); border-radius: 8px;
  padding: 6px 10px; background: var(--background-fill-secondary); }
.memstep-stat-label { font-size: 11px; text-transform: uppercase; letter-spacing: .04em;
  color: var(--body-text-color-subdued); }
/* a long value (the run's label) wraps inside its card instead of being cut */
.memstep-stat-value { font-size: 15px; font-weight: 600; color: var(--body-text-color); overflow-wrap: anywhere; }
#memstep-controls .gr-group, #memstep-controls { gap: 10px; }
.memstep-note { font-size: 12.5px; color: var(--body-text-color-subdued); }
.memstep-hint { padding: 14px 16px; border: 1px dashed var(--border-color-primary); border-radius: 8px;
  color: var(--body-text-color-subdued); }
.memstep-progress { height: 6px; margin-top: 8px; border-radius: 3px; background: var(--border-color-primary);
  overflow: hidden; }
.memstep-progress > div { height: 100%; background: #3b82f6; transition: width .3s ease; }
/* keyboard users see where they are */
button:focus-visible, input:focus-visible, select:focus-visible, textarea:focus-visible, [role="tab"]:focus-visible,
a:focus-visible { outline: 3px solid #1d4ed8 !important; outline-offset: 2px !important; }
.memstep-sr-only { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0);
  white-space: nowrap; }
#run-row { gap: 8px; }
/* a checkbox in a row of fields takes the room its label needs (Gradio gives checkboxes no minimum) */
.memstep-wide-check { min-width: min(160px, 100%) !important; flex: 1 1 160px !important; }
.memstep-now { margin: 6px 0 0; font-size: 13px; color: var(--body-text-color-subdued); }
#keep-row { gap: 8px; flex-wrap: wrap; }
.memstep-caption, .memstep-legend { color: var(--body-text-color-subdued); }
.memstep-search-result { margin-top: 4px; }
/* touch screens: Plotly's toolbar would cover every chart's title (the PNGs: "Charts as PNG") */
@media (hover: none) { .js-plotly-plot .modebar-container { display: none !important; } }
/* a dropdown's value ends in "…" before its arrow instead of running under it (Gradio gives the
   value's box min-width: min-content) */
.secondary-wrap { min-width: 0 !important; }
.secondary-wrap input { min-width: 0; text-overflow: ellipsis; }
#map-token { min-height: 2.6em; margin: -4px 0 4px; }
#memstep-map-token b { color: var(--body-text-color); }
.memstep-paper [data-t].memstep-pointed { outline: 3px solid #f59e0b; outline-offset: 1px; }
/* tables scroll sideways instead of stacking their headers one letter per line (the header is
   a separate table from the body: both get the same minimum widths, and words never break) */
.table-wrap, .table-container { overflow-x: auto !important; }
/* (the rules per table are generated below, from the tables' column widths) */
/* the needle test's standing (a Markdown table): numbers on one line, the verdicts wrap; on a phone
   it scrolls sideways inside its own box */
#eval-niah-note table { display: block; overflow-x: auto; max-width: 100%; }
#eval-niah-note th, #eval-niah-note td { white-space: nowrap; word-break: normal; padding: 0.4em 0.6em; }
/* the standing's last column holds the verdicts; the KL table's last holds a count */
#eval-niah-note table:first-of-type td:last-child, #eval-niah-note table:first-of-type th:last-child {
  white-space: normal; min-width: 16em; }
/* the KL table's press names may wrap, so a phone shows them whole before it scrolls */
#eval-niah-note table:nth-of-type(2) td:nth-child(3) { white-space: normal; overflow-wrap: normal; min-width: 7em; }
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
// A tab's charts were hidden when the window last changed size and kept their old width (a
// laptop's chart clipped on a phone): on a tab shown, a resize lets Plotly lay out any chart
// whose width no longer matches its container's.
document.addEventListener("click", (event) => {
  if (!event.target.closest('[role="tab"]')) return;
  requestAnimationFrame(() => requestAnimationFrame(() => {
    const stale = [...document.querySelectorAll(".js-plotly-plot")].some((gd) => gd.offsetParent !== null
      && gd._fullLayout && Math.abs(gd._fullLayout.width - gd.clientWidth) > 1);
    if (stale) window.dispatchEvent(new Event("resize"));
  }));
});
// The retained-token map tied to the words: pointing at a column shows its tokens (layout.meta,
// ui/figures.py) under the map; a click moves the replay to that row's step and the text view
// (data-t: the document index of each piece, ui/highlight.py) to that column's tokens.
(() => {
  const say = (html) => { const el = document.querySelector("#memstep-map-token"); if (el) el.innerHTML = html; };
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  const cell = (event) => (event.points || []).find((p) => p.data && p.data.type === "heatmap") || null;
  const columnOf = (gd, point) => {
    const meta = gd.layout.meta || {};
    const column = Array.isArray(point.pointNumber) ? point.pointNumber[1] : Math.floor(point.x / (meta.width || 1));
    return {column, meta, first: column * (meta.width || 1), last: (column + 1) * (meta.width || 1) - 1};
  };
  const showText = (index) => {
    const paper = document.querySelector("#retained-text .memstep-paper");
    if (!paper) return false;
    let found = null;
    for (const piece of paper.querySelectorAll("[data-t]")) {
      if (+piece.dataset.t > index) break;
      found = piece;
    }
    if (!found) return false;
    paper.querySelectorAll(".memstep-pointed").forEach((el) => el.classList.remove("memstep-pointed"));
    found.classList.add("memstep-pointed");
    paper.scrollTop = found.offsetTop - paper.offsetTop - paper.clientHeight / 3;
    return true;
  };
  const bind = () => {
    const gd = document.querySelector("#retained-plot .js-plotly-plot");
    // after every redraw (Plotly.newPlot drops listeners, Plotly.react keeps them): ours, once
    if (!gd || !gd.on || gd.__memstepLayout === gd._fullLayout) return;
    gd.__memstepLayout = gd._fullLayout;
    for (const [name, handler] of Object.entries(gd.__memstepHandlers || {})) gd.removeListener(name, handler);
    gd.__memstepHandlers = {};
    const on = (name, handler) => { gd.__memstepHandlers[name] = handler; gd.on(name, handler); };
    on("plotly_hover", (event) => {
      const point = cell(event);
      if (!point) return;
      const {column, meta, first, last} = columnOf(gd, point);
      const words = (meta.words || [])[column];
      if (words === undefined) return;
      const where = first === last ? `position ${first.toLocaleString()}` :
        `positions ${first.toLocaleString()}-${last.toLocaleString()}`;
      const kept = point.z === null || point.z === undefined || Number.isNaN(point.z) ? "not read yet" :
        `kept by ${Math.round(100 * point.z)}% of the slots`;
      say(`${where}, after step ${point.y}: <b>${esc(words)}</b> · ${kept}`);
    });
    on("plotly_click", (event) => {
      const point = cell(event);
      if (!point) return;
      const {meta, first} = columnOf(gd, point);
      const index = Math.max(0, first - (meta.prefix || 0));
      const slider = document.querySelector("#replay input[type=range]");
      if (slider && !slider.disabled && String(slider.value) !== String(point.y)) {
        slider.value = point.y;
        slider.dispatchEvent(new Event("input", {bubbles: true}));
        slider.dispatchEvent(new Event("change", {bubbles: true}));
      }
      const shown = showText(index);
      for (const wait of [700, 1600]) setTimeout(() => showText(index), wait);  // after the replay redraws it
      if (!shown) say("That part of the document is outside the text view's window (it holds the tokens last read).");
    });
  };
  // The address bar carries the settings (the page's own link to them): a copied address reopens them.
  const address = () => {
    const query = document.querySelector("#memstep-link")?.getAttribute("href");
    if (query && query.startsWith("?") && query !== location.search) history.replaceState(null, "", query);
  };
  new MutationObserver(() => { bind(); address(); }).observe(document.documentElement, {childList: true, subtree: true});
})();
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

def build_app() -> gr.Blocks:
    # Gradio's cache sweep: uploads nobody read (and the app's own files) go once as old as a document
    # state (ui/uploads.py; a read upload is deleted at once)
    with gr.Blocks(title="memstep: memorize step by step",
                   delete_cache=(uploads.sweep_seconds(), uploads.UPLOAD_KEEP_SECONDS)) as demo:
        gr.HTML(HEADER)
        with gr.Tabs(overflow_behavior="wrap") as tabs:  # every tab in view on a phone, no "..." menu
            with gr.Tab("Run", id="run"):
                run = run_tab.build_tab()
            with gr.Tab("Compare", id="compare"):
                compare_tab.build_tab(run)
            with gr.Tab("Plan", id="plan"):
                plan_tab.build_tab()
            with gr.Tab("Evaluate", id="evaluate"):
                evaluate_tab.build_tab()
            with gr.Tab("Compress", id="compress"):
                compress_tab.build_tab(model_box=run.model, tabs=tabs)  # it can load a model into Run
        api.register()
        # a link with settings in its address (?schedule=fm&chunk=256&example=...) opens with them
        c = run.controls
        demo.load(handlers.open_link, None,
                  [c[k] for k in ("example", "schedule", "growth", "chunk", "memory", "sinks", "max_tokens", "scorer",
                                  "rope", "question_aware", "model", "doc_state", "question", "doc_info")],
                  api_visibility="private", show_progress="hidden")
        demo.load(handlers.share_link, [c[k] for k in ("example", "doc_state", "schedule", "growth", "chunk",
                                                       "memory", "sinks", "max_tokens", "scorer", "rope",
                                                       "question_aware", "question", "model")], [c["share"]],
                  api_visibility="private", show_progress="hidden")
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    return demo


HEARTBEAT_SECONDS = 2


def launch_options() -> dict:
    """Arguments of demo.launch() that shape the page and the server's upload limits (a file's size, an
    address's bytes: ui/uploads.UploadBudget)."""
    from starlette.middleware import Middleware

    # Gradio notices a client that left (and so a read or a run it no longer waits for) when its next
    # heartbeat goes out: every 15 s by default, every HEARTBEAT_SECONDS here
    os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", str(HEARTBEAT_SECONDS))

    theme = gr.themes.Soft(primary_hue="blue", neutral_hue="slate",
                           font=[gr.themes.Font(name) for name in ("Inter", "Segoe UI", "system-ui", "sans-serif")],
                           font_mono=[gr.themes.Font(name) for name in ("ui-monospace", "monospace")])
    return {"theme": theme, "css": CSS + _table_css() + dark_css(), "head": HEAD, "max_file_size": MAX_UPLOAD_BYTES,
            "app_kwargs": {"middleware": [Middleware(uploads.UploadBudget)]}}


# Tables that scroll sideways on a narrow screen: elem_id -> (minimum width in px, column widths)
TABLES = {"compare-table": (1200, COMPARE_WIDTHS), "plan-table": (1200, plan_tab.TABLE_WIDTHS),
          "eval-table": (1100, ["7%", "27%", "8%", "16%", "10%", "11%", "7%", "7%", "7%"]),
          "laco-table": (1000, laco_section.TABLE_WIDTHS),
          "sparse-table": (1000, ["10%", "15%", "15%", "11%", "11%", "16%", "10%", "12%"])}


def _table_css() -> str:
    """Tables scroll sideways instead of stacking their headers one letter per line: the header
    (Gradio draws it as its own table) and the body get the same minimum width, each column its
    share of it, and words never break inside."""
    rules = []
    for table, (least, widths) in TABLES.items():
        t = f"#{table}"
        rules.append(f"{t} table, {t} .virtual-body {{ min-width: {least}px; }}")
        rules.append(f"{t} th, {t} th *, {t} .cell-wrap, {t} .cell-wrap span {{ word-break: normal !important; "
                     "overflow-wrap: normal !important; }")
        rules += [f"{t} th:nth-child({i}), {t} .body-cell:nth-child({i}) "
                  f"{{ min-width: {least * float(width.rstrip('%')) / 100:.0f}px; }}"
                  for i, width in enumerate(widths, start=1)]
    return "\n".join(rules) + "\n"
