"""The evaluation's splits: the test split is drawn deterministically, shares no haystack, needle
template, subject or answer with the dev cases, is checked against its committed hash, and fixes
its cases at the command line."""

from __future__ import annotations

import json
import re

import pytest

from memstep.errors import MemstepError
from memstep.evaluation import needles, splits
from memstep.evaluation.niah import NEEDLE, QUESTION
from memstep.evaluation.suite import DEFAULT_HAYSTACKS
from memstep.passkey import THINGS

try:
    from fixtures_documents import tokenizer  # noqa: F401 (a pytest fixture)
    from test_cli import assert_one_line_error, cli
except ImportError:  # tests/ imported as a package
    from tests.fixtures_documents import tokenizer  # noqa: F401
    from tests.test_cli import assert_one_line_error, cli


def test_the_draw_is_deterministic_and_is_the_committed_list():
    drawn = splits.list_text(splits.draw_test_split())
    assert drawn == splits.list_text(splits.draw_test_split())
    assert drawn == splits.TEST_LIST.read_text(encoding="utf-8")
    assert splits.digest(drawn) == splits.TEST_SHA256
    # another seed draws other cases: the list follows from the seed, not from a file edited by hand
    assert splits.list_text(splits.draw_test_split(seed="another")) != drawn


def test_the_split_has_its_counts_balanced_and_depths_spread():
    cases = splits.load_test_split()
    for length, count in splits.TEST_DRAWS.items():
        at = [c for c in cases if c["length"] == length]
        assert len(at) == count
        pairs = {(c["haystack"], c["kind"]) for c in at}
        assert len(pairs) == len(splits.TEST_TEXTS) * len(splits.TEMPLATES)  # every text with every template
        assert min(c["depth"] for c in at) >= 0.05 and max(c["depth"] for c in at) <= 0.95
        assert min(c["depth"] for c in at) < 0.15 and max(c["depth"] for c in at) > 0.85
    assert len(splits.TEMPLATES) >= 8
    assert {len(t.questions) for t in splits.TEMPLATES} >= {2}  # varied wording
    # the needle says what the case's fields say
    for case in cases[:40]:
        assert case["answer"] in case["sentence"] and case["subject"] in case["sentence"]
        assert case["subject"] in case["question"] and case["answer"] not in case["question"]


def test_test_haystacks_and_templates_are_disjoint_from_dev():
    assert not {p.name for p in DEFAULT_HAYSTACKS} & set(splits.TEST_TEXTS)
    assert not set(splits.KINDS) & set(needles.KINDS)
    assert all(k.startswith(splits.TEST_PREFIX) for k in splits.KINDS)
    assert not any(k.startswith(splits.TEST_PREFIX) for k in needles.KINDS)
    dev_words = {w.lower() for w in (*needles.WORDS, *needles.NAMES, *THINGS)}
    dev_words |= {"magic", "password", "keeper", "code", "sandwich", "dolores", "francisco"}
    for template in splits.TEMPLATES:
        text = " ".join([template.sentence, *template.questions, *template.subjects,
                         *(map(str, template.answers))]).lower()
        words = set(re.findall(r"[a-z]+", text))
        assert not words & dev_words, (template.kind, words & dev_words)
    dev_sentences = [needles.make_needle(kind, f"label-{i}").sentence for kind in needles.KINDS for i in range(20)]
    shapes = {re.sub(r"\b(\d+|[A-Z][a-z]+)\b", "_", s) for s in dev_sentences + [NEEDLE.strip(), QUESTION]}
    for case in splits.load_test_split():
        assert re.sub(r"\b(\d+|[A-Z][a-z]+)\b", "_", case["sentence"]) not in shapes
    # the texts differ too, not only their names: no paragraph of a dev text is in a test text
    tests = " ".join(splits.read_test_texts().values())
    for path in DEFAULT_HAYSTACKS:
        paragraphs = [p for p in path.read_text(encoding="utf-8").split("\n\n") if len(p) > 200][:50]
        assert not any(p in tests for p in paragraphs)


