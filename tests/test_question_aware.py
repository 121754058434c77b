"""Question-aware compression: the question's tokens ride after every chunk, their attention
joins the score, and their own cache entries never stay in the memory."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import make_tiny_model

from memstep.engine import ChunkedPrefill, model_shape, question_mix
from memstep.errors import MemstepError
from memstep.question_pool import TUNED_POOL
from memstep.schedules import make_schedule
from memstep.scorers import make_scorer

QUESTION = [7, 9, 11, 13, 17]


def ids(tokens, seed=0):
    return torch.randint(20, 128, (tokens,), generator=torch.Generator().manual_seed(seed))


def run(model, tokens, schedule, question=None, scorer="chunk-attention", **kwargs):
    engine = ChunkedPrefill(model, make_scorer(scorer), sinks=4, question_ids=question, **kwargs)
    return engine, list(engine.run(tokens, schedule))


SCHEDULES = [("full", "linear"), ("fm", "linear"), ("im", "sqrt"), ("imdc", "linear"), ("imdc", "square-sqrt")]


@pytest.mark.parametrize("rope", ["compact", "document", "shared"])
@pytest.mark.parametrize("name,growth", SCHEDULES, ids=[f"{n}-{g}" for n, g in SCHEDULES])
def test_the_questions_entries_never_stay_in_memory(tiny_model, name, growth, rope):
    tokens = ids(230)
    schedule = make_schedule(name, 230, 64, 40, growth, layers=2)
    agnostic, plain = run(tiny_model, tokens, schedule, rope=rope)
    engine, aware = run(tiny_model, tokens, schedule, QUESTION, rope=rope)
    shape = model_shape(tiny_model)
    for a, b in zip(plain, aware):
        assert a.layer_entries == b.layer_entries  # the same cache lengths, step by step
        assert b.kept_positions.max() < b.tokens_seen  # document positions only
        # the question's tokens are read (and counted) with every evicting step, then dropped
        assert b.question_tokens == (len(QUESTION) if name != "full" else 0)
        parts = b.bytes_modeled_parts
        assert b.kv_bytes_actual == parts["kv_memory"] + parts["kv_chunk"]  # the question's entries included
    assert [layer.keys.shape[2] for layer in engine.cache.layers] == plain[-1].layer_entries
    assert engine.cache_bytes() == agnostic.cache_bytes()
    assert engine.tokens_seen == 230
    if rope == "shared":  # right after the tokens the memory holds anywhere: they differ with the question
        assert engine.position == len({p for layer in engine.positions for p in layer.flatten().tolist()})
    else:
        assert engine.position == agnostic.position
    if name != "full":
        assert any(b.bytes_modeled > a.bytes_modeled for a, b in zip(plain, aware))
        assert all(b.kv_bytes_actual == a.kv_bytes_actual + len(QUESTION) * shape.kv_bytes_per_entry
                   for a, b in zip(plain, aware))  # the running layer holds the question's entries too


@pytest.mark.parametrize("rope", ["compact", "document", "shared"])
def test_the_chunks_hidden_states_do_not_see_the_question(tiny_model, rope):
    """Causal attention: the question after the chunk changes what is kept, never the chunk's
    own states in a step where both memories are the same (the first)."""
    tokens = ids(200, seed=1)
    schedule = make_schedule("fm", 200, 64, 40)
    plain_engine, _ = run(tiny_model, tokens, schedule, rope=rope, collect_hidden=True)
    aware_engine, _ = run(tiny_model, tokens, schedule, QUESTION, rope=rope, collect_hidden=True)
    torch.testing.assert_close(aware_engine.hidden_chunks[0], plain_engine.hidden_chunks[0], rtol=1e-5, atol=1e-5)


def needle_model(token: int):
    """A one-layer Llama where ``token`` is the needle: the question rows of that token attend
    (nearly) only to keys of that token, and every other row (nearly) ignores them.

    Token ``token``'s embedding lives on hidden dims 7 and 15 alone; every other token has 1 on
    dims 6 and 14 and nothing on 7 and 15. q_proj and k_proj copy dims 6, 7, 14, 15 into the
    same dims of every head (x3) and read nothing else there, so in each head: needle query .
    needle key is large, other query . other key gets a large common bonus, and the two kinds
    see each other at logit 0. Dims 6-7 and 14-15 are the lowest RoPE frequencies of a 16-dim
    head: over a few hundred positions the rotation barely moves them."""
    model = make_tiny_model("llama", layers=1, seed=3)
    dims = [6, 7, 14, 15]
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, dims] = 0
        emb[:, [6, 14]] = 1.0
        emb[token] = 0
        emb[token, [7, 15]] = 1.0
        attn = model.model.layers[0].self_attn
        for proj, heads in ((attn.q_proj, 4), (attn.k_proj, 2)):
            proj.weight[:, dims] = 0
            for head in range(heads):
                for dim in dims:
                    proj.weight[head * 16 + dim] = 0
                    proj.weight[head * 16 + dim, dim] = 3.0
    return model


@pytest.mark.parametrize("rope", ["compact", "document"])
def test_a_token_the_question_looks_at_is_kept_only_with_the_option(rope):
    needle, target = 5, 60  # token 5 sits once in the document, at position 60
    model = needle_model(needle)
    tokens = ids(300, seed=2)
    tokens[target] = needle
    schedule = make_schedule("fm", 300, 64, 24)
    _, plain = run(model, tokens, schedule, rope=rope)
    _, aware = run(model, tokens, schedule, [needle, 9, needle], rope=rope)
    kept_plain, kept_aware = plain[-1].kept_positions, aware[-1].kept_positions
    assert not np.isin(target, kept_plain)  # the agnostic score drops it
    assert (kept_aware == target).any(axis=-1).all()  # every KV head keeps it, through every step
    assert all((r.kept_positions == target).any(axis=-1).all() for r in aware if r.tokens_seen > target)


def test_question_mix_shares_and_pooling():
    positions = torch.arange(20)[None]
    base = torch.ones(1, 20)
    question = torch.zeros(1, 20)
    question[0, 10] = 1.0
    question[0, 1] = 50.0  # a sink: kept anyway, so it takes no share
    mixed = question_mix(base, question, positions, sinks=4, weight=0.75, pool="max:15")
    # base: 16 non-sink keys, 1/16 each; question: max-pooled over 15 keys, so keys 4..17 all take key 10's 1.0
    # (then divided by their 14): 0.25/16 + 0.75/14 inside the pool, 0.25/16 outside, 0 for the sinks
    assert torch.allclose(mixed[0, 4:18], torch.full((14,), 0.25 / 16 + 0.75 / 14))
    assert torch.allclose(mixed[0, 18:], torch.full((2,), 0.25 / 16))
    assert (mixed[0, :4] == 0).all()


def test_question_pool_mean_and_none_by_hand():
    positions = torch.arange(20)[None]
    base = torch.ones(1, 20)
    question = torch.zeros(1, 20)
    question[0, 10] = 1.0
    # no pooling: key 10 takes the whole question share
    none = question_mix(base, question, positions, sinks=4, weight=0.75, pool="none")
    assert torch.isclose(none[0, 10], torch.tensor(0.25 / 16 + 0.75))
    assert torch.allclose(none[0, 11:], torch.full((9,), 0.25 / 16))
    # mean over 5 (padding not counted): keys 8..12 each average 1/5, so each holds a fifth of the share
    mean = question_mix(base, question, positions, sinks=4, weight=0.75, pool="mean:5")
    assert torch.allclose(mean[0, 8:13], torch.full((5,), 0.25 / 16 + 0.75 / 5))
    assert torch.allclose(mean[0, 13:], torch.full((7,), 0.25 / 16))
    for bad in ("max:4", "mean", "median:5", "max:0", "none:3", "max:999", "follow", "follow:0", "follow:256"):
        with pytest.raises(MemstepError, match="question pool"):
            question_mix(base, question, positions, sinks=4, weight=0.75, pool=bad)


def test_question_pool_follow_by_hand():
    """follow:N: each key takes the strongest question attention of itself and the N - 1 keys
    before it, so the words after the one the question looks at ("San Francisco is ...") go with it."""
    positions = torch.arange(20)[None]
    base = torch.ones(1, 20)
    question = torch.zeros(1, 20)
    question[0, 8] = 1.0
    question[0, 14] = 0.5
    question[0, 2] = 50.0  # a sink: taken out before pooling, so it spills onto nothing
    mixed = question_mix(base, question, positions, sinks=4, weight=0.75, pool="follow:4")
    # keys 8..11 take 1.0 (key 8's), 12..13 none (8 is four back), 14..17 take 0.5: the pooled
    # question sums to 4 x 1.0 + 4 x 0.5 = 6 over the 16 non-sink keys
    expected = torch.full((20,), 0.25 / 16)
    expected[8:12] += 0.75 * 1.0 / 6
    expected[14:18] += 0.75 * 0.5 / 6
    expected[:4] = 0
    assert torch.allclose(mixed[0], expected)
    # keys before the looked-at key take nothing from it (max:N would spread both ways)
    assert torch.allclose(mixed[0, 4:8], torch.full((4,), 0.25 / 16))
    # follow:15 (the tuned recipe's): key 8's attention goes to keys 8..19 (12 of the 16)
    default = question_mix(base, question[:, :] * (torch.arange(20) == 8), positions, sinks=4, weight=0.75,
                           pool="follow:15")
    assert (default[0, 8:20] > 0.25 / 16).sum() == 12 and torch.allclose(default[0, 4:8], torch.full((4,), 0.25 / 16))
    # width 1 is no pooling
    one = question_mix(base, question, positions, sinks=4, weight=0.75, pool="follow:1")
    assert torch.allclose(one, question_mix(base, question, positions, sinks=4, weight=0.75, pool="none"))


def test_carry_keeps_the_strongest_share_an_entry_had():
    """+carry: the memory's entries (leading, in the memory's order) take the larger of this step's
    question share and the one they carried; the chunk's entries take this step's."""
    from memstep.engine import carry_share
    from memstep.question_pool import carry_kind, parse_question_pool

    share = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]])
    carried = torch.tensor([[0.5, 0.0, 0.1]])
    assert torch.allclose(carry_share(share, carried), torch.tensor([[0.5, 0.2, 0.3, 0.2, 0.2]]))
    assert carry_share(share, None) is share
    assert parse_question_pool("follow:15+carry") == ("follow", 15) and carry_kind("follow:15+carry") == "carry"
    assert carry_kind("follow:15") is None
    for bad in ("follow:15+car", "+carry", "carry"):
        with pytest.raises(MemstepError, match="optionally followed by \\+carry"):
            parse_question_pool(bad)


def test_carried_shares_follow_the_memory_step_by_step(tiny_model):
    """The engine's carried shares line up with each layer's memory after every step (one per kept
    entry, per KV head); the first cut, with nothing carried, keeps what the plain pool keeps, and
    a later one differs. The tuned recipe fades its carried vote (+fade:0.7@256/8: every carried
    vote from 256 entries per head up, those carried through 8 cuts below); the default carries none."""
    from memstep.question_pool import QUESTION_POOL, TUNED_POOL, carry_fade, carry_kind, fade_at

    assert carry_kind(TUNED_POOL) == "fade" and carry_fade(TUNED_POOL) == (0.7, 256)
    assert (fade_at(TUNED_POOL, 128), fade_at(TUNED_POOL, 256)) == (8, 0)
    assert carry_kind(QUESTION_POOL) is None
    tokens = ids(300, seed=4)
    schedule = make_schedule("fm", 300, 64, 40)
    engine = ChunkedPrefill(tiny_model, make_scorer("chunk-attention"), sinks=4, question_ids=QUESTION,
                            question_pool="follow:15+carry")
    carried = []
    for record in engine.run(tokens, schedule):
        carried.append(record.kept_positions)
        for idx, positions in enumerate(engine.positions):
            assert engine._carried[idx].shape == positions.shape
    _, plain = run(tiny_model, tokens, schedule, QUESTION, question_pool="follow:15")
    assert np.array_equal(carried[0], plain[0].kept_positions)
    assert any(not np.array_equal(a, b.kept_positions) for a, b in zip(carried[1:], plain[1:]))


def test_the_dropped_carries_are_refused():
    """+lift and +read were ablations no test-split result supports: they are no longer pools."""
    from memstep.question_pool import parse_question_pool

    for pool in ("follow:15+lift", "follow:15+read", "follow:15+read+heads@256"):
        with pytest.raises(MemstepError, match="optionally followed by \\+carry or \\+fade"):
            parse_question_pool(pool)


def test_fade_parses_and_refuses():
    """+fade:F takes F strictly between 0 and 1; the rest is refused in one line."""
    from memstep.question_pool import carry_fade, carry_kind, parse_question_pool

    assert carry_kind("follow:15+fade:0.7+heads@256") == "fade"
    assert carry_fade("follow:15+fade:0.7+heads@256") == (0.7, 0) and carry_fade("follow:15+fade:0.5@200") == (0.5, 200)
    assert carry_fade("follow:15+carry") == (1.0, 0) and parse_question_pool("max:15+fade:0.05") == ("max", 15)
    assert carry_fade("follow:15+fade:0.7@1000000+heads@1000000") == (0.7, 1_000_000)  # @N reads alike for both
    for bad in ("follow:15+fade", "follow:15+fade:1", "follow:15+fade:0", "follow:15+fade:0.0", "follow:15+fade:1.5",
                "follow:15+fade:.5", "follow:15+fade:0.7+carry", "follow:15+fade:0.7@0", "follow:15+fade:0.7@x",
                "follow:15+fade:0.7@1000001"):
        with pytest.raises(MemstepError, match="fade:F"):
            parse_question_pool(bad)


def test_fade_from_a_budget_up(tiny_model):
    """+fade:F@N fades in steps keeping N or more entries per head besides the sinks and carries in
    full below: by hand (pool_at), and in the engine (the same kept entries as +carry below N and as
    +fade:F from N up; M = 40 keeps 40 per head besides the 4 sinks)."""
    from memstep.question_pool import pool_at

    pool = "follow:15+fade:0.7@256+heads@256"
    assert [pool_at(pool, budget) for budget in (128, 255, 256, 512)] == \
        ["follow:15+carry", "follow:15+carry", "follow:15+fade:0.7+heads", "follow:15+fade:0.7+heads"]
    assert pool_at("follow:15+fade:0.5+heads@256", 128) == "follow:15+fade:0.5"

    def kept(pool):
        return [r.kept_positions for r in run(tiny_model, ids(300, seed=4), make_schedule("fm", 300, 64, 40),
                                              QUESTION, question_pool=pool)[1]]

    carry, fade = kept("follow:15+carry"), kept("follow:15+fade:0.3")
    assert any(not np.array_equal(a, b) for a, b in zip(carry, fade))
    for pool, same in (("follow:15+fade:0.3@41", carry), ("follow:15+fade:0.3@40", fade)):
        assert all(np.array_equal(a, b) for a, b in zip(kept(pool), same)), pool


def test_fade_after_k_cuts_by_hand():
    """+fade:F/K: a carried share fades only once it has been carried through K cuts; the others
    keep their full vote; without /K every carried share fades; the first cut has nothing carried.
    With @N, every carried share fades from N entries per head up and /K (or nothing) holds below."""
    from memstep.engine import fade_share
    from memstep.question_pool import carry_fade, fade_at, parse_question_pool, pool_at

    # (pool, budget) -> through how many cuts a vote must have been carried to fade (None: none fades)
    table = [("follow:15+fade:0.7/8+heads@256", 128, 8), ("follow:15+fade:0.7/8+heads@256", 512, 8),
             ("follow:15+fade:0.7@256/8", 255, 8), ("follow:15+fade:0.7@256/8", 256, 0),
             ("follow:15+fade:0.7@256", 255, None), ("follow:15+fade:0.7@256", 256, 0),
             ("follow:15+fade:0.7", 1, 0), ("follow:15+carry+heads", 512, None), ("max:15", 512, None)]
    for pool, budget, after in table:
        assert fade_at(pool, budget) == after, (pool, budget)
    assert carry_fade("follow:15+fade:0.7/8") == (0.7, 0) and carry_fade("follow:15+fade:0.7@256/8") == (0.7, 256)
    assert [pool_at("follow:15+fade:0.7@256/8+heads@256", b) for b in (128, 256)] == \
        ["follow:15+fade:0.7/8", "follow:15+fade:0.7+heads"]
    assert pool_at("follow:15+fade:0.5/3+heads@256", 128) == "follow:15+fade:0.5/3"
    carried = torch.tensor([[0.4, 0.2, 0.1], [0.3, 0.0, 0.6]])
    cuts = torch.tensor([[1, 2, 3], [3, 2, 1]], dtype=torch.int32)
    assert torch.allclose(fade_share(carried, 0.5, cuts, 2), torch.tensor([[0.4, 0.1, 0.05], [0.15, 0.0, 0.6]]))
    assert torch.allclose(fade_share(carried, 0.5, cuts, 4), carried)
    assert torch.allclose(fade_share(carried, 0.5, None, 0), carried * 0.5)
    assert fade_share(carried, 0.5, None, 2) is carried
    for bad in ("follow:15+fade:0.7/0", "follow:15+fade:0.7/x", "follow:15+fade:0.7/1000001", "follow:15+carry/8",
                "follow:15+fade:0.7/8@256", "follow:15+fade:0.7/"):
        with pytest.raises(MemstepError, match="fade:F"):
            parse_question_pool(bad)


def test_fade_after_k_cuts_in_the_engine(tiny_model):
    """In the engine, +fade:F/1 is +fade:F (every carried share has been through a cut) and
    +fade:F/K past the last cut is +carry; in between it keeps a set of its own. The cuts each
    carried share has been through line up with the memory and count the steps since it was read."""
    tokens, schedule = ids(300, seed=4), make_schedule("fm", 300, 64, 40)

    def kept(pool):
        return [r.kept_positions for r in run(tiny_model, tokens, schedule, QUESTION, question_pool=pool)[1]]

    carry, fade = kept("follow:15+carry"), kept("follow:15+fade:0.3")
    assert all(np.array_equal(a, b) for a, b in zip(kept("follow:15+fade:0.3/1"), fade))
    assert all(np.array_equal(a, b) for a, b in zip(kept("follow:15+fade:0.3/1000"), carry))
    engine = ChunkedPrefill(tiny_model, make_scorer("chunk-attention"), sinks=4, question_ids=QUESTION,
                            question_pool="follow:15+fade:0.3/2")
    steps = 0
    for record in engine.run(tokens, schedule):
        steps += 1
        for idx, positions in enumerate(engine.positions):
            since = engine._carried_for[idx]
            assert since.shape == positions.shape == engine._carried[idx].shape
            # FM reads 64 positions a step from 0 on: an entry read at step r has been through steps - r cuts
            assert torch.equal(since, (steps - positions // 64).to(since.dtype))
    assert steps >= 4


def test_carried_shares_step_by_step_by_kind():
    """In the engine, step by step: +carry's held value never falls and grows with the steps it is held
    (its max over more draws); +fade:0.5's falls, but never below half of the step before. Each lines up
    with the memory."""
    model = make_tiny_model()
    with torch.no_grad():  # sharper attention than random init's near-even split, so shares differ step to step
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 30
            layer.self_attn.k_proj.weight *= 30
    rose, fell = {}, {}
    for pool in ("follow:15+carry", "follow:15+fade:0.5"):
        engine = ChunkedPrefill(model, make_scorer("chunk-attention"), sinks=4, question_ids=QUESTION,
                                question_pool=pool)
        seen, rose[pool], fell[pool] = {}, 0, 0
        for _ in engine.run(ids(300, seed=4), make_schedule("fm", 300, 64, 40)):
            for idx, held in enumerate(engine.positions):
                assert engine._carried[idx].shape == held.shape
                for head in range(held.shape[0]):
                    for position, value in zip(held[head].tolist(), engine._carried[idx][head].tolist()):
                        before = seen.get((idx, head, position), 0.0)
                        if before > 0:  # held and scored before
                            rose[pool] += value > before
                            fell[pool] += value < before
                            assert value >= 0.5 * before * (1 - 1e-6)
                        seen[(idx, head, position)] = value
    assert rose["follow:15+carry"] > 0 and fell["follow:15+carry"] == 0
    assert fell["follow:15+fade:0.5"] > 0


def test_heads_share_the_question_vote_by_position(tiny_model):
    """+heads: each entry takes the strongest share any KV head gives its document position (heads
    hold different memories, so positions, not indices, are matched); in the engine every position
    a layer's heads both hold carries one value."""
    from memstep.engine import share_over_heads
    from memstep.question_pool import carry_kind, heads_from, parse_question_pool

    share = torch.tensor([[0.1, 0.5, 0.2], [0.3, 0.0, 0.4]])
    positions = torch.tensor([[4, 7, 9], [4, 9, 12]])
    assert torch.allclose(share_over_heads(share, positions), torch.tensor([[0.3, 0.5, 0.2], [0.3, 0.2, 0.4]]))
    assert parse_question_pool("follow:15+carry+heads") == ("follow", 15)
    assert carry_kind("follow:15+carry+heads") == "carry" and heads_from("follow:15+carry+heads") == 0
    assert heads_from("follow:15+carry") is None

    engine = ChunkedPrefill(tiny_model, make_scorer("chunk-attention"), sinks=4, question_ids=QUESTION,
                            question_pool="follow:15+carry+heads")
    for _ in engine.run(ids(300, seed=4), make_schedule("fm", 300, 64, 40)):
        for idx, held in enumerate(engine.positions):
            values = {}
            for head in range(held.shape[0]):
                for position, value in zip(held[head].tolist(), engine._carried[idx][head].tolist()):
                    assert values.setdefault(position, value) == pytest.approx(value)


