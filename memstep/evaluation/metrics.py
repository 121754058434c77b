"""From finished cells to the numbers users compare: passkey accuracy (with its Wilson
95% interval), NLL gap to the full cache (mean of per-case paired differences, with a t
interval), retention of the passkey, seconds and peak memory per (configuration, length);
the depth x length accuracy grid per configuration; paired contrasts between
configurations that differ in one setting (RoPE positions, scorer); and the goals.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

from memstep.evaluation.stats import mean_interval, paired_difference_interval, wilson_interval
from memstep.presets import AUTO, resolve_rope
from memstep.question_pool import EARLIER_POOLS, EARLIER_WEIGHT, QUESTION_POOL, TUNED_SHARED_BELOW

REFERENCE = "memstep full"  # the NLL gap is measured against memstep's own full cache
DEFAULT_SCORER = "chunk-attention"  # other scorers are contrasted with the paper's


def case_of(cell: dict) -> tuple:
    """What identifies a case across configurations (the pairing of paired differences)."""
    return cell.get("haystack"), cell["length"], cell["depth"], cell["seed"], cell.get("kind", "passkey")


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return mean(values) if values else None


def _max(values) -> int | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def summarize(cells: list[dict]) -> dict:
    """Rows per (configuration, length), per-configuration heatmaps, paired contrasts, the
    goals and the configurations a peer beats."""
    reference = {case_of(c): c["continuation_nll"]
                 for c in cells if c["label"] == REFERENCE and c["continuation_nll"] is not None}
    # accuracy is counted on the cases the full cache answers: the others say nothing about the memory
    answered = {case_of(c) for c in cells if c["label"] == REFERENCE and c["correct"]}
    has_reference = {case_of(c) for c in cells if c["label"] == REFERENCE}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for cell in cells:
        groups[(cell["label"], cell["length"])].append(cell)
    rows = []
    for (label, length), group in sorted(groups.items(), key=lambda item: (item[0][1], _order(item[1][0]), item[0][0])):
        # paired: this configuration's NLL minus the full cache's on the same case
        gap = mean_interval(c["continuation_nll"] - reference[case_of(c)] for c in group
                            if c["continuation_nll"] is not None and case_of(c) in reference)
        kept = mean_interval(mean(c["retention"]) for c in group if c.get("retention"))
        correct = sum(1 for c in group if c["correct"])
        low, high = wilson_interval(correct, len(group))
        peak, baseline = _max(c["peak_rss_bytes"] for c in group), _max(c["baseline_rss_bytes"] for c in group)
        counted = [c for c in group if case_of(c) in answered]
        counted_correct = sum(1 for c in counted if c["correct"])
        counted_low, counted_high = wilson_interval(counted_correct, len(counted)) if counted else (None, None)
        rows.append({
            "label": label, "config": group[0]["config"], "peer": group[0]["peer"], "length": length,
            "cells": len(group), "correct": correct, "accuracy": correct / len(group),
            "accuracy_low": low, "accuracy_high": high,
            "haystacks": sorted({str(c.get("haystack")) for c in group}),
            "nll": _mean(c["continuation_nll"] for c in group),
            **_interval("nll_gap", gap),
            **_interval("retention", kept, clip=(0.0, 1.0)),
            "retained_and_correct": _agreement(group),
            "prefill_seconds": _mean(c["prefill_seconds"] for c in group),
            "seconds": _mean(c["seconds"] for c in group),
            "peak_rss_bytes": peak, "baseline_rss_bytes": baseline,
            "working_rss_bytes": peak - baseline if peak is not None and baseline is not None else None,
            "peak_device_bytes": _max(c.get("peak_device_bytes") for c in group),
            "memory_entries": _max(c["memory_entries"] for c in group),
            "entries_mean": _mean(c["memory_entries"] for c in group),
            # the full cache answered `counted` of the cases with a reference; this row `counted_correct` of them
            "counted": len(counted), "counted_correct": counted_correct,
            "reference_cases": sum(1 for c in group if case_of(c) in has_reference),
            "counted_accuracy": counted_correct / len(counted) if counted else None,
            "counted_low": counted_low, "counted_high": counted_high,
            **_interval("kl", mean_interval(c.get("kl") for c in group), clip=(0.0, None)),
            **_interval("top1", mean_interval(c.get("top1") for c in group), clip=(0.0, 1.0)),
            **_interval("needle_whole", mean_interval(c.get("needle_whole") for c in group), clip=(0.0, 1.0)),
            "kinds": sorted({c.get("kind", "passkey") for c in group}),
            # which layers the retention counts: "global" on a hybrid model (sliding layers hold their window)
            "retention_layers": _max(c.get("retention_layers") for c in group),
            "peer_settings": peer_settings(group),
        })
    for length, budget in sorted({(r["length"], r["config"].get("budget") or 0) for r in rows}):
        anchor = anchor_of(rows, length, budget or None)  # the row the others at its length and budget pair with
        if anchor is not None:
            anchor["anchor"] = True
    return {"rows": rows, "heatmaps": heatmaps(cells), "contrasts": contrasts(cells, rows), "goals": goals(rows),
            "dominated": dominated(rows), "paired": paired(cells, rows, answered)}


def peer_settings(group: list[dict]) -> dict | None:
    """A configuration's settings as its cells recorded them (a press's window, pooling,
    chunk; memstep's pool, weight, chunk), with the ranges of what varies by case (the
    window follows each question's length, kept entries the chunk rounding)."""
    found = [c["settings"] for c in group if c.get("settings")]
    if not found:
        return None
    out = {}
    for key in sorted({k for s in found for k in s}):
        values = [s.get(key) for s in found if s.get(key) is not None]
        if not values:
            out[key] = None
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and len(set(values)) > 1:
            out[key] = [min(values), max(values)]
        else:
            out[key] = values[0]
    return out