def test_an_edited_list_is_refused(tmp_path):
    text = splits.TEST_LIST.read_text(encoding="utf-8")
    assert len(splits.load_test_split()) == sum(splits.TEST_DRAWS.values())
    edited = tmp_path / "cases.json"
    edited.write_text(text.replace('"depth": 0.', '"depth": 0.1', 1), encoding="utf-8")
    with pytest.raises(MemstepError, match="does not match its committed hash"):
        splits.load_test_split(edited)
    with pytest.raises(MemstepError, match="is missing"):
        splits.load_test_split(tmp_path / "gone.json")


def test_the_cli_refuses_an_edited_list_and_case_flags_before_any_work(capsys, tmp_path, monkeypatch):
    out = tmp_path / "out"
    for flag, value in (("--depths", "0.5"), ("--needles", "passkey"), ("--seeds", "1"),
                        ("--haystacks", str(DEFAULT_HAYSTACKS[0])), ("--benchmark", "niah")):
        assert_one_line_error(*cli(capsys, "eval", "--split", "test", flag, value, "--output", out)[::2],
                              "--split test", flag)
    edited = tmp_path / "cases.json"
    edited.write_text(splits.TEST_LIST.read_text(encoding="utf-8").replace("ochre", "umber", 1), encoding="utf-8")
    monkeypatch.setattr(splits, "TEST_LIST", edited)
    assert_one_line_error(*cli(capsys, "eval", "--split", "test", "--output", out)[::2], "committed hash")
    assert not out.exists()


def test_a_dev_run_never_reads_a_test_text(capsys, tmp_path):
    text = splits.TEST_FOLDER / splits.TEST_TEXTS[0]
    assert_one_line_error(*cli(capsys, "eval", "--haystacks", text, "--output", tmp_path / "out")[::2],
                          "test split")


def test_test_cases_build_documents_with_the_needle_at_its_depth(tokenizer):
    cases = splits.test_cases(tokenizer, [2048], continuation_tokens=8)
    assert len(cases) == splits.TEST_DRAWS[2048]
    specs = [s for s in splits.load_test_split() if s["length"] == 2048]
    for case, spec in list(zip(cases, specs))[::40]:
        assert case.kind == spec["kind"] and case.question == spec["question"] and case.passkey == spec["answer"]
        assert 1900 <= len(case.document_ids) <= 2048
        answer = tokenizer.decode(case.document_ids[slice(*case.passkey_tokens)])
        assert spec["answer"] in answer
        assert abs(case.needle_tokens[0] / len(case.document_ids) - spec["depth"]) < 0.05
        assert case.cell["kind"] == spec["kind"] and case.cell["seed"] == spec["seed"]
    with pytest.raises(MemstepError, match="not 8192"):
        splits.test_cases(tokenizer, [8192])


def test_only_answered_keeps_the_cases_the_full_cache_answered():
    from memstep.cli.eval import answered_cases
    from memstep.evaluation.suite import Case

    def case(seed):
        return Case(2048, 0.5, seed, "a.txt", 0, "x", "q", [], [], [], [], (0, 1), (0, 1), kind="t-door")

    cells = [{"label": "memstep full", "haystack": "a.txt", "length": 2048, "depth": 0.5, "seed": s,
              "kind": "t-door", "correct": s % 2 == 0} for s in range(4)]
    assert [c.seed for c in answered_cases([case(s) for s in range(5)], cells)] == [0, 2]
    with pytest.raises(MemstepError, match="run --schedules full"):
        answered_cases([case(0)], [])


def test_summary_records_the_split_in_json_form():
    # the committed list is plain JSON, one case a line
    lines = splits.TEST_LIST.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[" and lines[-1] == "]"
    assert json.loads(lines[1].rstrip(","))["seed"] == 0
