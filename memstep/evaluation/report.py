"""The summary as Markdown: the results table (accuracy with its Wilson interval, NLL gap
with its t interval), the paired contrasts, the goals as measured, and every
configuration a peer beats on both quality and cost. ``refresh_readme`` replaces the
block between the evaluation markers of a README, leaving everything else alone."""

from __future__ import annotations

from pathlib import Path

from memstep.errors import MemstepError
from memstep.evaluation.stats import wilson_interval

START = "<!-- eval-results:start -->"
END = "<!-- eval-results:end -->"


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _num(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def accuracy_text(row: dict) -> str:
    """"k/n (xx%, 95% CI a-b%)": the passkeys answered and the Wilson interval (also for a
    summary written before rows carried them: k = accuracy x n)."""
    n = row["cells"]
    k = row["correct"] if "correct" in row else round(row["accuracy"] * n)
    low, high = (row["accuracy_low"], row["accuracy_high"]) if "accuracy_low" in row else wilson_interval(k, n)
    return f"{k}/{n} ({100 * k / n:.0f}%, 95% CI {100 * low:.0f}-{100 * high:.0f}%)"


def plus_minus(mean, low, high, digits=3, signed=True) -> str:
    """"+0.012 ± 0.008" (a symmetric t interval), the mean alone without an interval."""
    if mean is None:
        return "-"
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text if low is None else f"{text} ± {(high - low) / 2:.{digits}f}"


def retention_text(row: dict) -> str:
    if row.get("retention") is None:
        return "-"
    if row.get("retention_low") is None:
        return _pct(row["retention"])
    return f"{_pct(row['retention'])} ({100 * row['retention_low']:.0f}-{100 * row['retention_high']:.0f}%)"


def results_table(summary: dict) -> str:
    head = ("| length | configuration | passkey accuracy | passkey kept | NLL | NLL gap (95% CI) | prefill s "
            "| total s | peak MiB | baseline MiB | peak - baseline MiB |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in summary["rows"]:
        label = f"**{r['label']}**" if r["peer"] else r["label"]
        lines.append(f"| {r['length']} | {label} | {accuracy_text(r)} | {retention_text(r)} | {_num(r['nll'])} "
                     f"| {plus_minus(r['nll_gap'], r.get('nll_gap_low'), r.get('nll_gap_high'))} "
                     f"| {_num(r['prefill_seconds'], 1)} | {_num(r['seconds'], 1)} | {_mib(r['peak_rss_bytes'])} "
                     f"| {_mib(r['baseline_rss_bytes'])} | {_mib(r['working_rss_bytes'])} |")
    return "\n".join(lines)


def contrasts_text(summary: dict) -> str:
    """The paired contrasts (same cases): RoPE positions, then scorers."""
    found = summary.get("contrasts") or []
    lines = ["Paired differences on the same cases (NLL: first minus second, mean and 95% t interval; "
             "negative = the first predicts the held-out prose better):", ""]
    for c in found:
        lines.append(f"- {c['length']} tokens, {c['first']} vs {c['second']}: passkeys {c['first_correct']} vs "
                     f"{c['second_correct']} of {c['cases']} (only the first: {c['only_first']}, only the second: "
                     f"{c['only_second']}); NLL "
                     f"{plus_minus(c['nll_difference'], c['nll_difference_low'], c['nll_difference_high'])}")
    if not found:
        lines.append("- none (no two memstep configurations that differ only in RoPE positions or scorer)")
    return "\n".join(lines)


def _verdict(met) -> str:
    return "not measured" if met is None else ("met" if met else "NOT met")


def goals_text(summary: dict) -> str:
    goals = summary["goals"]
    lines = ["Goal 1, IMDC passkey accuracy within 5 points of FM (same scorer, budget, chunk, RoPE positions, "
             "length; point estimates, see the intervals above):", ""]
    for g in goals["imdc_vs_fm_accuracy"] or []:
        cases = f" of {g['imdc_cases']} cases" if g.get("imdc_cases") else ""
        lines.append(f"- {g['length']} tokens, {g['imdc']} vs {g['fm']}: {100 * g['imdc_accuracy']:.0f}% vs "
                     f"{100 * g['fm_accuracy']:.0f}%{cases} ({g['points']:+.0f} points): "
                     f"{'met' if g['met'] else 'NOT met'}")
    if not goals["imdc_vs_fm_accuracy"]:
        lines.append("- not measured (the grid has no IMDC/FM pair)")
    lines += ["", "Goal 2, IMDC peak memory at most half of kvpress's at the longest length and the same budget, "
              "at no more wall time:", ""]
    for g in goals["imdc_vs_kvpress_memory"] or []:
        lines.append(f"- {g['length']} tokens, {g['imdc']} vs {g['kvpress']}: seconds x{_num(g['seconds_ratio'])}; "
                     f"process peak x{_num(g['peak_ratio'])}: {_verdict(g['met'])}; peak above the loaded-model "
                     f"baseline x{_num(g['working_ratio'])}: {_verdict(g.get('met_above_baseline'))}")
    if not goals["imdc_vs_kvpress_memory"]:
        lines.append("- not measured (no IMDC and kvpress rows at the same budget and length)")
    return "\n".join(lines + ["", dominated_text(summary)])


def dominated_text(summary: dict) -> str:
    """The configurations a peer beats on both quality and cost."""
    lines = ["Configurations a peer beats on both quality and cost (lower accuracy, or equal accuracy and "
             "higher NLL; and more peak memory and more seconds):", ""]
    for d in summary["dominated"]:
        lines.append(f"- {d['length']} tokens: **{d['label']}** ({100 * d['accuracy']:.0f}%, {_mib(d['peak_rss_bytes'])} MiB, "
                     f"{d['seconds']:.1f} s) loses to {d['beaten_by']} ({100 * d['peer_accuracy']:.0f}%, "
                     f"{_mib(d['peer_peak_rss_bytes'])} MiB, {d['peer_seconds']:.1f} s)")
    if not summary["dominated"]:
        lines.append("- none")
    return "\n".join(lines)


def markdown(summary: dict, plots_prefix: str | None = None) -> str:
    """The README's results block: the table, the paired contrasts and the configurations a peer
    beats (the development goals are printed by `memstep eval`, not written into the README)."""
    parts = [results_table(summary), "", contrasts_text(summary), "", dominated_text(summary)]
    if plots_prefix is not None:
        parts += ["", f"![passkey accuracy and NLL gap with 95% intervals]({plots_prefix}intervals.png)", "",
                  f"![passkey heatmaps]({plots_prefix}heatmaps.png)", "",
                  f"![quality vs memory vs seconds]({plots_prefix}tradeoff.png)"]
    return "\n".join(parts)


def refresh_readme(readme: str | Path, block: str) -> None:
    path = Path(readme)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if START not in text or END not in text:
        raise MemstepError(f"{path} has no {START} ... {END} block to refresh: add the two markers "
                           "to the README's Evaluation section")
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    path.write_text(f"{before}{START}\n{block}\n{END}{after}", encoding="utf-8")


# ---- the fair evaluation: peer settings, counted accuracy, KL, paired differences --------------
def _span(value, unit: str = "") -> str:
    """A recorded setting: one value, or the [low, high] range it took over the cases."""
    if isinstance(value, list):
        return f"{value[0]}-{value[1]}{unit}" if value[0] != value[1] else f"{value[0]}{unit}"
    return f"{value}{unit}"


def settings_text(row: dict, short: bool = False) -> str:
    """How a row was set, as its cells recorded it: a press's window, pooling and chunk;
    memstep's chunk, pooling and weight (the engine's defaults when the row does not set them).
    ``short``: the few words a narrow table column holds."""
    config, found = row["config"], row.get("peer_settings") or {}
    if config["kind"] == "hf" or (config["kind"] == "memstep" and config["schedule"] == "full"):
        return "no eviction"
    if config["kind"] == "kvpress" and short:
        parts = [str(found.get("press", config["scorer"])).replace("Press", "")]
        if found.get("window") is not None:
            parts.append(f"window {_span(found['window'])}" + (" = question" if "question" in
                                                                found.get("window_is", "") else ""))
        parts += [f"{label} {found[key]}" if isinstance(found[key], int) else f"no {label}"
                  for key, label in (("chunk_length", "chunks"), ("block_size", "blocks")) if found.get(key)]
        if "kernel 5" in str(found.get("pooling")):
            parts.append("avg-pool 5")
        return ", ".join(parts)
    if config["kind"] == "kvpress":
        press = found.get("press", config["scorer"])
        parts = [press]
        if found.get("window") is not None:
            parts.append(f"window {_span(found['window'])} tokens = {found.get('window_is', '?')}")
        if isinstance(found.get("chunk_length"), int):
            parts.append(f"chunks of {found['chunk_length']}")
        elif found.get("chunk_length"):  # e.g. Finch as kvpress's registry runs it: one top-k over the context
            parts.append(str(found["chunk_length"]).split("(")[-1].rstrip(")"))
        if found.get("block_size"):
            parts.append(f"blocks of {found['block_size']}")
        if found.get("rerotate_keys"):
            parts.append("keys re-rotated")
        elif found.get("rerotate_keys") is False:
            parts.append("keys at their document positions")
        if found.get("layers_pressed"):
            parts.append(found["layers_pressed"])
        if found.get("pooling"):
            parts.append(found["pooling"])
        return "; ".join(parts)
    if short:
        chunk = "one step" if config["schedule"] == "once" else f"c {config.get('chunk')}"
        if not config.get("question_aware"):
            return f"{chunk}, no question"
        return (f"{chunk}, pool {found.get('question_pool') or config.get('question_pool')}, "
                f"weight {found.get('question_weight') or config.get('question_weight')}")
    chunk = "one step (the whole document)" if config["schedule"] == "once" else f"c = {config.get('chunk')}"
    parts = [chunk, f"M = {config.get('budget')}"]
    if config.get("question_aware"):
        parts.append(f"question pooled {found.get('question_pool') or config.get('question_pool') or '?'}, "
                     f"weight {found.get('question_weight') or config.get('question_weight') or '?'}")
    else:
        parts.append("no question")
    return "; ".join(parts)


def counted_text(row: dict) -> str:
    """"22/26 (85%, 95% CI 66-94%)" on the cases the full cache answers; "-" without them."""
    n = row.get("counted") or 0
    if not n:
        return "-"
    k = row["counted_correct"]
    return f"{k}/{n} ({100 * k / n:.0f}%, 95% CI {100 * row['counted_low']:.0f}-{100 * row['counted_high']:.0f}%)"


def interval_text(row: dict, name: str, digits: int = 3, percent: bool = False) -> str:
    mean, low, high = row.get(name), row.get(f"{name}_low"), row.get(f"{name}_high")
    if mean is None:
        return "-"
    if percent:
        return f"{100 * mean:.0f}%" + ("" if low is None else f" ({100 * low:.0f}-{100 * high:.0f}%)")
    return f"{mean:.{digits}f}" + ("" if low is None else f" ({low:.{digits}f}-{high:.{digits}f})")


def entries_text(row: dict) -> str:
    found = row.get("peer_settings") or {}
    if "document_entries" in found:
        return _span(found["document_entries"])
    return "-" if row.get("memory_entries") is None else str(row["memory_entries"])


FAIR_HEAD = ("| length | configuration | settings | entries kept | cases | answered, of the cases the full cache "
             "answers | KL from the full cache, nats/token (95% CI) | top-1 agreement (95% CI) | answer kept whole, "
             "layer-head slots (95% CI) |\n|---:|---|---|---:|---:|---:|---:|---:|---:|")


def fair_table(summary: dict, keep=None) -> str:
    """One row per configuration and length (``keep(row)`` chooses), the settings beside the numbers."""
    lines = [FAIR_HEAD]
    for r in summary["rows"]:
        if keep is not None and not keep(r):
            continue
        label = f"**{r['label']}**" if r["peer"] else r["label"]
        lines.append(f"| {r['length']} | {label} | {settings_text(r)} | {entries_text(r)} | {r['cells']} | {counted_text(r)} "
                     f"| {interval_text(r, 'kl')} | {interval_text(r, 'top1', percent=True)} "
                     f"| {interval_text(r, 'needle_whole', percent=True)} |")
    return "\n".join(lines)


def _points(low, high) -> str:
    return f"{100 * low:+.0f} to {100 * high:+.0f} points"


def paired_table(summary: dict, keep=None) -> str:
    """Each configuration minus the anchor (memstep's question-aware FM at the engine's defaults)
    on the same cases: accuracy on the cases the full cache answers (Newcombe's paired 95%
    interval), KL and top-1 agreement (mean per-case difference, 95% t interval)."""
    lines = ["| length | configuration | minus | cases (counted) | answered: only this / only the anchor "
             "| accuracy difference (95% CI) | KL difference (95% CI) | top-1 difference (95% CI) |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for p in summary.get("paired") or []:
        if keep is not None and not keep(p):
            continue
        accuracy = "-" if p.get("accuracy_difference") is None else \
            f"{100 * p['accuracy_difference']:+.0f} points ({_points(p['accuracy_difference_low'], p['accuracy_difference_high'])})"
        kl = "-" if p.get("kl_difference") is None else plus_minus(p["kl_difference"], p.get("kl_difference_low"),
                                                                     p.get("kl_difference_high"), 4)
        top1 = "-" if p.get("top1_difference") is None else (
            f"{100 * p['top1_difference']:+.1f} points" + ("" if p.get("top1_difference_low") is None else
                                                           f" ({_points(p['top1_difference_low'], p['top1_difference_high'])})"))
        only = "-" if p.get("only_row") is None else f"{p['only_row']} / {p['only_anchor']}"
        lines.append(f"| {p['length']} | {p['label']} | {p['anchor']} | {p['cases']} ({p['counted']}) | {only} "
                     f"| {accuracy} | {kl} | {top1} |")
    return "\n".join(lines)


def unsupported(summary: dict, keep=None) -> list[str]:
    """A sentence for every paired comparison whose intervals include zero: what these cases
    cannot tell apart (so no claim is read into a point estimate)."""
    out = []
    for p in summary.get("paired") or []:
        if keep is not None and not keep(p):
            continue
        same = []
        if p.get("accuracy_difference_low") is not None and p["accuracy_difference_low"] <= 0 <= p["accuracy_difference_high"]:
            same.append(f"accuracy ({_points(p['accuracy_difference_low'], p['accuracy_difference_high'])})")
        if p.get("kl_difference_low") is not None and p["kl_difference_low"] <= 0 <= p["kl_difference_high"]:
            same.append(f"KL ({p['kl_difference_low']:+.4f} to {p['kl_difference_high']:+.4f})")
        if same:
            out.append(f"- {p['length']} tokens, {p['label']} vs {p['anchor']}: the 95% interval of the difference "
                       f"in {' and '.join(same)} includes zero: {p['cases']} cases do not tell them apart there.")
    return out


def _row(summary: dict, length: int, test) -> dict | None:
    return next((r for r in summary["rows"] if r["length"] == length and test(r["config"])), None)


def _at_defaults(config: dict) -> bool:
    """memstep's question settings left at the engine's defaults (not an ablation row)."""
    return not config.get("question_pool") and config.get("question_weight") is None


def _aware(summary: dict, length: int, schedule: str = "fm") -> dict | None:
    """memstep's question-aware row at its default (today's, or the earlier default a grid ran
    under: metrics.default_memory)."""
    from memstep.evaluation.metrics import default_memory

    return default_memory(summary["rows"], length, schedule=schedule)


def _presses(summary: dict, length: int) -> list[dict]:
    return [r for r in summary["rows"] if r["length"] == length and r["config"]["kind"] == "kvpress"]


def _best_answering(peers: list[dict]) -> dict | None:
    """The press that answers most of the counted cases (the lower KL on a tie)."""
    counted = [r for r in peers if r.get("counted")]
    return max(counted, key=lambda r: (r["counted_accuracy"], -(r.get("kl") or 0)), default=None)


def fair_takeaway(summary: dict) -> list[str]:
    """The takeaway, one line per length, from the numbers: memstep's question-aware memory at
    the engine's defaults, its agnostic one, the press closest to the full cache (KL) and the
    one that answers most, each with the settings it ran with."""
    lines = []
    for length in sorted({r["length"] for r in summary["rows"]}):
        full = _row(summary, length, lambda c: c["kind"] == "memstep" and c["schedule"] == "full")
        aware, imdc = _aware(summary, length), _aware(summary, length, "imdc")
        agnostic = _row(summary, length, lambda c: c["kind"] == "memstep" and c["schedule"] == "fm"
                        and not c.get("question_aware"))
        peers = [r for r in _presses(summary, length) if r.get("kl") is not None]
        closest = min(peers, key=lambda r: r["kl"], default=None)
        answers = _best_answering(peers)
        if not (full and aware):
            continue
        parts = [f"**{length:,} tokens**: the full cache answers {full.get('counted', 0)} of "
                 f"{full.get('reference_cases') or full['cells']} cases"]
        shown = [("memstep FM question-aware", aware), ("IMDC question-aware", imdc),
                 ("FM without the question", agnostic)]
        presses = [closest] + ([answers] if answers is not closest else [])  # each press once
        shown += [(peer["label"], peer) for peer in presses if peer is not None]
        for name, row in shown:
            if row is None:
                continue
            parts.append(f"{name} ({settings_text(row)}, {entries_text(row)} entries) answers {counted_text(row)} "
                         f"of those, KL {interval_text(row, 'kl')}")
        lines.append("- " + "; ".join(parts) + ".")
    return lines


def _seconds(row: dict) -> str:
    return "-" if row.get("seconds") is None else f"{row['seconds']:.1f} s"


def _difference(p: dict, name: str, scale: float = 1.0, unit: str = "", digits: int = 3) -> str:
    """"+0.012 (95% CI -0.004 to +0.028)" of a paired difference, the anchor's side flipped
    (``scale`` -1: anchor minus row)."""
    mean, low, high = p.get(f"{name}_difference"), p.get(f"{name}_difference_low"), p.get(f"{name}_difference_high")
    if mean is None:
        return "-"
    low, high = sorted((scale * low, scale * high)) if low is not None else (None, None)
    text = f"{scale * mean:+.{digits}f}{unit}"
    return text if low is None else f"{text} (95% CI {low:+.{digits}f} to {high:+.{digits}f}{unit})"


def _excludes_zero(p: dict, name: str) -> bool:
    low, high = p.get(f"{name}_difference_low"), p.get(f"{name}_difference_high")
    return low is not None and not low <= 0 <= high


def _question_cost(summary: dict, aware: dict) -> str:
    """What question-awareness costs, counted (not timed on a shared machine): the question's
    tokens prefilled again with every chunk, and no more memory."""
    windows = [w for r in summary["rows"] if r["config"]["kind"] == "kvpress" and r["config"].get("question_aware")
               for w in ([(r.get("peer_settings") or {}).get("window")] if r.get("peer_settings") else [])
               if w is not None]
    flat = [v for w in windows for v in (w if isinstance(w, list) else [w])]
    chunk = aware["config"].get("chunk") or 512
    if not flat:
        return (f"It costs the question's tokens, prefilled again with every {chunk}-token chunk, and no more "
                "memory.")
    low, high = min(flat), max(flat)
    tokens = f"{low}-{high}" if low != high else f"{low}"
    return (f"It costs the question's {tokens} tokens, prefilled again with every {chunk}-token chunk (about "
            f"{100 * high / chunk:.0f}% more tokens through the model), and no more memory ({entries_text(aware)} "
            "entries).")


def recommendation(summary: dict, length: int | None = None) -> str:
    """The takeaway a reader needs, from the numbers at one length (the shortest with both):
    whether to use memstep's question-aware memory, what it buys and costs next to the
    question-agnostic one (paired on the same cases), and the closest kvpress press with its
    settings. Says when the intervals do not separate them."""
    lengths = sorted({r["length"] for r in summary["rows"]})
    for at in ([length] if length else lengths):
        aware = _aware(summary, at)
        agnostic = _row(summary, at, lambda c: c["kind"] == "memstep" and c["schedule"] == "fm"
                        and not c.get("question_aware"))
        if aware and agnostic:
            break
    else:
        return ""
    paired = {p["label"]: p for p in summary.get("paired") or [] if p["length"] == at}
    versus = paired.get(agnostic["label"], {})  # agnostic minus aware, on the same cases
    answers_better = versus.get("accuracy_difference_high") is not None and versus["accuracy_difference_high"] < 0
    kl_better = _excludes_zero(versus, "kl") and versus["kl_difference"] > 0
    use = answers_better or kl_better
    text = (f"**Takeaway ({at:,} tokens, M = {aware['config'].get('budget')}).** "
            + ("When the question is known, use question-aware FM" if use else
               "Question-aware FM is not told apart from the question-agnostic memory here")
            + f" ({settings_text(aware)}): it answers {counted_text(aware)} of the cases the full cache answers, "
              f"the agnostic memory {counted_text(agnostic)} (paired difference "
              f"{_difference(versus, 'accuracy', -100, ' points', 0)})"
            + (f"; KL from the full cache over the prose that follows {interval_text(aware, 'kl')} against "
               f"{interval_text(agnostic, 'kl')} (paired {_difference(versus, 'kl', -1)}"
               + ("" if _excludes_zero(versus, "kl") else ": the question costs nothing measurable in general "
                                                          "fidelity") + ")"
               if versus.get("kl_difference") is not None else "; KL not measured for it")
            + f". {_question_cost(summary, aware)}")
    best = _best_answering(_presses(summary, at))
    if best is not None:
        mine = paired.get(best["label"], {})
        text += (f" The best kvpress press here, {best['label']} ({settings_text(best)}), answers "
                 f"{counted_text(best)} (paired difference to memstep's {_difference(mine, 'accuracy', 100, ' points', 0)})"
                 f", KL {interval_text(best, 'kl')}"
                 + (f" (paired {_difference(mine, 'kl')})." if mine.get("kl_difference") is not None else "."))
    return text + _longer(summary, at)


def _longer(summary: dict, shortest: int) -> str:
    """One sentence per longer length: memstep's question-aware FM against the press that answers
    most there, paired on the same cases, and whether the interval tells them apart."""
    out = []
    for at in sorted({r["length"] for r in summary["rows"] if r["length"] > shortest}):
        aware, best = _aware(summary, at), _best_answering(_presses(summary, at))
        if not (aware and aware.get("counted") and best):
            continue
        mine = next((p for p in summary.get("paired") or [] if p["length"] == at and p["label"] == best["label"]), {})
        low, high = mine.get("accuracy_difference_low"), mine.get("accuracy_difference_high")
        if mine.get("accuracy_difference") is None:  # they ran on different cases: nothing to pair
            out.append(f"at {at:,} tokens memstep answers {counted_text(aware)}, {best['label']} "
                       f"{counted_text(best)} (not paired: no counted case in common)")
            continue
        verdict = ("the interval does not tell them apart" if low is None or low <= 0 <= high else
                   f"{best['label'] if low > 0 else 'memstep'} answers more")
        out.append(f"at {at:,} tokens memstep answers {counted_text(aware)}, {best['label']} {counted_text(best)} "
                   f"(paired {_difference(mine, 'accuracy', 100, ' points', 0)}: {verdict})")
    return (" Longer documents: " + "; ".join(out) + ".") if out else ""
