"""The dev ablation's tables (benchmarks/dev_ablation.py), worked by hand on four cases: each row paired
with its baseline on the cases the full cache answers, against the tuned recipe (the default the folder's
first runs had) or against today's default per schedule and budget."""

from __future__ import annotations

from benchmarks.dev_ablation import table
from memstep.evaluation.stats import paired_difference_interval


def _cells(label: str, right: set[int]) -> list[dict]:
    return [{"haystack": "h", "length": 2048, "depth": 0.5, "seed": s, "kind": "word", "label": label,
             "correct": s in right} for s in range(4)]


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


def _folder(tmp_path, name: str, cells: list[dict]):
    import json

    folder = tmp_path / name
    folder.mkdir()
    (folder / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    return folder


def test_the_decision_pools_every_folder_and_budget_by_the_rule_fixed_first(tmp_path):
    from benchmarks.dev_ablation import decision

    # folder a: carry answers cases 0-2, the default 0-1 (the IMDC rows are not FM: left out)
    a = _folder(tmp_path, "a", FULL + TODAY + CARRY + IMDC + IMDC_CARRY)
    # folder b (another round, the same length) at M = 128: both answer every counted case; at M = 256 on
    # other cases (seeds 10-13) carry answers 10 and 11, the default 10: pooled with folder a's
    both = {0, 1, 2}
    other = [{**c, "seed": c["seed"] + 10} for c in FULL + _cells(TODAY[0]["label"], {0}) + _cells(CARRY[0]["label"], {0, 1})]
    b = _folder(tmp_path, "b", FULL + _cells("fm chunk-attention M=128 shared question-aware pool=max:15 weight=1", both)
                + _cells("fm chunk-attention M=128 shared question-aware pool=max:15+carry weight=1", both) + other)
    text = decision([a, b], "max:15+carry")
    assert f"| 2048 | 128 | 3 vs 3 of 3: {_diff(3, 0, 0, 0, 3).rsplit(' on', 1)[0]} |" in text
    assert f"| 2048 | 256 | 5 vs 3 of 6: {_diff(3, 2, 0, 1, 6).rsplit(' on', 1)[0]} |" in text
    assert f"| pooled | 128, 256 | 8 vs 6 of 9: {_diff(6, 2, 0, 1, 9).rsplit(' on', 1)[0]} |" in text
    d, lo, hi = paired_difference_interval(6, 2, 0, 1)
    assert lo < 0 and text.endswith("keep the default (pooled interval not above 0; no length and M below 0).")
    # a carry that loses every case where the default answers: below 0 there, kept
    worse = _folder(tmp_path, "c", FULL + _cells("fm chunk-attention M=256 shared question-aware pool=max:15 weight=1", both)
                    + _cells("fm chunk-attention M=256 shared question-aware pool=max:15+carry weight=1", set()))
    assert "below 0 at 2048 tokens, M = 256" in decision([worse], "max:15+carry")
    many = [{"haystack": "h", "length": 2048, "depth": 0.5, "seed": s, "kind": "word", "label": label, "correct": right}
            for s in range(20) for label, right in (("memstep full", True), (TODAY[0]["label"], False),
                                                     (CARRY[0]["label"], True))]
    assert decision([_folder(tmp_path, "d", many)], "max:15+carry").endswith(
        "adopt (pooled interval above 0; no length and M below 0).")
    # ahead when pooled, but behind at one length and M beyond its interval: kept
    longer = [{**c, "length": 4096, "label": c["label"].replace("M=256", "M=128"),
               "correct": c["label"] == "memstep full" or c["label"] == TODAY[0]["label"]} for c in many[:15]]
    text = decision([_folder(tmp_path, "e", many + longer)], "max:15+carry")
    assert "| 4096 | 128 | 0 vs 5 of 5:" in text and "| pooled | 128, 256 | 20 vs 5 of 25:" in text
    assert text.endswith("keep the default (pooled interval above 0; below 0 at 4096 tokens, M = 128).")