def test_heads_weighted_by_hand_and_in_the_engine(tiny_model):
    """+heads/W: each entry takes the larger of its own head's share and W times the strongest any
    head gives its position; +heads@N/W shares in full from N entries per head up and at W below.
    By hand, in the parser and pool_at, and in the engine: W near 1 keeps what +heads keeps, a small
    W what the pool without +heads keeps, and @N/W switches between the two at N."""
    from memstep.engine import share_over_heads
    from memstep.question_pool import heads_at, heads_from, parse_question_pool, pool_at

    share = torch.tensor([[0.1, 0.5, 0.2], [0.3, 0.0, 0.4]])
    positions = torch.tensor([[4, 7, 9], [4, 9, 12]])  # the strongest: position 4 0.3, 7 0.5, 9 0.2, 12 0.4
    assert torch.allclose(share_over_heads(share, positions, 0.5), torch.tensor([[0.15, 0.5, 0.2], [0.3, 0.1, 0.4]]))
    assert torch.equal(share_over_heads(share, positions, 1.0), share_over_heads(share, positions))
    # (pool, budget) -> what the strongest share weighs (None: no sharing)
    table = [("follow:15+carry+heads@256/0.5", 255, 0.5), ("follow:15+carry+heads@256/0.5", 256, 1.0),
             ("follow:15+carry+heads/0.25", 512, 0.25), ("follow:15+carry+heads@256", 255, None),
             ("follow:15+carry+heads", 1, 1.0), ("follow:15+carry", 512, None)]
    for pool, budget, weight in table:
        assert heads_at(pool, budget) == weight, (pool, budget)
    assert heads_from("follow:15+carry+heads@256/0.5") == 256 and parse_question_pool("follow:15+carry+heads/0.25") == ("follow", 15)
    assert [pool_at("follow:15+fade:0.7@256/8+heads@256/0.5", b) for b in (128, 256)] == \
        ["follow:15+fade:0.7/8+heads/0.5", "follow:15+fade:0.7+heads"]
    for bad in ("follow:15+carry+heads/1", "follow:15+carry+heads/0", "follow:15+carry+heads/.5",
                "follow:15+carry+heads@256/", "follow:15+carry+heads/0.5@256", "follow:15+carry+heads:0.5"):
        with pytest.raises(MemstepError, match="\\+heads takes nothing after it but @N"):
            parse_question_pool(bad)

    tokens, schedule = ids(300, seed=2), make_schedule("fm", 300, 64, 40)  # M = 40: 40 entries per head besides sinks

    def kept(pool):
        return [r.kept_positions for r in run(tiny_model, tokens, schedule, QUESTION, question_pool=pool)[1]]

    own, shared, half = kept("follow:15+carry"), kept("follow:15+carry+heads"), kept("follow:15+carry+heads/0.5")
    assert any(not np.array_equal(a, b) for a, b in zip(own, shared))
    assert all(np.array_equal(a, b) for a, b in zip(kept("follow:15+carry+heads/0.9999999"), shared))
    assert all(np.array_equal(a, b) for a, b in zip(kept("follow:15+carry+heads/0.0000001"), own))
    for pool, same in (("follow:15+carry+heads@40/0.5", shared), ("follow:15+carry+heads@41/0.5", half)):
        assert all(np.array_equal(a, b) for a, b in zip(kept(pool), same)), pool


