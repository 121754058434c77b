"""The grid: which configurations run, and the key that identifies each finished cell.

A configuration is one way of holding the document: a memstep schedule with a scorer, a
memory budget and RoPE positions (compact, document or shared), a kvpress press at the same final
budget, or the plain Hugging Face full cache. A cell is a configuration on one case
(haystack, length, depth, seed); its key hashes everything that could change its result,
so a resumed run never recomputes it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

from memstep.errors import MemstepError
from memstep.presets import AUTO, ROPE_CHOICES
from memstep.question_pool import (EARLIER_POOLS, EARLIER_WEIGHT, QUESTION_POOL, QUESTION_WEIGHT, RAN_AS, before_last_cut,
                                   last_at, pool_at, spans_at)
from memstep.schedules import GROWTHS

# kvpress presses run by the peer (peers/kvpress_peer.py), named as kvpress names them; their
# settings (the authors') live in the peer script and are recorded with every cell.
PRESSES = ("snapkv", "chunkkv", "finch", "keydiff", "knorm", "streaming-llm", "observed-attention",
           "finch-chunked", "finch-unrotated", "snapkv-max15")
# snapkv-max15: SnapKV with its window's scores max-pooled over 15 keys (the SnapKV code's
# "maxpool" option, at the width of memstep's question pool) in place of kvpress's avg-pool of 5
# Question-aware by design: they read the question at the end of the context they compress
# (finch as kvpress's registry runs it; -chunked: per-chunk top-k, chunks of c; -unrotated: keys
# left at their document positions: variants that tell Finch's parts apart).
QUESTION_PRESSES = ("finch", "finch-chunked", "finch-unrotated")
# kvpress's presses by their papers' names (the evaluation's scorer keys), for what a reader sees
PRESS_NAMES = {"chunkkv": "ChunkKV", "snapkv": "SnapKV", "finch": "Finch", "finch-unrotated": "Finch (unrotated)",
               "keydiff": "KeyDiff", "streaming-llm": "StreamingLLM", "knorm": "Knorm", "tova": "TOVA",
               "expected-attention": "ExpectedAttention", "observed-attention": "ObservedAttention",
               "finch-chunked": "Finch (chunked)", "snapkv-max15": "SnapKV max-pool 15"}
# Question-agnostic by design (their score never reads a query): always run with the question after.
AGNOSTIC_PRESSES = ("keydiff", "knorm", "streaming-llm")
# Every press kvpress 0.5.5 ships (its __init__), so a name it lacks is told apart from one
# memstep's peer does not wire.
KVPRESS_055 = ("adakv", "block", "cam", "cap", "chunk", "chunkkv", "compactor", "composed",
               "compression-ratio-decoding", "criticalkv", "critical-adakv", "cur", "decoding", "dms",
               "duo-attention", "entropy-gated-chunkkv", "expected-attention", "expected-attention-stats",
               "fastkvzip", "finch", "key-rerotation", "keydiff", "knorm", "kvcompose", "kvgrad", "kvzap", "kvzip",
               "lagkv", "leverage-score", "lukv", "merging", "non-causal-attn", "observed-attention",
               "per-layer-compression", "prefill-decoding", "pyramidkv", "qfilter", "random", "restorekv",
               "simlayerkv", "snapkv", "streaming-llm", "think", "tova")
PEERS = ("kvpress", "hf")
ATTENTION_SCORERS = ("chunk-attention", "conv", "snapkv", "vatp")  # the ones question-aware scoring extends
# "once": one compression at the end (one step reads the whole document, then cuts to M):
# what chunked question-awareness is measured against.
SCHEDULE_CHOICES = ("full", "fm", "im", "imdc", "once") + tuple(f"im-{g}" for g in GROWTHS) \
    + tuple(f"imdc-{g}" for g in GROWTHS)


@dataclass(frozen=True)
class Config:
    """One way to hold the document. ``kind``: memstep | kvpress | hf."""

    kind: str
    schedule: str = "full"  # memstep schedule (kvpress/hf: "full" = one prefill pass)
    growth: str | None = None
    scorer: str | None = None  # memstep scorer or kvpress press
    budget: int | None = None  # memory budget M in tokens, sinks not counted
    chunk: int | None = None
    rope: str | None = None  # memstep with eviction only: compact | document | shared (full: no eviction, same)
    question_aware: bool = False  # memstep: the question's attention scores each step; kvpress: the
    # question at the end of the compressed context (so SnapKV's window holds it)
    fidelity: str | None = None  # memstep: a set of the reference switches (presets.fidelity_variant); None: memstep's
    question_pool: str | None = None  # memstep question-aware: max:N | mean:N | none; None: the engine's default
    question_weight: float | None = None  # memstep question-aware: the question's share; None: the engine's default
    span: str | None = None  # memstep: span-preserving selection (memstep.spans); None: the token top-k

    @property
    def label(self) -> str:
        if self.kind == "hf":
            return "hf full cache"
        aware = " question-aware" if self.question_aware else ""
        if self.kind == "kvpress":
            return f"kvpress {self.scorer} M={self.budget}{aware}"
        if self.schedule == "full":
            return "memstep full"
        name = self.schedule if self.growth in (None, "linear") else f"{self.schedule}-{self.growth}"
        ways = f" [{self.fidelity}]" if self.fidelity else ""
        ablation = (f" pool={self.question_pool}" if self.question_pool else "") + \
            (f" weight={self.question_weight:g}" if self.question_weight is not None else "") + \
            (f" span={self.span}" if self.span else "")
        return f"{name} {self.scorer} M={self.budget}" + (f" {self.rope}" if self.rope else "") + aware + ablation + ways

    @property
    def is_peer(self) -> bool:
        return self.kind != "memstep"

    def to_dict(self) -> dict:
        """Its fields; ``question_aware`` only when set, so the keys of the cells of every
        configuration from before that axis stay what they were."""
        data = asdict(self)
        if not data["question_aware"]:
            del data["question_aware"]
        for axis in ("fidelity", "question_pool", "question_weight", "span"):
            if data[axis] is None:  # the engine's defaults: the keys of the cells from before the axis
                del data[axis]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Config:
        """A configuration from its dict; one written before the rope axis existed (no
        "rope" field) ran at true document positions, so it reads as rope "document"."""
        fields = {k: data.get(k) for k in ("kind", "schedule", "growth", "scorer", "budget", "chunk", "rope")}
        fields["question_aware"] = bool(data.get("question_aware"))
        fields["fidelity"] = data.get("fidelity")
        fields["question_pool"] = data.get("question_pool")
        fields["question_weight"] = data.get("question_weight")
        fields["span"] = data.get("span")
        if fields["kind"] == "memstep" and fields["schedule"] != "full" and fields["rope"] is None:
            fields["rope"] = "document"
        return cls(**fields)


# The only haystack `memstep eval` used before cases carried their haystack's name.
LEGACY_HAYSTACK = "pride_and_prejudice_ch1-12.txt"


def upgrade_cell(cell: dict) -> dict:
    """A stored cell in today's form. Cells written before the rope and haystack axes keep
    their key and read as what they were: true document positions, on the one bundled
    haystack of that time. Today's cases (each in its own window of its text) have other
    keys, so an old cell is never taken for a new one."""
    if "config" not in cell:
        return cell
    config = Config.from_dict(cell["config"])
    key = cell["key"]
    chunked = isinstance((cell.get("settings") or {}).get("chunk_length"), int)
    if config.kind == "kvpress" and config.scorer == "finch" and chunked:
        # run chunk by chunk before finch followed kvpress's registry (one top-k): that is finch-chunked
        # now, under a key of its own, so the registry's finch runs on these cases anew
        config, key = replace(config, scorer="finch-chunked"), key + "-chunked"
    if config.kind == "memstep" and config.question_aware:
        ran = (cell.get("settings") or {}).get("question_weight") or EARLIER_WEIGHT
        if config.question_weight is None and ran != QUESTION_WEIGHT:
            # run when the default weight was another (0.75 until 2026-12-07): it reads as that weight,
            # under a key of its own, so today's default runs on its cases anew
            config, key = replace(config, question_weight=ran), f"{key}-weight-{ran:g}"
        if config.question_pool is None:
            # a cell from before the pool was recorded ran at the first one, max:15; one run at the
            # default of its day reads as that pool, under a key of its own (so today's default runs on
            # its cases anew), unless that pool runs what today's does (runs_as_default)
            pool = (cell.get("settings") or {}).get("question_pool") or EARLIER_POOLS[-1]
            if not runs_as_default(config, pool):
                config, key = replace(config, question_pool=pool), pooled_key(key, pool)
        elif runs_as_default(config, config.question_pool):
            # an explicit pool that runs what the default runs reads as the default; it keeps its key,
            # and a run of the default finds it there (alike_keys)
            config = replace(config, question_pool=None)
        if config.question_weight == QUESTION_WEIGHT:  # the default weight, named
            config = replace(config, question_weight=None)
    return {**cell, "key": key, "config": config.to_dict(), "label": config.label,
            "haystack": cell.get("haystack") or LEGACY_HAYSTACK}


def pooled_key(key: str, pool: str) -> str:
    """The key a cell run at an earlier default pool reads under (upgrade_cell), found again by
    a run that names that pool (alike_keys)."""
    return f"{key}-pool-{pool}"


def runs_alike(config: Config, pool: str, other: str) -> bool:
    """Whether memstep's question-aware ``config`` computes the same at ``pool`` and ``other``: the
    same pool, or, under FM (one budget in every step and layer) or one compression at the end (one
    cut, to the budget), the same pool at its budget (+heads@N/W is +heads from N up and +heads/W
    below; +fade:F@N/K is +fade:F from N up, +fade:F/K below; without /W or /K, no +heads and +carry
    below). IMDC's budget grows through smaller steps, so its pools must match as written but for the
    rules of the last cut alone (+spans, +last), which must match at its budget (the last cut keeps M)."""
    if pool == other:
        return True
    if config.budget is None:
        return False
    if config.schedule in ("fm", "once") and config.growth is None:
        return pool_at(pool, config.budget) == pool_at(other, config.budget)
    return before_last_cut(pool) == before_last_cut(other) and \
        (spans_at(pool, config.budget), last_at(pool, config.budget)) == \
        (spans_at(other, config.budget), last_at(other, config.budget))


def runs_as_default(config: Config, pool: str) -> bool:
    """Whether ``config`` run at ``pool`` computes what it computes at the engine's default pool."""
    return runs_alike(config, pool, QUESTION_POOL)


