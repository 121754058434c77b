"""Named settings shared by the CLI, the app and the evaluation (no torch: the CLI's parsers
and the app's controls import it).

``reference`` is the paper's reference code ("Memorize Step by Step", EMNLP 2024) as far as
memstep reproduces it: contiguous (compact) RoPE positions, the pooled ``conv`` score over 5
keys, 4 sinks. Options given explicitly still win over a preset.
"""

from __future__ import annotations

from memstep.errors import MemstepError

ROPE_MODES = ("compact", "document")
DEFAULTS = {"rope": "compact", "scorer": "chunk-attention", "sinks": 4, "kernel": 5}
PRESETS = {"reference": {"rope": "compact", "scorer": "conv", "sinks": 4, "kernel": 5}}
ROPE_HELP = {
    "compact": "contiguous positions, as the reference code: the memory sits at 0..m-1 and the chunk right "
               "after it, so no position exceeds sinks + M + c",
    "document": "every token keeps its true position in the document (memstep's first design)",
}


def preset_settings(name: str | None) -> dict:
    """The settings a preset fixes ({} for none)."""
    if not name:
        return {}
    if name not in PRESETS:
        raise MemstepError(f"unknown preset '{name}': choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def apply_preset(args) -> None:
    """Fill the options left unset (None) on ``args`` from its preset, then from the defaults."""
    chosen = preset_settings(getattr(args, "preset", None))
    for key, default in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, chosen.get(key, default))
