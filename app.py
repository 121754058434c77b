"""memstep's Gradio app. `python app.py` (or `make demo`) serves it on http://127.0.0.1:7860;
on Hugging Face Spaces it is the app file (GRADIO_SERVER_NAME / _PORT come from the Space).

MEMSTEP_MODEL picks the default model (default: the embedded SmolLM2-135M-Instruct)."""

from __future__ import annotations

from memstep.errors import MemstepError
from ui.layout import build_app, launch_options
from ui.models import get_model

demo = build_app()

if __name__ == "__main__":
    try:
        get_model(None)  # load the default model before the first visitor presses Run
    except MemstepError as err:  # hub unreachable, download failing: serve anyway, Run retries
        print(f"memstep: warning: {err}; the app starts without a model", flush=True)
    demo.launch(server_port=None, **launch_options())
