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
.memstep-hidden { display: none !important; }
/* the selected tab's name on a dark page: the accent a step lighter (4.5:1) */
.dark [role="tab"][aria-selected="true"] { color: var(--primary-400) !important; }
/* the retained-token map and the document's words: stacked, and side by side from 1,200 px, so a
   click on the map shows its tokens in the text without scrolling the page */
#map-and-text { flex-wrap: wrap; gap: 12px; }
#map-and-text > #map-column, #map-and-text > #answer-text { flex: 1 1 100%; min-width: 0; }
@media (min-width: 1200px) {
  #map-and-text { flex-wrap: nowrap; }
  #map-and-text > #map-column { flex: 3 1 0; }
  #map-and-text > #answer-text { flex: 2 1 0; }
  #answer-text .memstep-paper { max-height: 520px !important; }
}
.memstep-paper .memstep-pointed { outline: 3px dotted var(--body-text-color); outline-offset: 1px; border-radius: 2px;
  color: inherit !important; }  /* the token's own shade and ink, not the page's; dotted in ink, unlike the
  passkey's, the answer's and the matches' coloured outlines, so a clicked word is never read as the passkey */
#memstep-map-token b { color: var(--body-text-color); }
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
/* the Plan tab's "what it takes" table: words whole ("IMDC", "bf16"), scrolling sideways on a phone; the
   last column (the longest context) wraps between words */
