"""`memstep eval` end to end on the embedded model: a 2-cell grid with tiny haystacks,
run twice (the second run computes nothing), with JSON, plots and a README block."""

from __future__ import annotations

import json

import pytest

from memstep.cli import main
from memstep.evaluation.report import END, START
from memstep.evaluation.store import load_summary


@pytest.mark.slow
def test_eval_two_cells_then_resume(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"## Evaluation\n{START}\n{END}\n")
    out = tmp_path / "results"
    argv = ["eval", "--lengths", "160", "--depths", "0.5", "--schedules", "full,fm", "--scorers", "recency",
            "--budgets", "32", "--chunk", "64", "--max-new-tokens", "16", "--continuation-tokens", "8",
            "--output", str(out), "--readme", str(readme), "--quiet"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "2 cells run, 0 already done" in first
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted(c["label"] for c in cells) == ["fm recency M=32", "memstep full"]
    full = next(c for c in cells if c["label"] == "memstep full")
    fm = next(c for c in cells if c["label"] != "memstep full")
    assert full["correct"], full["answer"]  # the full cache answers a 160-token haystack
    assert full["retention"] == [1.0] * 30 and full["memory_entries"] > 100
    assert fm["memory_entries"] == 36  # budget 32 + 4 sinks
    for cell in cells:
        assert cell["peak_rss_bytes"] >= cell["baseline_rss_bytes"] > 100 * 2**20
        assert cell["seconds"] >= cell["prefill_seconds"] > 0 and cell["continuation_nll"] > 0
    summary = load_summary(out)
    assert {r["label"] for r in summary["rows"]} == {"memstep full", "fm recency M=32"}
    assert (out / "heatmaps.html").stat().st_size > 1000 and (out / "tradeoff.html").exists()
    assert "| 160 | memstep full | 100% (1)" in readme.read_text()

    assert main(argv + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["run"]["ran"] == 0 and again["run"]["skipped"] == 2
    assert len((out / "cells.jsonl").read_text().splitlines()) == 2


def test_eval_bad_input_exits_2(tmp_path, capsys):
    assert main(["eval", "--lengths", "abc", "--output", str(tmp_path)]) == 2
    assert "whole numbers" in capsys.readouterr().err
    assert main(["eval", "--depths", "1.5", "--output", str(tmp_path)]) == 2
    assert main(["eval", "--schedules", "lifo", "--output", str(tmp_path)]) == 2
    assert "unknown schedule" in capsys.readouterr().err
