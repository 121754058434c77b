"""benchmarks/word_trace.py's table: counted on the cases the full cache answers, every run with
both kinds of positions, the kept shares averaged over the counted cases only."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _run(right: bool, answer_kept: float, sentence_kept: float) -> dict:
    return {"right": right, "answer": "", "answer_kept": answer_kept, "sentence_kept": sentence_kept}


def test_the_table_counts_only_what_the_full_cache_answers():
    import word_trace

    def runs(right, kept):
        return {f"{rope}: {how}": _run(right, kept, kept / 2) for rope in word_trace.ROPES for how in word_trace.RUNS}

    saved = {"length": 2048, "memory": 128, "chunk": 512, "question_pool": "follow:15", "rows": [
        {"full": _run(True, 1, 1), "runs": runs(True, 0.4)},
        {"full": _run(True, 1, 1), "runs": runs(False, 0.2)},
        {"full": _run(False, 1, 1)},  # not counted, and never run
    ]}
    saved["rows"][1]["runs"]["document: once"] = _run(True, 0.6, 0.5)
    lines = word_trace.table(saved).splitlines()
    assert "2 of 3 word cases counted" in lines[0]
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in lines if line.startswith("| c")
            or line.startswith("| d")}
    assert len(rows) == len(word_trace.ROPES) * len(word_trace.RUNS)
    assert "| 1/2 (9%-91%) | 0.30 | 0.15 |" in rows[("compact", "fm")]  # (0.4 + 0.2) / 2, halved for the sentence
    assert "| 2/2 (34%-100%) | 0.50 | 0.35 |" in rows[("document", "once")]  # (0.4 + 0.6) / 2; (0.2 + 0.5) / 2