def test_last_cut_by_hand_and_in_the_engine(tiny_model):
    """+last[:W]: the prefill's last cut ranks by the question's share at weight W (1: alone) in place
    of the question weight (<N: where that cut keeps fewer than N entries per head); every cut before
    it is the pool's without +last. By hand, in the parser and pool_at, and in the engine: a run whose
    only cut is its last keeps what weight W keeps (and, from N up, what the question weight keeps);
    with many cuts, every step but the last keeps what the pool without +last keeps."""
    from memstep.question_pool import last_at, parse_question_pool, pool_at

    # (pool, entries per head the last cut keeps) -> the question's weight there (None: the question weight)
    table = [("follow:15+fade:0.7@256/8+heads@256+last", 512, 1.0), ("follow:15+carry+last:0.9", 1, 0.9),
             ("max:15+last:1<256", 255, 1.0), ("max:15+last:1<256", 256, None), ("follow:15+last:0.5<2", 1, 0.5),
             ("follow:15+fade:0.7@256/8+heads@256", 128, None)]
    for pool, budget, weight in table:
        assert last_at(pool, budget) == weight and parse_question_pool(pool)[0] in ("follow", "max"), pool
    assert [pool_at("follow:15+fade:0.7@256/8+heads@256+last<256", b) for b in (128, 255, 256)] == \
        ["follow:15+fade:0.7/8+last", "follow:15+fade:0.7/8+last", "follow:15+fade:0.7+heads"]
    assert pool_at("follow:15+carry+last:0.5", 64) == "follow:15+carry+last:0.5"
    for bad in ("follow:15+last:0", "follow:15+last:1.5", "follow:15+last+heads", "follow:15+last:",
                "follow:15+lastly", "follow:15+last:.5", "follow:15+last<0", "follow:15+last<", "follow:15+last<256:1"):
        with pytest.raises(MemstepError, match="\\+last comes at the very end"):
            parse_question_pool(bad)

    def kept(schedule, tokens, pool, weight=0.75):
        return [r.kept_positions for r in run(tiny_model, tokens, schedule, QUESTION, question_pool=pool,
                                              question_weight=weight)[1]]

    # FM with M = 40 and c = 32: the first step fits (4 sinks + 32 <= 44), the second is the only cut
    tokens, once = ids(64, seed=5), make_schedule("fm", 64, 32, 40)
    alone, mixed = kept(once, tokens, "follow:15+carry", 1.0), kept(once, tokens, "follow:15+carry")
    assert not np.array_equal(alone[-1], mixed[-1])
    assert np.array_equal(kept(once, tokens, "follow:15+carry+last")[-1], alone[-1])
    assert np.array_equal(kept(once, tokens, "follow:15+carry+last:0.75")[-1], mixed[-1])
    assert np.array_equal(kept(once, tokens, "follow:15+carry+last<41")[-1], alone[-1])  # 40 entries per head
    assert np.array_equal(kept(once, tokens, "follow:15+carry+last<40")[-1], mixed[-1])
    tokens, many = ids(300, seed=5), make_schedule("fm", 300, 64, 40)
    plain, last = kept(many, tokens, "follow:15"), kept(many, tokens, "follow:15+last")
    assert len(plain) >= 4 and all(np.array_equal(a, b) for a, b in zip(plain[:-1], last[:-1]))
    assert not np.array_equal(plain[-1], last[-1])


