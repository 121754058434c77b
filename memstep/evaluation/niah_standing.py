"""Where memstep's question-aware FM stands against each kvpress press on the public needle test:
per (length, budget), the answers counted on the depths the full cache answers, how much of the
answer each keeps, and the paired 95% interval of memstep minus each press with its verdict.

Read from a needle-test summary (``summarize``'s rows and paired entries). The Evaluate tab's first
lines and needle section and the README's needle table are all written from here, so they cannot
disagree."""

from __future__ import annotations

from dataclasses import dataclass

from memstep.evaluation.grid import PRESS_NAMES

# the order the table shows the presses in; its titles name SnapKV's two poolings apart
PRESS_ORDER = ("chunkkv", "snapkv-max15", "snapkv", "finch")
PRESS_TITLES = {**PRESS_NAMES, "snapkv-max15": "SnapKV, max-pool 15", "snapkv": "SnapKV, avg-pool 5"}


@dataclass(frozen=True)
class Versus:
    """One press at the anchor's length and budget; ``lead`` and its interval in points, memstep
    minus the press, on the depths both ran that the full cache answers (None: nothing to pair)."""
    press: str
    correct: int
    counted: int
    retention: float | None
    lead: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def verdict(self) -> str | None:
        if self.lead is None:
            return None
        return "leads" if self.low > 0 else "loses" if self.high < 0 else "ties"


@dataclass(frozen=True)
class Standing:
    length: int
    budget: int
    correct: int
    counted: int
    retention: float | None
    versus: tuple[Versus, ...]


def _order(press: str) -> tuple:
    return (PRESS_ORDER.index(press) if press in PRESS_ORDER else len(PRESS_ORDER), press)


def _anchored(summary: dict, has) -> list[tuple[dict, list[tuple[dict, dict]]]]:
    """The needle rows that pass ``has``: each question-aware FM row the others are paired with (its
    "anchor") with the presses at its length and budget, each beside its paired entry ({} without one)."""
    rows = [r for r in summary.get("rows", []) if r.get("kinds") == ["niah"] and has(r)]
    paired = {(p["label"], p["length"]): p for p in summary.get("paired", [])}
    return [(anchor, [(press, paired.get((press["label"], press["length"])) or {}) for press in rows
                      if press["length"] == anchor["length"] and press["config"]["kind"] == "kvpress"
                      and press["config"].get("budget") == anchor["config"].get("budget")])
            for anchor in rows if anchor.get("anchor") and anchor["config"].get("question_aware")]


def _turned(found: dict, metric: str, scale: float = 1.0) -> tuple[float, float | None, float | None] | None:
    """A paired entry holds the press minus memstep: memstep minus the press (mean, low, high), times
    ``scale``; None without pairs. + 0.0: never "-0"."""
    if found.get(f"{metric}_difference") is None:
        return None
    low, high = found.get(f"{metric}_difference_low"), found.get(f"{metric}_difference_high")
    return (-scale * found[f"{metric}_difference"] + 0.0, None if high is None else -scale * high + 0.0,
            None if low is None else -scale * low + 0.0)


def standings(summary: dict) -> list[Standing]:
    """One Standing per question-aware FM row the others are paired with (its "anchor"), by
    length and budget; presses in PRESS_ORDER."""
    out = []
    for anchor, presses in _anchored(summary, lambda r: r.get("counted")):
        versus = []
        for press, found in presses:
            lead = _turned(found, "accuracy", 100)
            interval = dict(zip(("lead", "low", "high"), lead)) if lead else {}
            versus.append(Versus(press["config"]["scorer"], press["counted_correct"], press["counted"],
                                 press.get("retention"), **interval))
        out.append(Standing(anchor["length"], anchor["config"].get("budget"), anchor["counted_correct"],
                            anchor["counted"], anchor.get("retention"),
                            tuple(sorted(versus, key=lambda v: _order(v.press)))))
    return sorted(out, key=lambda s: (s.length, s.budget))


def _answered(correct: int, counted: int, retention: float | None) -> str:
    return f"{correct}/{counted}" + ("" if retention is None else f" · {retention:.2f}")


def _against(v: Versus) -> str:
    return f"{v.verdict} {PRESS_TITLES.get(v.press, v.press)} ({v.lead:+.0f}, {v.low:+.0f} to {v.high:+.0f})"


