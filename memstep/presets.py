"""Named settings shared by the CLI, the app and the evaluation (no torch: the CLI's parsers
and the app's controls import it).

``reference`` is the paper's reference code ("Memorize Step by Step", EMNLP 2024; Collie's
``mem_perceiver``), exactly: contiguous (compact) RoPE positions, the pooled ``conv`` score
over 5 keys, 4 sinks, the padded (m + c)^2 attention maps, and every switch below at the
reference's value. Where memstep differs from the reference, the difference is a named
switch (``SWITCHES``): a CLI flag, a field of the app's API, a control of the app's "as
the reference code" group and an axis of the evaluation. Options given explicitly still
win over a preset.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from memstep.errors import MemstepError

ROPE_MODES = ("compact", "document", "shared")
# what a user may ask for: a mode, or "auto", memstep's default, which picks one per run (resolve_rope)
AUTO = "auto"
ROPE_CHOICES = (AUTO, *ROPE_MODES)
# auto: a question-aware memory reads at shared positions on a document within the model's context:
# its kept tokens sit one apart, as the model was trained to read neighbours, in every layer and head
# alike; compact positions stay for what reads past the trained window (they never pass sinks + M + c).
# The tuned recipe (--question-pool tuned) keeps its own rule: shared below 256 entries per KV head only.
ATTENTIONS = ("sdpa", "padded")


@dataclass(frozen=True)
class Switch:
    """One difference between memstep and the reference code."""

    choices: tuple[str, ...]
    reference: str  # what the reference code does
    default: str  # memstep's default
    label: str  # the reference's behaviour, in a few words (the app's checkbox)
    help: str


SWITCHES: dict[str, Switch] = {
    "sink_scoring": Switch(
        ("strip", "pool"), "strip", "strip", "sinks stripped before scoring",
        "strip: the sinks are taken out of the keys and the attention's key columns before scoring and "
        "pooling, then put back (the reference); pool: scored and pooled with the rest, kept afterwards "
        "(the keys next to them inherit their attention through the pooling)"),
    "growth_rounding": Switch(
        ("divide-first", "multiply-first"), "divide-first", "divide-first", "divide-first growth rounding",
        "divide-first: square and sqrt budgets are int(i^2 * ((M - a) / (n - 1)^2) + a), the reference's "
        "order; multiply-first: int(i^2 * (M - a) / (n - 1)^2 + a), one token apart at some step in 0.2 "
        "(square) to 1 (sqrt) settings in 100"),
    "gqa_grouping": Switch(
        ("model", "strided"), "strided", "model", "strided GQA grouping",
        "model: a KV head's score sums the query heads that attend through it; strided: KV head j sums "
        "query heads j, j + kv_heads, ... (the reference's view(groups, kv_heads))"),
    "score_rows": Switch(
        ("chunk", "last-c"), "last-c", "chunk", "last c rows of the padded queries",
        "chunk: the chunk's own query rows count; last-c: the last c rows of the zero-padded query block "
        "(c the configured chunk: zero rows count when a chunk is shorter, only the last c when longer), "
        "each key divided by how many of them see it (the reference)"),
    "question_place": Switch(
        ("after", "prompt"), "prompt", "after", "question inside the prompt",
        "after: the question is read after the compressed memory, never compressed; prompt: it ends the "
        "prompt, is prefilled and compressed with the document, the first answer token comes from the last "
        "chunk's logits (the reference)"),
    "ntk": Switch(
        ("none", "dynamic"), "dynamic", "none", "dynamic NTK beyond trained positions",
        "none: RoPE as the model has it (a notice when positions pass its trained length); dynamic: RoPE's "
        "base grows (dynamic NTK) once a step's positions pass max_position_embeddings (the reference)"),
}


@dataclass(frozen=True)
class Fidelity:
    """The value of every switch of ``SWITCHES`` (memstep's defaults)."""

    sink_scoring: str = SWITCHES["sink_scoring"].default
    growth_rounding: str = SWITCHES["growth_rounding"].default
    gqa_grouping: str = SWITCHES["gqa_grouping"].default
    score_rows: str = SWITCHES["score_rows"].default
    question_place: str = SWITCHES["question_place"].default
    ntk: str = SWITCHES["ntk"].default

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value not in SWITCHES[name].choices:
                raise MemstepError(f"{name.replace('_', ' ')} must be one of {', '.join(SWITCHES[name].choices)} "
                                   f"(got {str(value)[:40]!r})")

    @classmethod
    def from_settings(cls, settings: dict) -> Fidelity:
        """The switches named in ``settings`` (other keys ignored; missing ones take memstep's defaults)."""
        return cls(**{f.name: settings[f.name] for f in fields(cls) if settings.get(f.name) is not None})

    def changed(self) -> dict[str, str]:
        """The switches that differ from memstep's defaults."""
        return {k: v for k, v in asdict(self).items() if v != SWITCHES[k].default}

    def with_reference(self, *names: str) -> Fidelity:
        return replace(self, **{n: SWITCHES[n].reference for n in names})

    def with_memstep(self, *names: str) -> Fidelity:
        return replace(self, **{n: SWITCHES[n].default for n in names})

    def as_reference(self) -> set[str]:
        """The switches at the reference's value."""
        return {k for k, v in asdict(self).items() if v == SWITCHES[k].reference}


REFERENCE = Fidelity(**{name: s.reference for name, s in SWITCHES.items()})


def other_value(name: str) -> str:
    """The value of a switch that is not the reference's."""
    return next(v for v in SWITCHES[name].choices if v != SWITCHES[name].reference)


def fidelity_variant(variant: str | None) -> Fidelity:
    """A named set of switches: "memstep" (the defaults), "reference" (all as the reference code),
    "reference-no-<switch>" / "memstep-no-<switch>" (the reference / memstep's defaults with that
    one switch at its other value than the reference's) or "memstep-with-<switch>" (memstep's
    defaults with that one switch as the reference's); switch names with hyphens."""
    if not variant or variant == "memstep":
        return Fidelity()
    if variant == "reference":
        return REFERENCE
    for prefix, base, reference in (("reference-no-", REFERENCE, False), ("memstep-no-", Fidelity(), False),
                                    ("memstep-with-", Fidelity(), True)):
        name = variant[len(prefix):].replace("-", "_") if variant.startswith(prefix) else None
        if name in SWITCHES:
            return replace(base, **{name: SWITCHES[name].reference if reference else other_value(name)})
    names = ", ".join(n.replace("_", "-") for n in SWITCHES)
    raise MemstepError(f"unknown fidelity variant '{variant}': memstep, reference, reference-no-<switch>, "
                       f"memstep-no-<switch> or memstep-with-<switch> ({names})")

DEFAULTS = {"rope": AUTO, "scorer": "chunk-attention", "sinks": 4, "kernel": 5, "attention": "sdpa",
            **asdict(Fidelity())}
PRESETS = {"reference": {"rope": "compact", "scorer": "conv", "sinks": 4, "kernel": 5, "attention": "padded",
                         **asdict(REFERENCE)}}
ROPE_HELP = {
    AUTO: "shared positions for a question-aware memory on a document within the model's context, compact "
          "positions otherwise (memstep's default; --question-pool tuned: shared below 256 entries per KV head)",
    "compact": "contiguous positions, as the reference code: the memory sits at 0..m-1 and the chunk right "
               "after it, so no position exceeds sinks + M + c",
    "document": "every token keeps its true position in the document (memstep's first design)",
    "shared": "compact positions every layer and head agree on: each kept token sits at its rank among the "
              "tokens the memory holds anywhere, so a token has one position in every head",
}


def resolve_rope(rope: str, *, schedule: str, memory: int, question_aware: bool, ntk: str = "none",
                 within_context: bool = True, shared_below: int | None = None) -> str:
    """The RoPE position mode a run uses: ``rope`` itself, or for ``auto`` shared positions for a
    question-aware memory (one of fewer than ``shared_below`` entries per KV head, where given:
    the tuned recipe's rule), compact elsewhere: a full prefill evicts nothing, dynamic NTK
    rescales compact positions only, and a document longer than the model's context
    (``within_context`` False) could put shared positions past the trained ones, where compact
    positions never pass sinks + M + c."""
    if rope != AUTO:
        return rope
    shared = question_aware and schedule != "full" and ntk != "dynamic" and within_context and \
        (shared_below is None or memory < shared_below)
    return "shared" if shared else "compact"


def preset_settings(name: str | None, schedule: str | None = None) -> dict:
    """The settings a preset fixes ({} for none); the reference's local window keeps no sinks."""
    if not name:
        return {}
    if name not in PRESETS:
        raise MemstepError(f"unknown preset '{name}': choose one of {', '.join(PRESETS)}")
    settings = dict(PRESETS[name])
    if name == "reference" and schedule == "local":
        settings["sinks"] = 0  # its local_window keeps no memory at all, sinks included
    return settings


def apply_preset(args) -> None:
    """Fill the options left unset (None) on ``args`` from its preset, then from the defaults."""
    chosen = preset_settings(getattr(args, "preset", None), getattr(args, "schedule", None))
    filled = set()
    for key, default in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, chosen.get(key, default))
            filled.add(key)
    if args.rope != "compact" and "ntk" in filled:  # dynamic NTK rescales the compact positions only
        args.ntk = DEFAULTS["ntk"]
    if getattr(args, "preset", None) == "reference":
        check_reference_run(getattr(args, "schedule", None), getattr(args, "growth", None))


def check_reference_run(schedule: str | None, growth: str | None) -> None:
    """Refuse what the reference code itself cannot run, under its preset."""
    from memstep.schedules import LAYERWISE  # no torch there either

    if schedule == "imdc" and growth in LAYERWISE:
        raise MemstepError(f"the reference code cannot run IMDC with the layer-wise growth '{growth}' (its chunk "
                           "scheduler asks for budgets without a layer and raises a TypeError): use --schedule im, "
                           "a single-curve growth, or no --preset")
    if schedule not in (None, "full", "fm", "im", "imdc", "fim", "local"):
        raise MemstepError(f"the reference code has no '{schedule}' schedule: use full, fm, im, imdc, fim or local, "
                           "or no --preset")