def test_lend_by_hand_and_in_the_engine(tiny_model):
    """+lend:C: where +heads does not share in full, a KV head whose top picks (an eighth of the entries
    it keeps) hold less than C times what the layer's most focused head's top picks hold takes the
    strongest share any head gives each position; every other head keeps its own. By hand, in the parser
    and pool_at, and in the engine (two KV heads: after every cut one head's carried share is at least the
    other's at every position both hold, which sharing into the lending head as well, or into neither,
    would not make so)."""
    from memstep.engine import lend_over_heads
    from memstep.question_pool import lend_at, parse_question_pool, pool_at

    share = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25], [0.4, 0.3, 0.2, 0.1]])
    positions = torch.tensor([[4, 5, 6, 7], [4, 5, 6, 8], [5, 6, 7, 9]])
    # the top 2 hold 0.8, 0.5 and 0.7; the strongest share at 4: 0.7, 5: 0.4, 6: 0.3, 7: 0.2, 8: 0.25, 9: 0.1
    assert torch.allclose(lend_over_heads(share, positions, 0.75, 2),  # below 0.6: the second head alone
                          torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.7, 0.4, 0.3, 0.25], [0.4, 0.3, 0.2, 0.1]]))
    assert torch.allclose(lend_over_heads(share, positions, 0.9, 2),  # below 0.72: the second and third
                          torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.7, 0.4, 0.3, 0.25], [0.4, 0.3, 0.2, 0.1]]))
    assert torch.equal(lend_over_heads(share, positions, 0.6, 2), share)  # 0.5 is not below 0.48
    assert torch.allclose(lend_over_heads(share, positions, 0.9, 1)[1], torch.tensor([0.7, 0.4, 0.3, 0.25]))
    # (pool, entries per head) -> C (None: no lending there)
    table = [("follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256", 128, 0.75),
             ("follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256", 256, None), ("follow:15+carry+lend:0.5", 512, 0.5),
             ("follow:15+carry+heads/0.5+lend:0.5", 64, 0.5), ("follow:15+carry+heads+lend:0.5", 64, None),
             ("follow:15+carry+heads@256", 64, None)]
    for pool, budget, spread in table:
        assert lend_at(pool, budget) == spread and parse_question_pool(pool) == ("follow", 15), (pool, budget)
    assert [pool_at("follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256", b) for b in (128, 256)] == \
        ["follow:15+fade:0.7/8+lend:0.75+last", "follow:15+fade:0.7+heads"]
    for bad in ("follow:15+lend", "follow:15+lend:1", "follow:15+lend:0", "follow:15+lend:.5", "follow:15+lend:0.5+heads",
                "follow:15+lend:0.5@256", "follow:15+lend:0.5+carry", "follow:15+lendx:0.5"):
        with pytest.raises(MemstepError, match="\\+lend:C comes after \\+heads"):
            parse_question_pool(bad)

    # the random model's heads are about as focused as each other: C near 1 lends on this document
    tokens, schedule = ids(300, seed=3), make_schedule("fm", 300, 64, 40)

    def kept(pool):
        return [r.kept_positions for r in run(tiny_model, tokens, schedule, QUESTION, question_pool=pool)[1]]

    def dominated(pool):
        """Per cut and layer: whether one KV head's carried share is at least the other's wherever both hold a position."""
        engine = ChunkedPrefill(tiny_model, make_scorer("chunk-attention"), sinks=4, question_ids=QUESTION, question_pool=pool)
        found = []
        for _ in engine.run(tokens, schedule):
            for idx, held in enumerate(engine.positions):
                values = [dict(zip(held[h].tolist(), engine._carried[idx][h].tolist())) for h in range(2)]
                both = values[0].keys() & values[1].keys()
                found.append(any(all(values[a][p] >= values[1 - a][p] for p in both) for a in range(2)))
        return found

    own = kept("follow:15+carry")
    assert any(not np.array_equal(a, b) for a, b in zip(kept("follow:15+carry+lend:0.9999999"), own))
    assert all(np.array_equal(a, b) for a, b in zip(kept("follow:15+carry+lend:0.0000001"), own))
    assert all(np.array_equal(a, b) for a, b in zip(kept("follow:15+carry+heads+lend:0.9"), kept("follow:15+carry+heads")))
    assert all(dominated("follow:15+carry+lend:0.9999999"))
    assert not all(dominated("follow:15+carry"))