def alike_keys(config: Config, cell: dict, settings: dict) -> list[str]:
    """The keys a finished cell of ``config`` on ``cell`` may sit under: its own, and those of the
    pools that run the same as its pool (runs_alike) among the default, the pools it ran under by
    name and the earlier defaults: cells run before the default changed, or with a pool named that
    runs what the default runs; and the key a cell run when an alike pool was the default reads under
    (upgrade_cell), so no case runs twice."""
    if config.kind != "memstep" or not config.question_aware:
        return [cell_key(config, cell, settings)]
    pool = config.question_pool or QUESTION_POOL
    known = [QUESTION_POOL, *RAN_AS, *EARLIER_POOLS]
    if config.budget is not None:
        known += [pool_at(pool, config.budget), pool_at(QUESTION_POOL, config.budget)]
    alike = [other for other in dict.fromkeys([pool, *known]) if runs_alike(config, other, pool)]
    pools = ([None] if runs_as_default(config, pool) else []) + alike
    # the default weight left unset or named (1)
    weights = [config.question_weight] + ([QUESTION_WEIGHT] if config.question_weight is None else [])
    keys = [cell_key(config, cell, settings)] + [cell_key(replace(config, question_pool=other, question_weight=weight),
                                                          cell, settings) for other in pools for weight in weights]
    unnamed = cell_key(replace(config, question_pool=None), cell, settings)
    keys += [pooled_key(unnamed, other) for other in alike]
    if config.question_weight == EARLIER_WEIGHT:  # run when that weight was the default's (upgrade_cell)
        bare = f"{cell_key(replace(config, question_pool=None, question_weight=None), cell, settings)}" \
               f"-weight-{EARLIER_WEIGHT:g}"
        keys += [bare] + [pooled_key(bare, other) for other in alike]
    return list(dict.fromkeys(keys))