def anchor_of(rows: list[dict], length: int, budget: int | None = None) -> dict | None:
    """What the other rows are paired with at a length (and memory budget, when given: a row is
    never paired across budgets): memstep's question-aware FM at its default (default_memory);
    where none ran, its question-agnostic FM at the RoPE positions memstep picks for it."""
    found = default_memory(rows, length, budget)
    if found is None:
        found = _at_auto(_defaults(rows, length, budget, "fm", False, (None,), (None,)), "fm", False, None)
    return found


def default_memory(rows: list[dict], length: int, budget: int | None = None, schedule: str = "fm") -> dict | None:
    """memstep's question-aware memory of ``schedule`` at the engine's default (no pool or weight
    set) or at an earlier default pool (results from before the default changed, labelled with
    their pool), whichever ran the most cases there, today's on a tie: a grid run under an earlier
    default pairs with it, not with a few cases of today's default run in an ablation. Each at the
    RoPE positions memstep's default picks for it (auto) before any other (an earlier default: the
    rule of its day, shared positions below 256 entries per head)."""
    tiers = [((None,), (None,), None)] + [((None, pool) if pool == QUESTION_POOL else (pool,), (None, EARLIER_WEIGHT),
                                           TUNED_SHARED_BELOW) for pool in EARLIER_POOLS]
    found = [_at_auto(_defaults(rows, length, budget, schedule, True, pools, weights), schedule, True, below)
             for pools, weights, below in tiers]
    # max keeps the first of equals: today's default
    return max((row for row in found if row is not None), key=lambda row: row.get("cells") or 0, default=None)


def _defaults(rows, length, budget, schedule, aware, pools, weights) -> list[dict]:
    return [row for row in rows if row["length"] == length and _default_of(row["config"], schedule, aware, pools, weights)
            and (budget is None or row["config"].get("budget") == budget)]


def _at_auto(found: list[dict], schedule: str, aware: bool, below: int | None) -> dict | None:
    """The first of ``found`` at the positions `auto` picks for it, else the first."""
    chosen = [row for row in found if row["config"].get("rope") == resolve_rope(
        AUTO, schedule=schedule, memory=row["config"].get("budget") or 0, question_aware=aware, shared_below=below)]
    return (chosen or found or [None])[0]


def _default_of(c: dict, schedule: str, aware: bool, pools: tuple, weights: tuple) -> bool:
    return c["kind"] == "memstep" and c["schedule"] == schedule and bool(c.get("question_aware")) == aware \
        and c.get("question_pool") in pools and c.get("question_weight") in weights and not c.get("fidelity") \
        and not c.get("span")


