"""Span-preserving selection (memstep.spans): span scores against hand-computed tables, whole
spans kept where a token top-k splits them, the budget and sinks as in the token cut, the
engine running with spans at every step, and bad settings refused before any model loads."""

from __future__ import annotations

import pytest
import torch

from memstep.errors import MemstepError
from memstep.scorers import select_kept
from memstep.spans import (SpanSetting, check_span_budget, kept_whole, parse_span, select_spans, span_scores,
                           span_table)


def test_parse_names_and_defaults():
    assert parse_span(None) is None and parse_span("none") is None
    assert parse_span("fixed20") == SpanSetting("fixed", 20, "max", "head")
    assert parse_span("fixed20-mean-layer") == SpanSetting("fixed", 20, "mean", "layer")
    assert parse_span("sentence") == SpanSetting("sentence", 48, "max", "head")
    assert parse_span("clause16-layer") == SpanSetting("clause", 16, "max", "layer")
    assert parse_span("sentence-mean").name == "sentence48-mean-head"


@pytest.mark.parametrize("text,words", [("chunks", ["unknown span setting 'chunks'"]),
                                        ("fixed", ["needs its length"]),
                                        ("fixed0", ["1 to 512"]),
                                        ("fixed20-min", ["unknown span setting"])])
def test_parse_refuses(text, words):
    with pytest.raises(MemstepError) as error:
        parse_span(text)
    for word in words:
        assert word in str(error.value)


def test_span_longer_than_budget_is_refused_and_says_so():
    check_span_budget(parse_span("fixed32"), 32)
    with pytest.raises(MemstepError, match="refused"):
        check_span_budget(parse_span("fixed33"), 32)


def test_span_scores_hand_computed():
    scores = torch.tensor([[1.0, 3.0, 2.0, 5.0, 4.0, 0.5],
                           [2.0, 0.0, 1.0, 1.0, 4.0, 6.0]])
    spans = torch.tensor([[0, 0, 1, 1, 1, 2]] * 2)
    assert span_scores(scores, spans, "max").tolist() == [[3, 3, 5, 5, 5, 0.5], [2, 2, 4, 4, 4, 6]]
    mean = span_scores(scores, spans, "mean")
    assert torch.allclose(mean, torch.tensor([[2, 2, 11 / 3, 11 / 3, 11 / 3, 0.5], [1, 1, 2, 2, 2, 6]]))
    assert span_scores(scores, spans, "mean", per_span=True).shape == (2, 3)


def test_tables_fixed_and_sentence():
    fixed = span_table(SpanSetting("fixed", 3), [""] * 10, sinks=2)
    assert fixed.tolist() == [-1, -1, 0, 0, 0, 1, 1, 1, 2, 2]
    texts = ["<s>", "A", " cat", ".", " It", " sat", ",", " then", " ran", "!", "\n", " End", " of", " it"]
    assert span_table(SpanSetting("sentence", 48), texts, sinks=1).tolist() == \
        [-1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 3, 3, 3]
    assert span_table(SpanSetting("clause", 48), texts, sinks=1).tolist() == \
        [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 4, 4, 4]
    # a sentence past its cap is split into pieces of at most the cap
    assert span_table(SpanSetting("sentence", 2), texts, sinks=1).tolist() == \
        [-1, 0, 0, 1, 2, 2, 3, 3, 4, 4, 5, 6, 6, 7]


def needle_case():
    """20 entries, 2 sinks; the needle is the fixed-5 span at positions 10..14 whose middle
    token scores low (the answer's second word piece); strong lone tokens elsewhere."""
    scores = torch.full((1, 20), 0.01)
    scores[0, 10:15] = torch.tensor([0.9, 0.8, 0.05, 0.85, 0.7])
    scores[0, [3, 7, 17]] = torch.tensor([0.6, 0.65, 0.5])
    positions = torch.arange(20)[None]
    table = span_table(SpanSetting("fixed", 5), [""] * 20, sinks=0)  # spans 0-4, 5-9, 10-14, 15-19
    return scores, positions, table


def test_span_selection_keeps_the_needle_whole_where_token_topk_splits_it():
    scores, positions, table = needle_case()
    keep = 2 + 5  # the sinks and one span
    tokens = select_kept(scores, positions, keep, sinks=2)[0].tolist()
    assert 12 not in tokens and {10, 11, 13}.issubset(tokens)  # the token cut splits the needle
    for pool in ("max", "mean"):
        kept = select_spans(scores, positions, keep, 2, table, SpanSetting("fixed", 5, pool))[0].tolist()
        assert kept == [0, 1, 10, 11, 12, 13, 14], pool


def test_budget_edge_splits_one_span_by_its_best_tokens():
    scores, positions, table = needle_case()
    kept = select_spans(scores, positions, 2 + 5 + 2, 2, table, SpanSetting("fixed", 5, "max"))[0].tolist()
    # the needle whole, then the next span by max (5-9: 0.65, ahead of 2-4's 0.6 and 15-19's 0.5):
    # its best two tokens, 7 (0.65), then the first of the tied 0.01s
    assert kept == [0, 1, 5, 7, 10, 11, 12, 13, 14]