def test_spans_by_hand_and_in_the_engine(embedded):
    """+spans:KxL: in the prefill's last cut each layer's K spans of L positions (from the first after the
    sinks) holding the most question share summed over its KV heads stay in every head, ahead of its own
    picks. By hand (heads holding different positions are summed by position), in the parser and pool_at,
    and in the engine: every cut before the last keeps what the pool without it keeps; after the last each
    head holds every entry it had in the spans chosen, where its own ranking does not."""
    import memstep.engine as engine_module
    from memstep.engine import spans_over_heads
    from memstep.question_pool import parse_question_pool, pool_at, spans_at

    share = torch.tensor([[0.6, 0.5, 0.1, 0.1, 0.3, 0.0], [0.0, 0.1, 0.1, 0.4, 0.2, 0.2]])
    positions = torch.tensor([[2, 4, 5, 6, 7, 9], [3, 4, 6, 7, 8, 9]])
    # sinks 4, L 2: span 0 holds positions 4-5 (0.5 + 0.1 + 0.1 = 0.7), span 1 6-7 (0.1 + 0.3 + 0.1 + 0.4 = 0.9),
    # span 2 8-9 (0.2 + 0.2 = 0.4); the sinks' share (0.6 at position 2) counts for none
    assert torch.equal(spans_over_heads(share, positions, 4, 1, 2),
                       torch.tensor([[False, False, False, True, True, False],
                                     [False, False, True, True, False, False]]))
    assert torch.equal(spans_over_heads(share, positions, 4, 2, 2),
                       torch.tensor([[False, True, True, True, True, False], [False, True, True, True, False, False]]))
    # L 3: 4-6 (0.5 + 0.1 + 0.1 + 0.1 + 0.1 = 0.9) against 7-9 (0.3 + 0.4 + 0.2 + 0.2 = 1.1)
    assert torch.equal(spans_over_heads(share, positions, 4, 1, 3),
                       torch.tensor([[False, False, False, False, True, True],
                                     [False, False, False, True, True, True]]))
    assert bool(spans_over_heads(share, positions, 4, 9, 2)[positions >= 4].all())  # more spans than there are
    # sentences (a span id per position, the sinks -1): 4-5 (0.7) and 6-9 (0.1 + 0.3 + 0.1 + 0.4 + 0.2 + 0.2 = 1.3)
    sentences = torch.tensor([-1, -1, -1, -1, 0, 0, 1, 1, 1, 1])
    assert torch.equal(spans_over_heads(share, positions, 4, 1, "sentence", sentences),
                       torch.tensor([[False, False, False, True, True, True], [False, False, True, True, True, True]]))
    # (pool, entries per head) -> (K, L) (None: no spans there)
    table = [("follow:15+fade:0.7@256/8+heads@256+lend:0.75+spans:4x20<256+last<256", 128, (4, 20)),
             ("follow:15+fade:0.7@256/8+heads@256+lend:0.75+spans:4x20<256+last<256", 256, None),
             ("follow:15+carry+spans:1x512", 4096, (1, 512)), ("follow:15+spans:2x8<41+last", 40, (2, 8)),
             ("follow:15+spans:2x8<40", 40, None), ("follow:15+carry+lend:0.5", 64, None),
             ("follow:15+carry+spans:3xsentence<256+last", 128, (3, "sentence"))]
    for pool, budget, spans in table:
        assert spans_at(pool, budget) == spans and parse_question_pool(pool) == ("follow", 15), (pool, budget)
    assert [pool_at("follow:15+fade:0.7@256/8+heads@256+lend:0.75+spans:4x20<256+last<256", b) for b in (128, 256)] == \
        ["follow:15+fade:0.7/8+lend:0.75+spans:4x20+last", "follow:15+fade:0.7+heads"]
    for bad in ("follow:15+spans", "follow:15+spans:4", "follow:15+spans:0x20", "follow:15+spans:4x0",
                "follow:15+spans:4x513", "follow:15+spans:4x20+lend:0.5", "follow:15+spans:4x20@256",
                "follow:15+spans:4x20<0", "follow:15+spans:4x20+carry", "follow:15+spans:3xsentences",
                "follow:15+spans:0xsentence"):
        with pytest.raises(MemstepError, match="\\+spans:KxL comes after \\+lend"):
            parse_question_pool(bad)

    # the embedded model on the needle test's essays (a random model's heads agree on what the spans hold)
    from memstep.evaluation.niah import haystack_tokens

    tokens = torch.tensor(haystack_tokens(embedded.tokenizer)[:456])
    question = embedded.tokenizer(" What did the author work on before college?")["input_ids"]
    schedule = make_schedule("fm", 456, 128, 64)
    chosen = []
    real = engine_module.spans_over_heads

    def spy(share, positions, sinks, count, length, sentences=None):
        first = real(share, positions, sinks, count, length, sentences)
        chosen.append([set(positions[h][first[h]].tolist()) for h in range(positions.shape[0])])
        return first

    def cuts(pool, sentences=None):
        """Per cut: the positions each head of each layer holds after it."""
        engine = ChunkedPrefill(embedded.model, make_scorer("chunk-attention"), sinks=4, question_ids=question,
                                question_pool=pool)
        engine.sentence_table = sentences
        return [[[set(p.tolist()) for p in layer] for layer in engine.positions] for _ in engine.run(tokens, schedule)]

    engine_module.spans_over_heads = spy
    try:
        held = cuts("follow:15+carry+spans:2x8")
    finally:
        engine_module.spans_over_heads = real
    own = cuts("follow:15+carry")
    # the last cut alone, once per layer
    assert len(held) == 4 and held[:-1] == own[:-1] and len(chosen) == len(held[-1])
    assert all(wanted <= kept for heads, layer in zip(chosen, held[-1]) for wanted, kept in zip(heads, layer))
    # the head's own ranking alone leaves some of those entries out
    assert not all(wanted <= kept for heads, layer in zip(chosen, own[-1]) for wanted, kept in zip(heads, layer))
    # sentences: the table DocumentRun reads from the tokenizer; at most 2 sentences chosen, kept where held
    from memstep.runner import DocumentRun
    from memstep.spans import SpanSetting, span_table, token_texts

    pool = "follow:15+carry+spans:2xsentence"
    with pytest.raises(MemstepError, match="needs the text's sentence breaks"):
        cuts(pool)
    table = span_table(SpanSetting("sentence", 48), token_texts(embedded.tokenizer, tokens), 4)
    chosen.clear()
    engine_module.spans_over_heads = spy
    try:
        held = cuts(pool, table)
    finally:
        engine_module.spans_over_heads = real
    assert held[:-1] == own[:-1] and len(chosen) == len(held[-1])
    assert all(len({int(table[p]) for p in wanted}) <= 2 for heads in chosen for wanted in heads)
    assert all(wanted <= kept for heads, layer in zip(chosen, held[-1]) for wanted, kept in zip(heads, layer))
    run = DocumentRun(embedded, list(tokens), schedule="fm", chunk=128, memory=64, question="Why?",
                      question_aware=True, question_pool=pool)
    assert run.engine.sentence_table is not None and run.engine.sentence_table.numel() == len(run.input_ids)


