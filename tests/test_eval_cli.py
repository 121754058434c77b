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
def test_eval_two_cells_then_resume(tmp_path, capsys, monkeypatch):
    """The whole command on the embedded model, end to end: the full cache as the reference and one
    compressed configuration, each in its worker, on both haystacks; then a resume that runs nothing.
    (RoPE modes reaching the runs and the paired contrasts between configurations are checked
    without a model in test_eval.py, the positions' effect in the engine's tests: each worker here
    costs seconds of imports.)"""
    readme = tmp_path / "README.md"
    readme.write_text(f"## Evaluation\n{START}\n{END}\n")
    out = tmp_path / "results"
    argv = ["eval", "--lengths", "160", "--depths", "0.5", "--schedules", "full,fm", "--scorers", "recency",
            "--budgets", "32", "--chunk", "64", "--ropes", "compact", "--max-new-tokens", "16",
            "--continuation-tokens", "8", "--needles", "passkey", "--output", str(out), "--readme", str(readme),
            "--quiet", "--threads", "1"]  # one thread: xdist runs two workers on two cores
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "4 cells run, 0 already done" in first and "Paired differences" in first
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    labels = ["fm recency M=32 compact", "memstep full"]
    assert sorted(c["label"] for c in cells) == sorted(labels * 2)
    assert {c["haystack"] for c in cells} == {"pride_and_prejudice_ch1-12.txt", "persuasion_excerpt.txt"}
    full = [c for c in cells if c["label"] == "memstep full"]
    assert any(c["correct"] for c in full), [c["answer"] for c in full]  # the full cache answers a tiny haystack
    assert all(c["retention"] == [1.0] * 30 and c["memory_entries"] > 100 for c in full)
    compact = [c for c in cells if c["config"].get("rope") == "compact"]
    assert len(compact) == 2 and all(c["memory_entries"] == 36 for c in compact)  # budget 32 + 4 sinks
    # KL and top-1 agreement against the full cache: nothing for the full cache itself, something for M=32
    assert all(c["kl"] == 0.0 and c["top1"] == 1.0 for c in full)
    assert all(c["kl"] > 0 for c in compact)
    assert len(list((out / "logits").glob("*.npy"))) == 2
    for cell in cells:
        assert cell["peak_rss_bytes"] >= cell["baseline_rss_bytes"] > 100 * 2**20
        assert cell["seconds"] >= cell["prefill_seconds"] > 0 and cell["continuation_nll"] > 0
    summary = load_summary(out)
    assert [r["label"] for r in summary["rows"]] == labels
    assert summary["run"]["haystacks"] == ["persuasion_excerpt.txt", "pride_and_prejudice_ch1-12.txt"]
    rows = {r["label"]: r for r in summary["rows"]}
    assert rows["memstep full"]["nll_gap"] == 0.0 and rows["fm recency M=32 compact"]["nll_gap_cases"] == 2
    for name in ("intervals", "heatmaps", "tradeoff"):
        assert (out / f"{name}.html").stat().st_size > 1000
        if Path("/usr/bin/chromium").exists():  # PNGs need kaleido's Chromium (make chromium)
            assert (out / f"{name}.png").stat().st_size > 1000
    full_row = rows["memstep full"]
    assert f"| 160 | memstep full | {full_row['correct']}/2 (" in readme.read_text()
    assert "intervals.png" in readme.read_text()

    from memstep.evaluation import plots

    drawn = []
    monkeypatch.setattr(plots, "write_plots", lambda summary, folder: drawn.append(folder) or ([], []))
    assert main(argv + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["run"]["ran"] == 0 and again["run"]["skipped"] == 4
    assert len((out / "cells.jsonl").read_text().splitlines()) == 4
    assert drawn == []  # nothing new: the plots drawn from these results stand
    (out / "tradeoff.png").unlink()
    assert main(argv + ["--json"]) == 0 and len(drawn) == 1  # one is missing: drawn again


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


def _grid(makefile: str, *parts: str):
    """The configurations and case count one `make bench-eval` line asks for."""
    from memstep.cli import build_parser
    from memstep.cli.common import fractions as _floats, ints as _ints, names as _names
    from memstep.cli.eval import QUESTION_AWARE, floats
    from memstep.evaluation.grid import make_grid
    from memstep.evaluation.suite import DEFAULT_HAYSTACKS

    words = [w for part in ("EVAL_COMMON", *parts) for w in _make_variable(makefile, part).split()]
    args = build_parser().parse_args(["eval", *words])
    configs = make_grid(_names(args.schedules), _names(args.scorers), _ints(args.budgets), args.chunk,
                        _names(args.peers), _names(args.presses), _names(args.ropes),
                        QUESTION_AWARE[args.question_aware], ("memstep",),
                        _names(args.question_pools) if args.question_pools else (None,),
                        floats(args.question_weights) if args.question_weights else (None,))
    haystacks = len(_names(args.haystacks)) if args.haystacks else len(DEFAULT_HAYSTACKS)
    cases = haystacks * len(_names(args.needles)) * len(_floats(args.depths)) * len(_ints(args.seeds))
    return _ints(args.lengths or "2048"), sorted(c.label for c in configs), cases, args


def test_make_bench_eval_runs_the_headline_and_ablations():
    """The headline rows (memstep FM/IMDC aware and agnostic, SnapKV/ChunkKV/Finch with the question,
    KeyDiff, the full cache) at 2k (and 4k, 8k in bench-long); the ablations at 2k; needle kinds; KL on."""
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    aware = "fm chunk-attention M=512 compact question-aware"
    lengths, labels, cases, args = _grid(makefile, "EVAL_HEAD", "EVAL_MEMSTEP")
    assert labels == sorted(["memstep full", aware, "fm chunk-attention M=512 compact"]) and cases == 24
    assert set(args.needles.split(",")) == {"passkey", "code", "word", "name"} and "kl" in args.metrics
    assert _grid(makefile, "EVAL_HEAD", "EVAL_IMDC")[1] == sorted(
        ["memstep full", "imdc chunk-attention M=512 compact", "imdc chunk-attention M=512 compact question-aware"])
    assert _grid(makefile, "EVAL_HEAD", "EVAL_PEERS")[1] == sorted(
        ["memstep full", "kvpress snapkv M=512 question-aware", "kvpress chunkkv M=512 question-aware",
         "kvpress finch M=512 question-aware", "kvpress keydiff M=512"])
    # the ablations beside the engine's defaults (the FM question-aware row above), in the same results folder
    lengths, labels, cases, _ = _grid(makefile, "EVAL_ABLATE", "EVAL_POOLS")
    assert lengths == [2048] and cases == 16
    assert labels == sorted(["memstep full"] + [f"{aware} pool={p}" for p in ("mean:5", "none")])
    assert _grid(makefile, "EVAL_ABLATE", "EVAL_WEIGHTS")[1] == sorted(
        ["memstep full"] + [f"{aware} weight={w}" for w in ("0.25", "0.5", "1")])
    assert _grid(makefile, "EVAL_ABLATE", "EVAL_ONCE")[1] == sorted(
        ["memstep full", "once chunk-attention M=512 compact", "once chunk-attention M=512 compact question-aware"])
    assert "--lengths 2048 $(EVAL_MEMSTEP)" in makefile
    # bench-long: the headline rows (FM question-aware, SnapKV and ChunkKV with the question) at 4k and 8k,
    # and more 2k cases, on the needle kinds the full cache answers; bench-gemma3 into its own folder
    for length in (2048, 4096, 8192):
        assert f"--lengths {length} " in makefile.split("bench-long:")[1].split("bench-gemma3:")[0]
    assert "$(EVAL_MORE) $(EVAL_HEAD_PEERS)" in makefile and "--presses snapkv,chunkkv,finch " in makefile
    assert "--model gemma3-270m" in makefile and "--lengths 16384" in makefile
    assert "bench: bench-eval" in makefile and "--output $(RESULTS)" in makefile
