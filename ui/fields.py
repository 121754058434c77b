"""Number fields whose out-of-range values memstep answers itself, naming the field.

Gradio checks a slider's typed value against its ends on every event that reads it and raises
"Value 100000 is greater than maximum value 1524" once per event, without the field's name,
while the box keeps the refused value. These sliders pass the value on; ``settle`` brings it to
the nearest end, says so in the field's words, and the page puts the value in use back into
the box.
"""

from __future__ import annotations

import math
from abc import ABCMeta

import gradio as gr


def _open_preprocess(self, payload):
    """gr.Slider's preprocess without its bounds check."""
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


def settle(value, name: str, least: int, most: int, why: str = "") -> tuple[object, str | None]:
    """(the value to use, a note when it was moved): a number beyond [least, most] goes to the
    nearest end; anything that is not a finite number is left for the settings check to name."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return value, None
    if not math.isfinite(number) or least <= number <= most:
        return value, None
    used = most if number > most else least
    side = "more than" if number > most else "less than"
    return used, f"{name}: {number:,.0f} is {side} {why or ('the most' if number > most else 'the least')} " \
                 f"({used:,}); using {used:,}."