def test_mean_and_max_rank_differently():
    # span A: one spike (max 1.0, mean 0.2); span B: even (max 0.5, mean 0.5)
    scores = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5]])
    positions = torch.arange(10)[None]
    table = span_table(SpanSetting("fixed", 5), [""] * 10, sinks=0)
    assert select_spans(scores, positions, 5, 0, table, SpanSetting("fixed", 5, "max"))[0].tolist() == [0, 1, 2, 3, 4]
    assert select_spans(scores, positions, 5, 0, table, SpanSetting("fixed", 5, "mean"))[0].tolist() == [5, 6, 7, 8, 9]


def test_layer_share_gives_every_head_the_same_spans_and_head_share_does_not():
    scores = torch.tensor([[0.9, 0.9, 0.0, 0.0, 0.1, 0.1], [0.0, 0.0, 0.3, 0.3, 0.2, 0.2]])
    positions = torch.arange(6).expand(2, -1)
    table = span_table(SpanSetting("fixed", 2), [""] * 6, sinks=0)
    per_head = select_spans(scores, positions, 2, 0, table, SpanSetting("fixed", 2, "max", "head"))
    assert per_head.tolist() == [[0, 1], [2, 3]]
    shared = select_spans(scores, positions, 2, 0, table, SpanSetting("fixed", 2, "max", "layer"))
    assert shared.tolist() == [[0, 1], [0, 1]]  # mean over heads: 0.45 vs 0.15 vs 0.15


def test_any_share_keeps_for_every_head_what_one_head_wants_most():
    """-any: one ranking for the layer, each entry as strong as its strongest head. Spans of one
    token: the heads' maxima are 0.9, 0.0, 0.5, 0.4, 0.8 (keep 0 and 4: each wanted by one head);
    their mean, 0.45, 0.0, 0.5, 0.4, 0.4 (layer: keep 0 and 2)."""
    assert parse_span("fixed1-max-any") == SpanSetting("fixed", 1, "max", "any")
    scores = torch.tensor([[0.9, 0.0, 0.5, 0.4, 0.0], [0.0, 0.0, 0.5, 0.4, 0.8]])
    positions = torch.arange(5).expand(2, -1)
    table = span_table(SpanSetting("fixed", 1), [""] * 5, sinks=0)
    shared = select_spans(scores, positions, 2, 0, table, SpanSetting("fixed", 1, "max", "any"))
    assert shared.tolist() == [[0, 4], [0, 4]]
    mean = select_spans(scores, positions, 2, 0, table, SpanSetting("fixed", 1, "max", "layer"))
    assert mean.tolist() == [[0, 2], [0, 2]]


def test_sinks_and_frozen_entries_stay_and_the_budget_is_exact():
    torch.manual_seed(0)
    scores = torch.rand(3, 40)
    positions = torch.arange(40).expand(3, -1)
    table = span_table(SpanSetting("fixed", 7), [""] * 40, sinks=4)
    for keep in (6, 7, 11, 18, 25, 40):
        kept = select_spans(scores, positions, keep, 4, table, SpanSetting("fixed", 7), frozen=6)
        assert kept.shape == (3, keep)
        assert all(set(range(6)).issubset(row) for row in kept.tolist())
        assert (kept.diff(dim=1) > 0).all()  # cache order, no repeats


def test_kept_whole_counts():
    table = span_table(SpanSetting("fixed", 2), [""] * 8, sinks=2)  # spans: 2-3, 4-5, 6-7
    kept = torch.tensor([[[0, 1, 2, 3, 4, -1], [0, 1, 4, 5, 6, 7]]]).numpy()
    assert kept_whole(kept, table, sinks=2) == {"whole": [[1, 2]], "partial": [[1, 0]]}


def test_engine_keeps_whole_spans_at_every_step():
    from conftest import make_tiny_model

    from memstep.engine import ChunkedPrefill
    from memstep.schedules import make_schedule
    from memstep.scorers import make_scorer

    model = make_tiny_model(layers=2, seed=3)
    setting = SpanSetting("fixed", 8, "max", "head")
    engine = ChunkedPrefill(model, make_scorer("chunk-attention"), sinks=4, span=setting)
    ids = torch.randint(0, 128, (200,))
    schedule = make_schedule("fm", 200, 48, 64)
    table = span_table(setting, [""] * 200, sinks=4)
    for record in engine.run(ids, schedule):
        for layer in record.kept_positions:
            for head in layer:
                held = head[head >= 4]
                spans, counts = torch.unique(table[torch.as_tensor(held)], return_counts=True)
                partial = [int(s) for s, c in zip(spans, counts) if c < int((table == s).sum())]
                # at most the one span at the budget's edge and the span the chunk's end cuts are partial
                assert len(partial) <= 3, (record.step, partial)
        assert record.memory_after == 68 or record.step == 0


@pytest.mark.parametrize("argv,words", [
    (["--span", "chunks"], ["unknown span setting 'chunks'"]),
    (["--span", "fixed300", "--schedule", "fm", "--memory", "256"], ["fixed300", "M = 256", "refused"]),
])
def test_cli_refuses_bad_spans_before_loading(capsys, monkeypatch, tmp_path, argv, words):
    import memstep.models
    from memstep.cli import main

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(memstep.models, "load_model", no_load)
    doc = tmp_path / "doc.txt"
    doc.write_text("Some prose. More prose.")
    code = main(["run", str(doc), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("memstep: error:")
    for word in words:
        assert word in err[0], (word, err[0])
