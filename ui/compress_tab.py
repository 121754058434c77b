"""The Compress tab: shrink the model itself and watch it step by step. One section per
method, each in its own module (ui/compress_laco.py, ui/compress_sparse.py) with a
``build_section(model_box, tabs)``: ``model_box`` is the Run tab's model dropdown (a
compressed model is loaded into it in one click), ``tabs`` the page's gr.Tabs."""

from __future__ import annotations

import importlib

import gradio as gr

SECTIONS = [("Layer collapse (LaCo)", "ui.compress_laco"), ("Pruning + reconstruction", "ui.compress_sparse")]


def build_tab(model_box=None, tabs=None) -> None:
    with gr.Tabs():
        for title, module in SECTIONS:
            try:
                section = importlib.import_module(module)
            except ModuleNotFoundError as err:
                if err.name != module:
                    raise
                continue
            with gr.Tab(title):
                section.build_section(model_box, tabs)
