"""The dev ablation's tables (benchmarks/dev_ablation.py), worked by hand on four cases: each row paired
with its baseline on the cases the full cache answers, against the tuned recipe (the default the folder's
first runs had) or against today's default per schedule and budget."""

from __future__ import annotations

from benchmarks.dev_ablation import table
from memstep.evaluation.stats import paired_difference_interval


def _cells(label: str, right: set[int]) -> list[dict]:
    return [{"haystack": "h", "depth": 0.5, "seed": s, "kind": "word", "label": label, "correct": s in right}
            for s in range(4)]


FULL = _cells("memstep full", {0, 1, 2})  # case 3: the full cache misses it, counted nowhere
TUNED = _cells("fm chunk-attention M=256 compact question-aware", {0})
TODAY = _cells("fm chunk-attention M=256 shared question-aware pool=max:15 weight=1", {0, 1})
CARRY = _cells("fm chunk-attention M=256 shared question-aware pool=max:15+carry weight=1", {0, 1, 2, 3})
IMDC = _cells("imdc chunk-attention M=256 shared question-aware pool=max:15 weight=1", {1})
IMDC_CARRY = _cells("imdc chunk-attention M=256 shared question-aware pool=max:15+carry weight=1", {0, 2})


def _diff(both: int, only_row: int, only_base: int, neither: int, n: int) -> str:
    d, lo, hi = paired_difference_interval(both, only_row, only_base, neither)
    return f"{100 * d:+.0f} ({100 * lo:+.0f} to {100 * hi:+.0f}) on {n}"


def test_against_today_pairs_each_pool_with_the_default_of_its_schedule():
    rows = table(FULL + TUNED + TODAY + CARRY + IMDC + IMDC_CARRY, "today").splitlines()[2:]
    assert len(rows) == 4 and "tuned recipe" not in "\n".join(rows)  # the tuned recipe's row is not one of today's
    fm_default, fm_carry, imdc_default, imdc_carry = rows
    assert "**the default**: FM, `max:15`, weight 1, shared positions | 2/3 " in fm_default
    # counted cases 0-2: carry answers all three, the default 0 and 1
    assert "FM, `max:15+carry`, weight 1, shared positions | 3/3 " in fm_carry
    assert _diff(2, 1, 0, 0, 3) in fm_carry
    assert "**the default**: IMDC" in imdc_default and "1/3" in imdc_default
    # IMDC carry answers 0 and 2, IMDC's default 1: none both, two carry only, one default only
    assert _diff(0, 2, 1, 0, 3) in imdc_carry


def test_against_the_tuned_recipe_as_before():
    rows = table(FULL + TUNED + TODAY + CARRY, "tuned").splitlines()[2:]
    assert rows[0].startswith("| 256 | **then the default**: FM, the tuned recipe, compact positions | 1/3 ")
    assert _diff(1, 1, 0, 1, 3) in rows[1] and "`max:15`, weight 1" in rows[1]
    assert _diff(1, 2, 0, 0, 3) in rows[2] and "`max:15+carry`, weight 1" in rows[2]