def paired(cells: list[dict], rows: list[dict], answered: set) -> list[dict]:
    """Each row against the anchor at its length, on the cases both ran: the accuracy
    difference on the cases the full cache answers (Newcombe's paired interval), and the
    mean per-case differences of KL, top-1 agreement and whole-needle retention (t
    intervals). Positive accuracy and top-1, negative KL: the row does better."""
    by_case = defaultdict(dict)
    for cell in cells:
        by_case[(cell["label"], cell["length"])][case_of(cell)] = cell
    out = []
    for row in rows:
        anchor = anchor_of(rows, row["length"], row["config"].get("budget"))
        if anchor is None or anchor["label"] == row["label"] or row["label"] == REFERENCE:
            continue
        mine, theirs = by_case[(row["label"], row["length"])], by_case[(anchor["label"], anchor["length"])]
        shared = [k for k in mine if k in theirs]
        counted = [k for k in shared if k in answered]
        entry = {"label": row["label"], "anchor": anchor["label"], "length": row["length"],
                 "cases": len(shared), "counted": len(counted)}
        if counted:
            pairs = [(mine[k]["correct"], theirs[k]["correct"]) for k in counted]
            diff, low, high = paired_difference_interval(sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs),
                                                         sum(b and not a for a, b in pairs),
                                                         sum(not a and not b for a, b in pairs))
            entry.update(accuracy_difference=diff, accuracy_difference_low=low, accuracy_difference_high=high,
                         only_row=sum(a and not b for a, b in pairs), only_anchor=sum(b and not a for a, b in pairs))
        for metric in ("kl", "top1", "needle_whole"):
            found = mean_interval(mine[k][metric] - theirs[k][metric] for k in shared
                                  if mine[k].get(metric) is not None and theirs[k].get(metric) is not None)
            entry.update(_interval(f"{metric}_difference", found))
        out.append(entry)
    return out


def _interval(name: str, found: dict | None, clip: tuple[float, float] | None = None) -> dict:
    """``name`` (the mean), ``name_low``/``name_high`` (95% t interval) and ``name_cases``."""
    if found is None:
        return {name: None, f"{name}_low": None, f"{name}_high": None, f"{name}_cases": 0}
    low, high = found["low"], found["high"]
    if clip and low is not None:  # a fraction's interval stays a fraction (a KL stays >= 0)
        low = max(clip[0], low)
        high = high if clip[1] is None else min(clip[1], high)
    return {name: found["mean"], f"{name}_low": low, f"{name}_high": high, f"{name}_cases": found["n"]}


def _order(cell: dict) -> int:
    return {"memstep": 0, "kvpress": 1, "hf": 2}.get(cell["config"]["kind"], 3)


def _agreement(group: list[dict]) -> float | None:
    """How often 'the passkey is fully in memory (every layer, every head)' and 'the answer
    is right' agree: relates retention to accuracy."""
    pairs = [(min(c["retention"]) >= 1.0, c["correct"]) for c in group if c.get("retention")]
    return mean(1.0 if kept == correct else 0.0 for kept, correct in pairs) if pairs else None


def heatmaps(cells: list[dict]) -> dict:
    """Per configuration: accuracy over seeds and haystacks for each (depth, length), and
    the number of cases behind each."""
    grid: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for cell in cells:
        grid[cell["label"]][(cell["depth"], cell["length"])].append(1.0 if cell["correct"] else 0.0)
    out = {}
    for label, values in grid.items():
        depths = sorted({d for d, _ in values})
        lengths = sorted({n for _, n in values})
        out[label] = {"depths": depths, "lengths": lengths,
                      "accuracy": [[mean(values[(d, n)]) if (d, n) in values else None for n in lengths]
                                   for d in depths],
                      "cases": [[len(values.get((d, n), ())) for n in lengths] for d in depths]}
    return out


def _differs_in(a: dict, b: dict) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def contrasts(cells: list[dict], rows: list[dict]) -> list[dict]:
    """Paired comparisons on the cases both ran, between memstep configurations at the same
    length that differ in one setting: RoPE positions (compact - document, shared - compact), the scorer
    (each other scorer - chunk-attention) and question-aware - agnostic. Accuracy as the
    discordant pairs (the cases one answers and the other does not), the NLL as the mean
    per-case difference with its 95% t interval (negative: the first configuration predicts
    the held-out prose better)."""
    by_case = defaultdict(dict)
    for cell in cells:
        by_case[(cell["label"], cell["length"])][case_of(cell)] = cell
    memstep = [r for r in rows if r["config"]["kind"] == "memstep" and r["config"]["schedule"] != "full"]
    out = []
    for a in memstep:
        for b in memstep:
            differs = _differs_in(a["config"], b["config"])
            if a["length"] != b["length"] or differs not in ({"rope"}, {"scorer"}, {"question_aware"}):
                continue
            axis = differs.pop()
            pair = (a["config"].get(axis), b["config"].get(axis))
            if pair not in (("compact", "document"), ("shared", "compact"), (True, None), (True, False)) and \
                    not (axis == "scorer" and b["config"]["scorer"] == DEFAULT_SCORER):
                continue
            first, second = by_case[(a["label"], a["length"])], by_case[(b["label"], b["length"])]
            shared = [k for k in first if k in second]
            if not shared:
                continue
            nll = mean_interval(first[k]["continuation_nll"] - second[k]["continuation_nll"] for k in shared
                                if None not in (first[k]["continuation_nll"], second[k]["continuation_nll"]))
            out.append({"axis": axis, "length": a["length"],
                        "first": a["label"], "second": b["label"], "cases": len(shared),
                        "first_correct": sum(first[k]["correct"] for k in shared),
                        "second_correct": sum(second[k]["correct"] for k in shared),
                        "only_first": sum(first[k]["correct"] and not second[k]["correct"] for k in shared),
                        "only_second": sum(second[k]["correct"] and not first[k]["correct"] for k in shared),
                        **_interval("nll_difference", nll)})
    return out


