"""Numbers the page shows about runs: key statistics and the comparison table. Pure."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memstep.memory import format_bytes
from memstep.passkey import answer_contains_passkey
from memstep.records import RunResult, StepRecord


def needle_kept(record: StepRecord, needle: tuple[int, int] | None) -> float | None:
    """Mean fraction of layer-head slots keeping the needle's tokens after ``record``'s step
    (``needle`` in input positions); None without a needle or before it was read."""
    if needle is None or record.tokens_seen < needle[1]:
        return None
    return float(np.mean(record.global_kept_fraction()[needle[0]:needle[1]]))


def passkey_verdict(answer: str | None, passkey: str | None) -> str:
    if passkey is None or answer is None:
        return "—"
    return "✓ yes" if answer_contains_passkey(answer, passkey) else "✗ no"


def above_weights(records: Sequence[StepRecord], measured: bool = False) -> int | None:
    """Peak bytes (modeled, or measured) above the constant weights."""
    if not records:
        return None
    weights = records[0].bytes_modeled_parts.get("weights", 0)
    values = [r.bytes_measured if measured else r.bytes_modeled for r in records]
    values = [v for v in values if v is not None]
    return max(values) - weights if values else None


def stat_cards(items: Sequence[tuple[str, str, str]], progress: float | None = None, summary: str = "",
               now: str = "") -> str:
    """A row of small cards: (key, label, value); ``data-stat=key`` lets tests find them.
    ``progress`` (0..1) draws a progress bar (role progressbar) under them; ``now`` says what is
    happening (a line under the bar); ``summary`` is the charts' text alternative, read by
    screen readers (a polite live region)."""
    cards = "".join(
        f'<div class="memstep-stat" data-stat="{html.escape(key)}"><div class="memstep-stat-label">'
        f'{html.escape(label)}</div><div class="memstep-stat-value">{html.escape(value)}</div></div>'
        for key, label, value in items)
    bar = "" if progress is None else (
        f'<div class="memstep-progress" data-progress="{progress:.3f}" role="progressbar" aria-label="run progress" '
        f'aria-valuemin="0" aria-valuemax="100" aria-valuenow="{100 * progress:.0f}">'
        f'<div style="width:{100 * progress:.1f}%"></div></div>')
    alt = f'<p class="memstep-sr-only" aria-live="polite">{html.escape(summary)}</p>' if summary else ""
    line = f'<p class="memstep-now" id="memstep-now">{html.escape(now)}</p>' if now else ""
    return f'<div class="memstep-stats">{cards}</div>{bar}{line}{alt}'


@dataclass
class ComparedRun:
    """One configuration of a comparison, as far as it has run."""

    label: str
    schedule: str
    records: list[StepRecord]
    steps: int
    result: RunResult | None = None  # set when the run (and its answer) finished
    passkey: str | None = None
    needle: tuple[int, int] | None = None  # input positions
    cpu_seconds: list[float] | None = None  # this process's CPU time per step (CPU runs in this process)
    flops: int | None = None  # the planner's FLOP count of the whole prefill
    truth: object = None  # the document's known answer (ui/truths.TrueAnswer), when there is one

    @property
    def verdict(self) -> str:
        """'✓ right' / '✗ wrong' against the true answer (a passkey document: its passkey), once answered."""
        if self.result is None:
            return ""
        if self.truth is not None:
            return "✓ right" if self.truth.holds(self.result.answer) else "✗ wrong"
        return passkey_verdict(self.result.answer, self.passkey) if self.passkey else ""


# The time ratio compares CPU seconds where this process measures them (a CPU run), else wall
# seconds (a GPU, which no other job shares); the header says which.
COMPARE_HEADERS = ["run", "steps", "wall s", "CPU s", "× FM time", "× FM FLOPs (modeled)", "peak measured",
                   "peak modeled", "above weights", "× FM memory", "kept tokens", "passkey kept", "answer",
                   "right answer"]
COMPARE_WIDTHS = ["11%", "5%", "5%", "5%", "6%", "8%", "7%", "7%", "7%", "6%", "7%", "7%", "11%", "8%"]
ANSWER_CHARS = 160  # an answer in the table (the Run tab shows whole answers)


def compare_headers(cpu: bool) -> list[str]:
    """The table's headers: the time ratio says which seconds it divides."""
    return [("× FM CPU time" if cpu else "× FM wall time") if h == "× FM time" else h for h in COMPARE_HEADERS]


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "—"
    return f"{value / reference:.2f}×"


def _time(run: ComparedRun, cpu: bool) -> float:
    return sum(run.cpu_seconds or []) if cpu else sum(s.seconds for s in run.records)


def _short(text: str) -> str:
    return text if len(text) <= ANSWER_CHARS else text[:ANSWER_CHARS].rsplit(" ", 1)[0] + " …"


def compare_rows(runs: Sequence[ComparedRun]) -> list[list[str]]:
    """One row per run: wall and CPU seconds, time and FLOP ratios, peak bytes measured and
    modeled, kept tokens, passkey, and ratios against the first FM run (— when there is none or
    it has not finished). Time ratios divide CPU seconds when every run measured them."""
    fm = next((r for r in runs if r.schedule == "fm" and r.result is not None), None)
    cpu = bool(runs) and all(r.cpu_seconds is not None for r in runs)
    fm_seconds = _time(fm, cpu) if fm else None
    fm_memory = above_weights(fm.records) if fm else None
    fm_flops = next((r.flops for r in runs if r.schedule == "fm"), None)  # modeled: known before it runs
    rows = []
    for run in runs:
        seconds = sum(s.seconds for s in run.records)
        done = run.result is not None
        last = run.records[-1] if run.records else None
        kept = needle_kept(last, run.needle) if last is not None else None
        measured = max((s.bytes_measured for s in run.records if s.bytes_measured is not None), default=None)
        modeled = max((s.bytes_modeled for s in run.records), default=None)
        rows.append([
            run.label + ("" if done else " (running)" if run.records else " (waiting)"),
            f"{len(run.records)}/{run.steps}",
            f"{seconds:.2f}" if run.records else "—",
            f"{sum(run.cpu_seconds):.2f}" if run.records and run.cpu_seconds is not None else "—",
            _ratio(_time(run, cpu), fm_seconds) if done else "—",
            _ratio(run.flops, fm_flops) if run.flops else "—",
            format_bytes(measured) if run.records else "—",
            format_bytes(modeled) if modeled is not None else "—",
            format_bytes(above_weights(run.records)) if run.records else "—",
            _ratio(above_weights(run.records), fm_memory) if done else "—",
            f"{last.memory_after:,} of {last.tokens_seen:,}" if last is not None else "—",
            f"{kept:.0%}" if kept is not None else "—",
            _short(run.result.answer or "") if done else "",
            run.verdict or "—",
        ])
    return rows