def test_heads_share_from_a_budget_up(tiny_model):
    """+heads@N shares the question's vote between a layer's KV heads in a step that keeps N or more
    entries per head (sinks not counted) and not below; the tuned recipe shares (and fades its
    carried vote) from 256 up. In the engine a budget of 40 runs +heads@40 as +heads and +heads@41 as the pool without it."""
    from memstep.question_pool import TUNED_POOL, heads_from, parse_question_pool, pool_at

    assert TUNED_POOL == "follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256"
    assert [pool_at(TUNED_POOL, budget) for budget in (128, 255, 256, 512)] == \
        ["follow:15+fade:0.7/8+lend:0.75+last", "follow:15+fade:0.7/8+lend:0.75+last", "follow:15+fade:0.7+heads",
         "follow:15+fade:0.7+heads"]
    table = [("follow:15+carry+heads@256", 128, "follow:15+carry"), ("follow:15+carry+heads@256", 255, "follow:15+carry"),
             ("follow:15+carry+heads@256", 256, "follow:15+carry+heads"),
             ("follow:15+carry+heads@256", 512, "follow:15+carry+heads"),
             ("follow:15+carry+heads", 1, "follow:15+carry+heads"), ("max:15", 512, "max:15")]
    for pool, budget, runs in table:
        assert pool_at(pool, budget) == runs, (pool, budget)
    assert (heads_from("follow:15+carry+heads@256"), heads_from("follow:15+heads"), heads_from("follow:15")) == (256, 0, None)
    assert heads_from("follow:15+fade:0.7@1000000+heads@1000000") == 1_000_000
    assert parse_question_pool("follow:15+carry+heads@256") == ("follow", 15)
    for bad in ("follow:15+carry+heads@0", "follow:15+heads@", "follow:15+heads@x", "follow:15+heads+carry",
                "follow:15+heads256", "follow:15+heads@1000001"):
        with pytest.raises(MemstepError, match="\\+heads takes nothing after it but @N"):
            parse_question_pool(bad)

    tokens, schedule = ids(300, seed=2), make_schedule("fm", 300, 64, 40)
    kept = {pool: [r.kept_positions for r in run(tiny_model, tokens, schedule, QUESTION, question_pool=pool)[1]]
            for pool in ("follow:15+carry", "follow:15+carry+heads", "follow:15+carry+heads@40",
                         "follow:15+carry+heads@41")}

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(kept[a], kept[b]))

    assert not same("follow:15+carry", "follow:15+carry+heads")  # sharing changes what this run keeps
    assert same("follow:15+carry+heads@40", "follow:15+carry+heads")
    assert same("follow:15+carry+heads@41", "follow:15+carry")


