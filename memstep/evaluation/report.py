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
