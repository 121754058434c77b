"""The test split's comparison of rules with the same information (benchmarks/test_split_docs.py):
memstep's default rule in one cut after a full prefill against each press at the same M, on the cases
both ran that the full cache answers, worked by hand on five cases."""

from __future__ import annotations

from benchmarks.test_split_docs import _paired, one_cut_text
from memstep.evaluation.stats import paired_difference_interval


def _cell(seed: int, correct: bool, kind: str, schedule: str, budget: int | None = 256, **config) -> dict:
    return {"haystack": "h", "length": 2048, "depth": 0.5, "seed": seed, "kind": "t-name", "correct": correct,
            "config": {"kind": kind, "schedule": schedule, "budget": budget, "question_aware": True, **config}}


def _cells() -> list[dict]:
    full = [_cell(s, s != 4, "memstep", "full", None) for s in range(5)]  # case 4: the full cache misses it
    once = [_cell(s, s in (0, 1, 2, 4), "memstep", "once") for s in range(5)]
    press = [_cell(s, s == 0, "kvpress", "full", scorer="chunkkv") for s in range(5)]
    tuned = [_cell(s, False, "memstep", "once", question_pool="follow:15", question_weight=0.75) for s in range(5)]
    elsewhere = [_cell(s, True, "kvpress", "full", 512, scorer="snapkv") for s in range(5)]  # no once at 512
    return full + once + press + tuned + elsewhere


def test_one_cut_pairs_the_default_rule_with_each_press_on_the_counted_cases():
    text = one_cut_text(_cells(), 2048)
    # counted: cases 0-3; memstep answers 0, 1, 2; ChunkKV answers 0: both 1, only memstep 2, only ChunkKV 0, neither 1
    d, lo, hi = paired_difference_interval(1, 2, 0, 1)
    assert d == 0.5
    assert f"M = 256: memstep 3/4, chunkkv 1/4, memstep minus chunkkv +50 ({100 * lo:+.0f} to {100 * hi:+.0f})" in text
    assert "snapkv" not in text and "M = 512" not in text  # a press with no one cut beside it at its M
    assert text.count("M = ") == 1  # the tuned recipe's one cut is not the default rule


def test_no_one_cut_no_sentence():
    cells = [c for c in _cells() if c["config"]["schedule"] != "once"]
    assert one_cut_text(cells, 2048) == ""
    assert one_cut_text(_cells(), 4096) == ""


def test_paired_counts_each_kind_of_pair():
    mine = {k: {"correct": v} for k, v in zip("abcde", (True, True, False, False, True))}
    base = {k: {"correct": v} for k, v in zip("abcde", (True, False, True, False, False))}
    assert _paired(mine, base, list("abcde")) == paired_difference_interval(1, 2, 1, 1)
    assert _paired(mine, base, ["a"]) == paired_difference_interval(1, 0, 0, 0)
