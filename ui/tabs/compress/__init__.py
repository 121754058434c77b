"""The Compress tab: shrink the model itself and watch it step by step. One section per
method, each in its own module (laco.py, drop.py, sparse.py) with a ``build_section(model_box, tabs)``:
``model_box`` is the Run tab's model dropdown (a compressed model is loaded into it in one
click), ``tabs`` the page's gr.Tabs."""

from __future__ import annotations

import gradio as gr

from ui.tabs.compress import drop, laco, sparse

SECTIONS = [("Layer collapse (LaCo)", laco), ("Block influence (drop layers)", drop),
            ("Pruning + reconstruction", sparse)]


def build_tab(model_box=None, tabs=None) -> None:
    with gr.Tabs(overflow_behavior="wrap"):  # both sections reachable on a phone, no "..." menu
        for title, section in SECTIONS:
            with gr.Tab(title):
                section.build_section(model_box, tabs)