def standing_table(found: list[Standing]) -> str:
    """A Markdown table: one row per length and budget, a column per press that ran anywhere (blank
    where it did not run), and memstep's verdict against each press with the paired interval."""
    presses = sorted({v.press for s in found for v in s.versus}, key=_order)
    head = ["tokens", "M", "memstep"] + [PRESS_TITLES.get(p, p) for p in presses] + \
        ["memstep against each press (points, 95% CI)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * 2 + "---:|" * (1 + len(presses)) + "---|"]
    for s in found:
        by_press = {v.press: v for v in s.versus}
        cells = [f"{s.length:,}", str(s.budget), _answered(s.correct, s.counted, s.retention)]
        cells += [_answered(v.correct, v.counted, v.retention) if (v := by_press.get(p)) else "" for p in presses]
        cells.append("; ".join(_against(v) for v in s.versus if v.verdict) or "no press paired here")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


def needle_headline(found: list[Standing]) -> str:
    """One plain sentence over every row: against each press, on how many rows memstep leads, ties
    and loses (paired 95% intervals), whether it keeps more of the answer wherever it leads
    (the reason the measurements give), and where it keeps less. '' without a paired row."""
    rows = [(s, v) for s in found for v in s.versus if v.verdict]
    if not rows:
        return ""
    tally: dict[str, dict[str, int]] = {}
    for _, v in rows:
        tally.setdefault(v.press, {"leads": 0, "ties": 0, "loses": 0})[v.verdict] += 1
    against = "; ".join(
        f"leads {PRESS_TITLES.get(press, press)} on {c['leads']} of {_rows(sum(c.values()))}, ties it on "
        f"{c['ties'] or 'none'} and loses to it on {c['loses'] or 'none'}"
        for press, c in sorted(tally.items(), key=lambda item: _order(item[0])))
    lengths, budgets = sorted({s.length for s in found}), sorted({s.budget for s in found})
    led = [(s, v) for s, v in rows if v.verdict == "leads"]
    kept = [s.retention > v.retention for s, v in led if s.retention is not None and v.retention is not None]
    why = (" Wherever it leads, it keeps more of the answer's entries than the press." if kept and all(kept)
           else f" Where it leads, it keeps more of the answer than the press on {sum(kept)} of {len(kept)} rows."
           if kept else "")
    return (f"On the public needle test ({len(found)} rows: {lengths[0]:,} to {lengths[-1]:,} tokens, M = "
            f"{budgets[0]} to {budgets[-1]}; paired 95% intervals), memstep's question-aware FM {against}."
            f"{why}{_keeps_less(found)}")


def _keeps_less(found: list[Standing]) -> str:
    """Where memstep keeps less of the answer than a press, whatever the answers' verdict (a loss the
    answer counts alone do not show): ' It keeps less of the answer than ChunkKV at 2,048 tokens,
    M = 128.' '' where it keeps at least as much everywhere."""
    where: dict[str, list[str]] = {}
    for s in found:
        for v in s.versus:
            if s.retention is not None and v.retention is not None and s.retention < v.retention:
                where.setdefault(v.press, []).append(f"{s.length:,} tokens, M = {s.budget}")
    if not where:
        return ""
    return " It keeps less of the answer than " + "; than ".join(
        f"{PRESS_TITLES.get(press, press)} at {' and '.join(rows)}"
        for press, rows in sorted(where.items(), key=lambda item: _order(item[0]))) + "."


# ---- fidelity beyond the needle: KL from the full cache and top-1 agreement over the essay that follows

def essay_tokens(summary: dict) -> str:
    """What the run scored beyond the needle, in words: "the 32 essay tokens" from the run's own
    --continuation-tokens (summary["run"]["settings"]), "the essay tokens" where the summary lacks it."""
    tokens = ((summary.get("run") or {}).get("settings") or {}).get("continuation_tokens")
    return f"the {tokens} essay tokens" if isinstance(tokens, int) and tokens > 0 else "the essay tokens"


@dataclass(frozen=True)
class Closeness:
    """One configuration's fidelity at a length and budget, over the depths it ran: the mean KL of its
    next-token distributions from the full cache's over the continuation (nats per token) and its top-1
    agreement; for a press, memstep minus the press on the same depths (means with 95% t intervals)."""
    press: str | None  # None: memstep's row
    cases: int
    kl: float
    top1: float
    kl_lead: tuple[float, float, float] | None = None  # memstep minus the press: negative = memstep closer
    top1_lead: tuple[float, float, float] | None = None  # in points

    @property
    def verdict(self) -> str | None:
        """closer / farther where the KL interval excludes 0, else 'as close'."""
        if self.kl_lead is None or self.kl_lead[1] is None:
            return None
        return "closer" if self.kl_lead[2] < 0 else "farther" if self.kl_lead[1] > 0 else "as close"


@dataclass(frozen=True)
class Fidelity:
    length: int
    budget: int
    memstep: Closeness
    versus: tuple[Closeness, ...]


def fidelities(summary: dict) -> list[Fidelity]:
    """One Fidelity per question-aware FM anchor row that measured KL (``--metrics kl``), by length and
    budget; presses in PRESS_ORDER, each paired with it on the depths both ran."""
    out = []
    for anchor, presses in _anchored(summary, lambda r: r.get("kl") is not None):
        versus = [Closeness(press["config"]["scorer"], press["kl_cases"], press["kl"], press["top1"],
                            _turned(found, "kl"), _turned(found, "top1", 100)) for press, found in presses]
        out.append(Fidelity(anchor["length"], anchor["config"].get("budget"),
                            Closeness(None, anchor["kl_cases"], anchor["kl"], anchor["top1"]),
                            tuple(sorted(versus, key=lambda v: _order(v.press)))))
    return sorted(out, key=lambda f: (f.length, f.budget))


def _lead(found: tuple[float, float, float] | None, digits: int) -> str:
    if found is None or found[1] is None:
        return "not paired"
    mean, low, high = (round(x, digits) + 0.0 for x in found)  # + 0.0: -0.3 shows as +0, not -0
    return f"{mean:+.{digits}f} ({low:+.{digits}f} to {high:+.{digits}f})"


def fidelity_table(found: list[Fidelity]) -> str:
    """A Markdown table, one row per press at each length and budget (the length · budget and memstep's
    KL · top-1 on the first of them): the verdict, the press's KL · top-1, memstep minus the press in KL
    and in top-1 points with the paired 95% t interval, and the depths paired. One row per press, not one
    column: four presses' intervals side by side made a wall of text. The press comes third, so a phone
    shows which press a row is about before it scrolls sideways."""
    head = ["tokens · M", "memstep", "press", "memstep is", "press KL · top-1",
            "KL difference (95% CI)", "top-1 difference (points)", "depths"]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    lines = [line(head), "|---:|---:|---|---|" + "---:|" * 4]
    for f in found:
        first = [f"{f.length:,} · {f.budget}", f"{f.memstep.kl:.2f} · {f.memstep.top1:.2f}"]
        depths = str(f.memstep.cases)
        lines += [line((first if i == 0 else [""] * 2) + [
            PRESS_TITLES.get(v.press, v.press), v.verdict or "", f"{v.kl:.2f} · {v.top1:.2f}",
            _lead(v.kl_lead, 2), _lead(v.top1_lead, 0), depths]) for i, v in enumerate(f.versus)]
        if not f.versus:
            lines.append(line(first + ["no press paired here", "", "", "", "", depths]))
    return "\n".join(lines)


def fidelity_headline(found: list[Fidelity]) -> str:
    """One plain sentence: against each press, on how many rows memstep's memory predicts the essay that
    follows closer to the full cache (lower KL, paired interval below 0), as close, or farther. ''
    without a paired row."""
    tally: dict[str, dict[str, int]] = {}
    for f in found:
        for v in f.versus:
            if v.verdict:
                tally.setdefault(v.press, {"closer": 0, "as close": 0, "farther": 0})[v.verdict] += 1
    if not tally:
        return ""
    against = "; ".join(
        f"closer than {PRESS_TITLES.get(press, press)} on {c['closer'] or 'none'} of {_rows(sum(c.values()))}, "
        f"as close on {c['as close'] or 'none'} and farther on {c['farther'] or 'none'}"
        for press, c in sorted(tally.items(), key=lambda item: _order(item[0])))
    cases = sorted({f.memstep.cases for f in found})
    depths = f"{cases[0]}" if len(cases) == 1 else f"{cases[0]}-{cases[-1]}"
    return (f"Beyond the needle ({_rows(len(found))}, {depths} depths each): over the essay tokens that follow "
            f"each document, memstep's question-aware memory predicts the next token {against} (KL from the "
            f"full cache's predictions, paired 95% t intervals).")