#plan-needs table { display: block; overflow-x: auto; max-width: 100%; }
#plan-needs th, #plan-needs td { white-space: nowrap; word-break: normal; overflow-wrap: normal; }
#plan-needs td:last-child, #plan-needs th:last-child { white-space: normal; min-width: 12em; }
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
// A file chosen or dropped for upload: Run waits for it from this moment ("preparing the document…",
// ui/identity.py), not from when the file has reached the server. Files the upload box refuses at
// once (type, size) leave Run as it was.
(() => {
  const LIMIT = __UPLOAD_LIMIT__;
  const accepted = (input, file) => {
    const types = (input?.accept || "").split(",").map((t) => t.trim().toLowerCase()).filter(Boolean);
    const name = file.name.toLowerCase();
    return file.size <= LIMIT && (!types.length || types.some((t) => name.endsWith(t)));
  };
  const started = (files, input) => {
    if (files && files.length && [...files].every((file) => accepted(input, file))) {
      document.querySelector("#upload-started")?.click();
    }
  };
  document.addEventListener("change", (event) => {
    if (event.target.matches?.("#upload input[type=file]")) started(event.target.files, event.target);
  }, true);
  document.addEventListener("drop", (event) => {
    const box = event.target.closest?.("#upload");
    if (box) started(event.dataTransfer?.files, box.querySelector("input[type=file]"));
  }, true);
})();
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
// The retained-token map tied to the words, one code path for a mouse and a finger (point()):
// pointing at a column (hover, or a first tap) shows its tokens (layout.meta, ui/figures.py) in the
// line under the map; a click (or a second tap on the same column) also moves the replay to that
// row's step and the text view (data-t: a piece's first document token, data-o: where each of its
// tokens starts, ui/highlight.py) to that column's tokens, outlined and scrolled into view.
(() => {
  const say = (html) => { const el = document.querySelector("#memstep-map-token"); if (el) el.innerHTML = html; };
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  const cell = (event) => (event.points || []).find((p) => p.data && p.data.type === "heatmap") || null;
  let pointer = "mouse";  // the kind of the last press: a finger taps twice, a mouse clicks once
  document.addEventListener("pointerdown", (event) => { pointer = event.pointerType || "mouse"; }, true);
  let armed = null, pointed = null;  // the column a first tap chose; the tokens the text outlines
  const column = (gd, point) => {
    const meta = gd.layout.meta || {};
    const width = meta.width || 1;
    const index = Array.isArray(point.pointNumber) ? point.pointNumber[1] : Math.floor(point.x / width);
    return {index, meta, first: index * width, last: (index + 1) * width - 1, step: point.y, z: point.z};
  };
  const unwrap = (paper) => {
    for (const el of paper.querySelectorAll("span.memstep-pointed")) el.replaceWith(...el.childNodes);
    paper.normalize();
  };
  // Outline document tokens [first, last] in the text view; false when the view does not hold them.
  const outline = (first, last) => {
    const paper = document.querySelector("#retained-text .memstep-paper");
    if (!paper) return false;
    unwrap(paper);
    let target = null;
    for (const piece of paper.querySelectorAll("[data-t]")) {
      const t0 = +piece.dataset.t;
      const starts = piece.dataset.o ? piece.dataset.o.split(" ").map(Number) : [0];
      const t1 = t0 + starts.length - 1;  // the piece's last token
      if (t1 < first) continue;
      if (t0 > last) break;
      const node = piece.firstChild;
      if (!node || node.nodeType !== Node.TEXT_NODE) continue;
      let from = starts[Math.max(first, t0) - t0];
      const to = last < t1 ? starts[last + 1 - t0] : node.length;
      while (from < to && /\\s/.test(node.data[from])) from++;  // a token's leading space: no box at a line's end
      if (to <= from) continue;
      const range = document.createRange();
      range.setStart(node, from);
      range.setEnd(node, to);
      const mark = document.createElement("span");
      mark.className = "memstep-pointed";
      range.surroundContents(mark);
      target = target || mark;
    }
    if (!target) return false;
    paper.scrollTop = target.offsetTop - paper.offsetTop - paper.clientHeight / 3;
    const box = paper.getBoundingClientRect();  // the text view itself in the window (stacked on a phone)
    if (box.top < 0 || box.bottom > window.innerHeight) paper.scrollIntoView({block: "nearest"});
    return true;
  };
  // After the replay redraws the text view, the outline goes back on.
  const reapply = () => {
    const paper = document.querySelector("#retained-text .memstep-paper");
    if (!pointed || !paper || paper.__memstepPointed === pointed) return;
    paper.__memstepPointed = pointed;
    if (!paper.querySelector(".memstep-pointed")) outline(pointed.first, pointed.last);
  };
  const point = (gd, event, how) => {
    const found = cell(event);
    if (!found) return;
    const {index, meta, first, last, step, z} = column(gd, found);
    const words = (meta.words || [])[index];
    if (words === undefined) return;
    const where = first === last ? `position ${first.toLocaleString()}` :
      `positions ${first.toLocaleString()}-${last.toLocaleString()}`;
    const kept = z === null || z === undefined || Number.isNaN(z) ? "not read yet" :
      `kept by ${Math.round(100 * z)}% of the slots`;
    const line = `${where}, after step ${step}: <b>${esc(words)}</b> · ${kept}`;
    const key = `${index}:${step}`;
    if (how === "hover" || (how === "tap" && armed !== key)) {
      armed = how === "tap" ? key : armed;
      say(line + (how === "tap" ? " · tap again to show it in the text" : ""));
      const said = document.querySelector("#memstep-map-token");  // a finger's line must be in view
      const box = said?.getBoundingClientRect();
      if (how === "tap" && box && (box.bottom > window.innerHeight || box.top < 0)) said.scrollIntoView({block: "nearest"});
      return;
    }
    armed = null;
    say(line);
    const prefix = meta.prefix || 0;
    const from = Math.max(0, first - prefix), to = Math.max(0, last - prefix);
    pointed = {first: from, last: to};
    const slider = document.querySelector("#replay input[type=range]");
    if (slider && !slider.disabled && String(slider.value) !== String(step)) {
      slider.value = step;
      slider.dispatchEvent(new Event("input", {bubbles: true}));
      slider.dispatchEvent(new Event("change", {bubbles: true}));
    }
    if (!outline(from, to)) {
      say(line + " · that part of the document is outside the text view's window (it holds the tokens last read)");
    }
  };
  const bind = () => {
    const gd = document.querySelector("#retained-plot .js-plotly-plot");
    reapply();
    // after every redraw (Plotly.newPlot drops listeners, Plotly.react keeps them): ours, once
    if (!gd || !gd.on || gd.__memstepLayout === gd._fullLayout) return;
    gd.__memstepLayout = gd._fullLayout;
    for (const [name, handler] of Object.entries(gd.__memstepHandlers || {})) gd.removeListener(name, handler);
    gd.__memstepHandlers = {};
    const on = (name, handler) => { gd.__memstepHandlers[name] = handler; gd.on(name, handler); };
    on("plotly_hover", (event) => { if (pointer === "mouse") point(gd, event, "hover"); });
    on("plotly_click", (event) => point(gd, event, pointer === "mouse" ? "click" : "tap"));
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
                                  "rope", "question_aware", "model", "doc_state", "question", "doc_info", "doc_key")],
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
    # Every text at least 4.5:1 against what is behind it, in both modes (tests/test_app_map.py measures
    # it): Soft's help text, labels, selected tab, primary buttons and links are a step too light.
    theme = theme.set(body_text_color_subdued="*neutral_600", body_text_color_subdued_dark="*neutral_400",
                      block_label_text_color="*primary_700", block_title_text_color="*primary_700",
                      button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
                      checkbox_label_background_fill_selected="*primary_600", color_accent="*primary_600",
                      link_text_color="*primary_700", link_text_color_hover="*primary_800",
                      link_text_color_visited="*primary_700", link_text_color_active="*primary_700",
                      link_text_color_dark="*primary_300", link_text_color_hover_dark="*primary_200",
                      link_text_color_visited_dark="*primary_300", link_text_color_active_dark="*primary_300")
    return {"theme": theme, "css": CSS + _table_css() + dark_css(),
            "head": HEAD.replace("__UPLOAD_LIMIT__", str(MAX_UPLOAD_BYTES)), "max_file_size": MAX_UPLOAD_BYTES,
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