def cell_key(config: Config, cell: dict, settings: dict) -> str:
    """Stable id of one cell: configuration, case and suite settings (model, haystack...)."""
    text = json.dumps({"config": config.to_dict(), "cell": cell, "settings": settings}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _split_schedule(name: str) -> tuple[str, str | None]:
    if name in ("full", "fm", "once"):
        return name, None
    for base in ("imdc", "im"):
        if name == base:
            return base, "linear"
        if name.startswith(base + "-") and name[len(base) + 1:] in GROWTHS:
            return base, name[len(base) + 1:]
    raise MemstepError(f"unknown schedule '{name}': choose from {', '.join(SCHEDULE_CHOICES)}")


def check_press(press: str) -> None:
    """One readable line for a press memstep cannot run: one kvpress 0.5.5 lacks, or one it
    ships that memstep's peer does not wire."""
    if press in PRESSES:
        return
    if press in KVPRESS_055:
        raise MemstepError(f"kvpress press '{press}' is not wired in memstep's peer: choose from {', '.join(PRESSES)}")
    raise MemstepError(f"unknown kvpress press '{press}': kvpress 0.5.5 has no such press; memstep runs "
                       f"{', '.join(PRESSES)}")


def make_grid(schedules, scorers, budgets, chunk: int, peers=(), presses=PRESSES,
              ropes=(AUTO,), question_aware=(False,), fidelities=(None,),
              question_pools=(None,), question_weights=(None,), spans=(None,)) -> list[Config]:
    """memstep configurations (schedule x scorer x budget x rope x question-aware x the
    reference switches x question pooling x question weight; 'full' once: without eviction no
    axis changes anything), then the peers: each kvpress press at each budget (question-aware
    presses only with the question, question-agnostic ones only without), and the HF full
    cache. Question-aware memstep configurations take the attention-based scorers only; the
    pooling and weight axes apply to them alone."""
    from memstep.presets import fidelity_variant, resolve_rope
    from memstep.question_pool import TUNED_POOL, TUNED_WEIGHT, named_pool, parse_question_pool, shared_below
    from memstep.scorers import SCORERS  # here, not at the top: `memstep --help` needs no torch

    fidelities = [None if f in (None, "memstep") else f for f in fidelities]
    for variant in fidelities:
        fidelity_variant(variant)  # an unknown one fails here, before any work
    question_pools = [None if pool is None else named_pool(pool) for pool in question_pools]  # 'tuned' spelled out
    for pool in question_pools:
        if pool is not None:
            parse_question_pool(pool)
    for weight in question_weights:
        if weight is not None and not 0.0 < weight <= 1.0:
            raise MemstepError(f"question weights must be in (0, 1] (got {weight})")
    from memstep.spans import check_span_budget, parse_span

    settings = [parse_span(span) for span in spans]  # an unknown one fails here, before any work
    spans = [setting.name if setting else None for setting in settings]
    for setting in settings:
        for budget in budgets:
            check_span_budget(setting, budget)

    for scorer in scorers:
        if scorer not in SCORERS:
            raise MemstepError(f"unknown scorer '{scorer}': choose from {', '.join(SCORERS)}")
    for peer in peers:
        if peer not in PEERS:
            raise MemstepError(f"unknown peer '{peer}': choose from {', '.join(PEERS)}")
    for press in presses:
        check_press(press)
    for rope in ropes:
        if rope not in ROPE_CHOICES:
            raise MemstepError(f"unknown RoPE position mode '{rope}': choose from {', '.join(ROPE_CHOICES)}")
    if not ropes:
        raise MemstepError(f"choose at least one RoPE position mode ({', '.join(ROPE_CHOICES)})")
    for budget in budgets:
        if budget < 1:
            raise MemstepError(f"memory budgets must be at least 1 token (got {budget})")
    if chunk < 1:
        raise MemstepError(f"the chunk size must be at least 1 token (got {chunk})")
    configs: list[Config] = []
    for name in schedules:
        schedule, growth = _split_schedule(name)
        if schedule == "full":
            configs.append(Config("memstep", "full"))
            continue
        for ways in fidelities:
            for aware in question_aware:
                pools = question_pools if aware else (None,)
                weights = question_weights if aware else (None,)
                ntk = fidelity_variant(ways).ntk if ways else "none"
                # auto is stored as the mode it picks, so its cells are that mode's cells
                # a named pool runs at its own weight unless one is given (the tuned recipe's 0.75)
                configs += [Config("memstep", schedule, growth, scorer, budget, None if schedule == "once" else chunk,
                                   resolve_rope(rope, schedule=schedule, memory=budget, question_aware=aware, ntk=ntk,
                                                shared_below=shared_below(pool)),
                                   aware, ways, pool, weight if weight is not None or pool != TUNED_POOL else TUNED_WEIGHT,
                                   span)
                            for budget in budgets for scorer in scorers for rope in ropes for span in spans
                            for pool in pools for weight in weights if not aware or scorer in ATTENTION_SCORERS]
    if "kvpress" in peers:
        configs += [Config("kvpress", "full", None, press, budget, question_aware=aware and press not in AGNOSTIC_PRESSES)
                    for aware in question_aware for budget in budgets for press in presses
                    if aware or press not in QUESTION_PRESSES]
    if "hf" in peers:
        configs.append(Config("hf", "full"))
    return list(dict.fromkeys(configs))  # drop repeats, keep order
