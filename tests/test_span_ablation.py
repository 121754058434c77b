"""The needle tables' script (benchmarks/span_ablation.py): counts and paired differences on the
cases the full cache answers, against values worked out by hand."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import span_ablation  # noqa: E402

MEMSTEP, PRESS = "fm chunk-attention M=128 compact question-aware", "kvpress chunkkv M=128 question-aware"


def cell(label, depth, correct, retention, budget=128):
    return {"label": label, "length": 2048, "depth": depth, "seed": 0, "haystack": "h", "kind": "niah",
            "correct": correct, "retention": retention, "needle_whole": None, "memory_entries": 132,
            "config": {"budget": budget}}


def test_paired_retention_and_answers_on_the_counted_cases():
    """Four depths, the full cache answers three: memstep's retention minus the press's, case by
    case (0.5 - 0.25, 0.25 - 0.5, 0.75 - 0.25 averaged over layers), its mean and t interval, and
    the answers counted on the three only."""
    cells = [cell(span_ablation.FULL, d, d != 0.9, [1.0, 1.0], budget=None) for d in (0.1, 0.5, 0.7, 0.9)]
    cells += [cell(MEMSTEP, 0.1, True, [0.5, 0.5]), cell(MEMSTEP, 0.5, False, [0.0, 0.5]),
              cell(MEMSTEP, 0.7, True, [1.0, 0.5]), cell(MEMSTEP, 0.9, True, [1.0, 1.0])]
    cells += [cell(PRESS, 0.1, False, [0.25, 0.25]), cell(PRESS, 0.5, True, [0.5, 0.5]),
              cell(PRESS, 0.7, False, [0.5, 0.0]), cell(PRESS, 0.9, True, [0.0, 0.0])]
    rows = {r["label"]: r for r in span_ablation.rows_of(cells, [PRESS])}
    mine = rows[MEMSTEP]
    assert (mine["answered"], mine["cases"]) == (2, 3)
    assert mine["retention"]["mean"] == pytest.approx((0.5 + 0.25 + 0.75) / 3)
    paired = mine["paired"][PRESS]
    assert (paired["cases"], paired["only_this"], paired["only_other"]) == (3, 2, 1)
    kept = paired["retention_difference"]
    assert kept["mean"] == pytest.approx((0.25 - 0.25 + 0.5) / 3) and kept["n"] == 3
    # t(0.975, 2) = 4.303; the differences lie 1/12, -5/12 and 4/12 from their mean: sd sqrt(42/288)
    assert kept["high"] - kept["mean"] == pytest.approx(4.303 * (42 / 288) ** 0.5 / 3 ** 0.5, abs=1e-3)
    assert "retention +0.17 [" in span_ablation.markdown([mine])
    assert PRESS not in rows[PRESS]["paired"]


def test_rows_pair_with_the_default_positions_at_their_budget():
    """{ROPE} names the positions the default of these runs' day (the tuned recipe) read a question-aware
    memory at: shared below 256 entries per head, compact from 256 up."""
    cells = []
    for budget in (128, 256):
        cells += [cell(span_ablation.FULL, 0.5, True, [1.0], budget=None)]
        cells += [cell(f"fm chunk-attention M={budget} {rope} question-aware", 0.5, True, [1.0], budget=budget)
                  for rope in ("compact", "shared")]
        cells += [cell(f"kvpress chunkkv M={budget} question-aware", 0.5, False, [0.5], budget=budget)]
    rows = {r["label"]: r for r in span_ablation.rows_of(cells, ["fm chunk-attention M={M} {ROPE} question-aware"])}
    assert list(rows["kvpress chunkkv M=128 question-aware"]["paired"]) == ["fm chunk-attention M=128 shared question-aware"]
    assert list(rows["kvpress chunkkv M=256 question-aware"]["paired"]) == ["fm chunk-attention M=256 compact question-aware"]
