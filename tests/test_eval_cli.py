"""`memstep eval` end to end on the embedded model: a 6-cell grid with tiny haystacks (two
texts, both RoPE position modes), run twice (the second run computes nothing), with JSON,
plots and a README block."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
            "--budgets", "32", "--chunk", "64", "--ropes", "compact,document", "--max-new-tokens", "16",
            "--continuation-tokens", "8", "--output", str(out), "--readme", str(readme), "--quiet"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "6 cells run, 0 already done" in first and "Paired differences" in first
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    labels = ["fm recency M=32 compact", "fm recency M=32 document", "memstep full"]
    assert sorted(c["label"] for c in cells) == sorted(labels * 2)
    assert {c["haystack"] for c in cells} == {"pride_and_prejudice_ch1-12.txt", "persuasion_excerpt.txt"}
    full = [c for c in cells if c["label"] == "memstep full"]
    assert any(c["correct"] for c in full), [c["answer"] for c in full]  # the full cache answers a tiny haystack
    assert all(c["retention"] == [1.0] * 30 and c["memory_entries"] > 100 for c in full)
    compact, document = ([c for c in cells if c["config"].get("rope") == rope] for rope in ("compact", "document"))
    assert len(compact) == len(document) == 2
    assert all(c["memory_entries"] == 36 for c in compact + document)  # budget 32 + 4 sinks
    # the same cache entries either way; the positions RoPE saw differ, and with them the continuation's NLL
    assert {c["haystack"]: c["continuation_nll"] for c in compact} != {c["haystack"]: c["continuation_nll"]
                                                                        for c in document}
    for cell in cells:
        assert cell["peak_rss_bytes"] >= cell["baseline_rss_bytes"] > 100 * 2**20
        assert cell["seconds"] >= cell["prefill_seconds"] > 0 and cell["continuation_nll"] > 0
    summary = load_summary(out)
    assert [r["label"] for r in summary["rows"]] == labels
    assert summary["run"]["haystacks"] == ["persuasion_excerpt.txt", "pride_and_prejudice_ch1-12.txt"]
    rows = {r["label"]: r for r in summary["rows"]}
    assert rows["memstep full"]["nll_gap"] == 0.0 and rows["fm recency M=32 compact"]["nll_gap_cases"] == 2
    (rope,) = summary["contrasts"]
    assert (rope["first"], rope["second"], rope["cases"]) == ("fm recency M=32 compact", "fm recency M=32 document", 2)
    for name in ("intervals", "heatmaps", "tradeoff"):
        assert (out / f"{name}.html").stat().st_size > 1000
    full_row = rows["memstep full"]
    assert f"| 160 | memstep full | {full_row['correct']}/2 (" in readme.read_text()
    assert "intervals.png" in readme.read_text()

    assert main(argv + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["run"]["ran"] == 0 and again["run"]["skipped"] == 6
    assert len((out / "cells.jsonl").read_text().splitlines()) == 6


def test_eval_bad_input_exits_2(tmp_path, capsys):
    assert main(["eval", "--lengths", "abc", "--output", str(tmp_path)]) == 2
    assert "whole numbers" in capsys.readouterr().err
    assert main(["eval", "--depths", "1.5", "--output", str(tmp_path)]) == 2
    assert main(["eval", "--schedules", "lifo", "--output", str(tmp_path)]) == 2
    assert "unknown schedule" in capsys.readouterr().err
    assert main(["eval", "--ropes", "true", "--output", str(tmp_path)]) == 2
    assert "unknown RoPE position mode" in capsys.readouterr().err
    assert main(["eval", "--haystacks", str(tmp_path / "none.txt"), "--output", str(tmp_path)]) == 2
    assert "haystack text not found" in capsys.readouterr().err


def _make_variable(text: str, name: str) -> str:
    """A `NAME ?= ...` variable of the Makefile, continuation lines joined."""
    match = re.search(rf"^{name} \?= ((?:.*\\\n)*.*)$", text, re.M)
    return match.group(1).replace("\\\n", " ")


def test_make_bench_runs_the_issue_grid():
    """`make bench`'s arguments give the grid issue 8 asks for: at 2k both RoPE modes x three
    scorers x FM/IMDC plus the peers, 12+ cases each; at 8k the default scorer, 6+ cases."""
    from memstep.cli import build_parser
    from memstep.cli.common import fractions as _floats, ints as _ints, names as _names
    from memstep.evaluation.grid import make_grid
    from memstep.evaluation.suite import DEFAULT_HAYSTACKS

    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    common = _make_variable(makefile, "BENCH_COMMON")
    found = {}
    for part in ("BENCH_2K", "BENCH_8K"):
        args = build_parser().parse_args(["eval", *common.split(), *_make_variable(makefile, part).split()])
        configs = make_grid(_names(args.schedules), _names(args.scorers), _ints(args.budgets), args.chunk,
                            _names(args.peers), _names(args.presses), _names(args.ropes))
        haystacks = len(_names(args.haystacks)) if args.haystacks else len(DEFAULT_HAYSTACKS)
        cases = haystacks * len(_floats(args.depths)) * len(_ints(args.seeds))
        found[part] = (_ints(args.lengths), [c.label for c in configs], cases, haystacks)
    lengths, labels, cases, haystacks = found["BENCH_2K"]
    peers = ["kvpress snapkv M=512", "kvpress streaming-llm M=512", "hf full cache"]
    assert lengths == [2048] and cases >= 12 and haystacks >= 2
    assert sorted(labels) == sorted([f"{s} {scorer} M=512 {rope}" for s in ("fm", "imdc")
                                     for scorer in ("chunk-attention", "conv", "snapkv")
                                     for rope in ("compact", "document")] + ["memstep full"] + peers)
    lengths, labels, cases, haystacks = found["BENCH_8K"]
    assert lengths == [8192] and cases >= 6 and haystacks >= 2
    assert sorted(labels) == sorted([f"{s} chunk-attention M=512 {rope}" for s in ("fm", "imdc")
                                     for rope in ("compact", "document")] + ["memstep full"] + peers)


def test_make_bench_runs_question_aware_beside_agnostic():
    """Issue 13's grid: question-aware FM and IMDC (chunk-attention, compact) and kvpress with the
    question in the context, at 2k (12+ cases) and 8k, next to the agnostic runs of the same lengths."""
    from memstep.cli import build_parser
    from memstep.cli.common import ints as _ints, names as _names
    from memstep.cli.eval import QUESTION_AWARE
    from memstep.evaluation.grid import make_grid

    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    common, qa = _make_variable(makefile, "BENCH_COMMON"), _make_variable(makefile, "BENCH_QA")
    assert "$(BENCH_2K) $(BENCH_QA)" in makefile and "$(BENCH_8K) $(BENCH_QA)" in makefile
    args = build_parser().parse_args(["eval", *common.split(), *_make_variable(makefile, "BENCH_2K").split(),
                                      *qa.split()])
    configs = make_grid(_names(args.schedules), _names(args.scorers), _ints(args.budgets), args.chunk,
                        _names(args.peers), _names(args.presses), _names(args.ropes),
                        QUESTION_AWARE[args.question_aware])
    assert sorted(c.label for c in configs if c.question_aware) == sorted([
        "fm chunk-attention M=512 compact question-aware", "imdc chunk-attention M=512 compact question-aware",
        "kvpress snapkv M=512 question-aware", "kvpress streaming-llm M=512 question-aware"])
    assert len(_ints(args.seeds)) * len(_names(args.depths)) * 2 >= 12
