"""The memstep Gradio app: layout, figures and event handlers (app.py builds it)."""
