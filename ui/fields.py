"""Number fields whose out-of-range values memstep answers itself, naming the field.

Gradio checks a slider's or a number box's typed value against its ends on every event that
reads it and raises "Value 100000 is greater than maximum value 1524" once per event, without
the field's name, while the box keeps the refused value. These sliders and number boxes pass
the value on; ``settle`` brings it to the nearest end (an emptied box to its default), says so
in the field's words with the allowed range, and the page puts the value in use back into the
box.
"""

from __future__ import annotations

import math
from abc import ABCMeta

import gradio as gr


def _open_preprocess(self, payload):
    """gr.Slider's (and gr.Number's) preprocess without its bounds check."""
    if payload is None:
        return None
    try:
        return gr.Number.round_to_precision(payload, self.precision)
    except (TypeError, ValueError, OverflowError):
        return payload  # memstep's own check (ui/inputs.whole_number) says what is wrong


# gr.Slider (the same widget: a template of it) without Gradio's bounds check. Made with ABCMeta
# itself: Gradio's ComponentMeta would add nothing here (no events, no __init__) but a .pyi stub
# written beside this module at import.
OpenSlider = ABCMeta.__new__(type(gr.Slider), "OpenSlider", (gr.Slider,),
                             {"__module__": __name__, "is_template": True, "preprocess": _open_preprocess,
                              "__doc__": "gr.Slider without Gradio's bounds check (memstep's own check names the field)."})
OpenNumber = ABCMeta.__new__(type(gr.Number), "OpenNumber", (gr.Number,),
                             {"__module__": __name__, "is_template": True, "preprocess": _open_preprocess,
                              "__doc__": "gr.Number without Gradio's bounds check (memstep's own check names the field)."})


def settle(value, name: str, least: int, most: int, why: str = "", default=None) -> tuple[object, str | None]:
    """(the value to use, a note when it was moved): a number beyond [least, most] goes to the
    nearest end, an empty box to ``default`` (when given); anything else that is not a finite
    number is left for the settings check to name. The note names the field and its range."""
    allowed = f"allowed {least:,} to {most:,}"
    if default is not None and (value is None or value == ""):
        return default, f"{name} is empty ({allowed}); the box is back at {default:,}."
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return value, None
    if not math.isfinite(number) or least <= number <= most:
        return value, None
    used = most if number > most else least
    side = "more than" if number > most else "less than"
    return used, (f"{name}: {number:,.0f} is {side} {why or ('the most' if number > most else 'the least')} "
                  f"({used:,}; {allowed}); the box is back at {used:,}.")