def goals(rows: list[dict]) -> dict:
    """The issue's goals, as measured (never tuned for): IMDC accuracy within 5 points of FM
    at the same budget, scorer, growth and length; IMDC's peak memory at most half of each
    kvpress press at the longest length and the same budget, at no more wall time."""
    memstep = [r for r in rows if r["config"]["kind"] == "memstep"]
    accuracy = []
    for imdc in (r for r in memstep if r["config"]["schedule"] == "imdc"):
        for fm in memstep:
            c, f = imdc["config"], fm["config"]
            if f["schedule"] == "fm" and _like(f) == _like(c) \
                    and fm["length"] == imdc["length"] and c["growth"] in (None, "linear"):
                points = 100 * (imdc["accuracy"] - fm["accuracy"])
                accuracy.append({"imdc": imdc["label"], "fm": fm["label"], "length": imdc["length"],
                                 "imdc_accuracy": imdc["accuracy"], "fm_accuracy": fm["accuracy"],
                                 "imdc_cases": imdc["cells"], "fm_cases": fm["cells"],
                                 "points": round(points, 1), "met": points >= -5.0})
    longest = max((r["length"] for r in rows), default=None)
    memory = []
    for imdc in (r for r in memstep if r["config"]["schedule"] == "imdc" and r["length"] == longest):
        for press in (r for r in rows if r["config"]["kind"] == "kvpress" and r["length"] == longest
                      and r["config"]["budget"] == imdc["config"]["budget"]
                      and bool(r["config"].get("question_aware")) == bool(imdc["config"].get("question_aware"))):
            peak_ratio = _ratio(imdc["peak_rss_bytes"], press["peak_rss_bytes"])
            working_ratio = _ratio(imdc["working_rss_bytes"], press["working_rss_bytes"])
            time_ratio = _ratio(imdc["seconds"], press["seconds"])
            # judged on the whole process peak and on the peak above the loaded-model baseline
            memory.append({"imdc": imdc["label"], "kvpress": press["label"], "length": longest,
                           "peak_ratio": peak_ratio, "working_ratio": working_ratio, "seconds_ratio": time_ratio,
                           "met": _met(peak_ratio, time_ratio), "met_above_baseline": _met(working_ratio, time_ratio)})
    return {"imdc_vs_fm_accuracy": accuracy, "imdc_vs_kvpress_memory": memory}


def _like(config: dict) -> tuple:
    """What IMDC and FM must share to be compared: scorer, budget, chunk, RoPE positions and
    whether the question scored the steps."""
    return (config["scorer"], config["budget"], config["chunk"], config.get("rope"),
            bool(config.get("question_aware")))


def _met(memory_ratio, time_ratio) -> bool | None:
    return None if None in (memory_ratio, time_ratio) else memory_ratio <= 0.5 and time_ratio <= 1.0


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def dominated(rows: list[dict]) -> list[dict]:
    """memstep configurations that lose to a peer at the same length on both quality
    (lower accuracy, or equal accuracy and a higher NLL) and cost (more peak memory and
    more seconds)."""
    out = []
    for row in (r for r in rows if not r["peer"]):
        for peer in (r for r in rows if r["peer"] and r["length"] == row["length"]):
            worse_quality = peer["accuracy"] > row["accuracy"] or (
                peer["accuracy"] == row["accuracy"] and None not in (peer["nll"], row["nll"])
                and peer["nll"] < row["nll"] - 1e-3)
            worse_cost = None not in (peer["peak_rss_bytes"], row["peak_rss_bytes"], peer["seconds"], row["seconds"]) \
                and peer["peak_rss_bytes"] < row["peak_rss_bytes"] and peer["seconds"] < row["seconds"]
            if worse_quality and worse_cost:
                out.append({"label": row["label"], "length": row["length"], "beaten_by": peer["label"],
                            "accuracy": row["accuracy"], "peer_accuracy": peer["accuracy"],
                            "peak_rss_bytes": row["peak_rss_bytes"], "peer_peak_rss_bytes": peer["peak_rss_bytes"],
                            "seconds": row["seconds"], "peer_seconds": peer["seconds"]})
    return out