@pytest.mark.parametrize("pool", ["mean:4", "follow:15+last:2"])
def test_bad_question_pool_exits_before_the_model_loads(tmp_path, pool):
    doc = tmp_path / "doc.txt"
    doc.write_text("words " * 50)
    done = subprocess.run([sys.executable, "-m", "memstep", "run", str(doc), "--model", "/nonexistent",
                           "--question-aware", "--question", "what?", "--question-pool", pool],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert f"question pool '{pool}'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bad_question_aware_settings(tiny_model):
    with pytest.raises(MemstepError, match="needs a question"):
        ChunkedPrefill(tiny_model, question_ids=[])
    with pytest.raises(MemstepError, match="attention-based scorer"):
        ChunkedPrefill(tiny_model, make_scorer("recency"), question_ids=QUESTION)
    with pytest.raises(MemstepError, match="question weight"):
        ChunkedPrefill(tiny_model, question_ids=QUESTION, question_weight=1.5)
    eager = make_tiny_model("llama", layers=1)
    eager.config._attn_implementation = "eager"
    with pytest.raises(MemstepError, match="SDPA"):
        ChunkedPrefill(eager, question_ids=QUESTION, rope="document")


def test_runner_needs_a_question_that_fits(tiny_model):
    from memstep.models import LoadedModel
    from memstep.runner import DocumentRun

    class Tokenizer:  # characters as tokens, no chat template
        chat_template = None
        eos_token_id = 0

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) % 128 for c in text]}

    lm = LoadedModel(tiny_model, Tokenizer(), "tiny", "cpu", "float32")
    document = ids(300).tolist()
    with pytest.raises(MemstepError, match="needs a question"):
        DocumentRun(lm, document, schedule="fm", chunk=64, memory=40, question_aware=True)
    with pytest.raises(MemstepError, match="half the model's 4096-token context"):
        DocumentRun(lm, document, schedule="fm", chunk=64, memory=40, question_aware=True, question="why " * 600)
    run = DocumentRun(lm, document, schedule="imdc", chunk=64, memory=40, question_aware=True, question="who?",
                      max_new_tokens=2)
    result = run.run()
    assert result.question_aware and (result.question_weight, result.question_pool) == (1.0, "max:15")
    # the recipe named 'tuned' runs spelled out, at its own weight unless one is given
    tuned = DocumentRun(lm, document, schedule="fm", chunk=64, memory=40, question_aware=True, question="who?",
                        question_pool="tuned")
    assert (tuned.result.question_pool, tuned.result.question_weight) == (TUNED_POOL, 0.75)
    assert tuned.engine.question_pool == TUNED_POOL and tuned.engine.question_weight == 0.75
    weighed = DocumentRun(lm, document, schedule="fm", chunk=64, memory=40, question_aware=True, question="who?",
                          question_pool="tuned", question_weight=0.5)
    assert weighed.engine.question_weight == 0.5
    assert result.steps[-1].question_tokens == len("\n\nQuestion: who?\nAnswer:")  # the prompt's tail
    assert result.to_dict()["question_aware"] is True


@pytest.mark.slow
def test_embedded_model_keeps_and_answers_a_passkey_the_agnostic_run_loses(embedded):
    """A 1k-token passkey document (Pride and Prejudice, needle at 30% depth, seed 0) under IMDC
    with c = M = 256: the agnostic memory loses the number, the question-aware one answers it."""
    from memstep.evaluation.suite import make_cases
    from memstep.passkey import answer_contains_passkey
    from memstep.runner import DocumentRun

    case = make_cases(embedded.tokenizer, [1024], [0.3], [0])[0]
    answers, kept = {}, {}
    for aware in (False, True):
        run = DocumentRun(embedded, case.document_ids, schedule="imdc", chunk=256, memory=256,
                          question=case.question, max_new_tokens=16, question_aware=aware)
        result = run.run()
        start, end = case.passkey_tokens
        answers[aware] = result.answer
        kept[aware] = result.steps[-1].kept_fraction()[result.prefix_tokens + start:result.prefix_tokens + end].mean()
    assert not answer_contains_passkey(answers[False], case.passkey), answers
    assert answer_contains_passkey(answers[True], case.passkey), answers
    assert kept[False] < 0.05 < kept[True]
