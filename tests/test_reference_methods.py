"""The reference code's ways and methods, each on a small case worked out by hand: the last c
rows of the padded queries, strided GQA grouping, sinks stripped before pooling, the pruners
roco / random-shared / chunk-prefix / random-query, the fixed-incremental and local
schedules, the review, the question inside the prompt, and what the reference preset refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import make_tiny_model
from test_cli import cli
from test_models import tiny_lm, tiny_lm_folder  # noqa: F401  (fixtures)

from memstep.engine import ChunkedPrefill, ntk_factor
from memstep.errors import MemstepError
from memstep.presets import REFERENCE, Fidelity
from memstep.runner import DocumentRun
from memstep.schedules import fixed_incremental_budgets, make_schedule, reviewed_steps
from memstep.scorers import ChunkAttention, ChunkPrefix, Conv, LayerState, RandomQuery, RoCo, SharedRandom, select_kept

LN2 = math.log(2)


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-6)


def memo_state(sums, rows, kv_heads=1, window=None, heads=None):
    """A state whose column sums are given (kv_heads, keys); ``rows`` chunk rows at the end."""
    sums = torch.tensor(sums, dtype=torch.float32).reshape(kv_heads, -1)
    n = sums.shape[1]
    keys = torch.zeros(kv_heads, n, 2)
    queries = torch.zeros(heads or kv_heads, rows, 2)
    state = LayerState(queries, keys, keys.clone(), torch.arange(n).expand(kv_heads, -1), 1.0, rows=rows,
                       window=window)
    state._memo[0] = sums
    return state


# ---- the reference's query rows: the last c rows of the zero-padded block -------------------------
def test_last_c_rows_count_the_zero_padded_rows_before_a_short_chunk():
    """One head; keys 0, ln 2, 0 (two memory keys, a chunk of one row, q = 1), c = 2: the last two
    rows of the padded block are a zero row (position 1: 1/2, 1/2 on keys 0, 1) and the chunk's
    row (1/4, 1/2, 1/4). Sums 3/4, 1, 1/4; rows that see each key 2, 2, 1."""
    q = torch.tensor([[[1.0]]])
    k = torch.tensor([[[0.0], [LN2], [0.0]]])
    layer = LayerState(q, k, torch.ones_like(k), torch.arange(3)[None], 1.0, window=2)
    close(layer.attention_sum(), [[0.75, 1.0, 0.25]])
    close(layer.visible_queries(), [2, 2, 1])
    close(ChunkAttention().score(layer), [[0.375, 0.5, 0.25]])
    # the chunk's own rows (memstep's default): the one row only
    plain = LayerState(q, k, torch.ones_like(k), torch.arange(3)[None], 1.0)
    close(ChunkAttention().score(plain), [[0.25, 0.5, 0.25]])


def test_last_c_rows_of_a_chunk_longer_than_c():
    """A chunk of 2 rows with c = 1: only the last row counts (1/4, 1/2, 1/4), seen by 1 row each."""
    q = torch.tensor([[[1.0], [1.0]]])
    k = torch.tensor([[[0.0], [LN2], [0.0]]])
    layer = LayerState(q, k, torch.ones_like(k), torch.arange(3)[None], 1.0, window=1)
    close(layer.attention_sum(), [[0.25, 0.5, 0.25]])
    close(layer.visible_queries(), [1, 1, 1])


# ---- GQA grouping ----------------------------------------------------------------------------------
def test_strided_grouping_sums_heads_j_and_j_plus_kv_heads():
    """Heads 0..3 with sums 1, 2, 4, 8 on two KV heads: the model's grouping (heads 0, 1 | 2, 3)
    gives 3 and 12; the reference's stride (heads 0, 2 | 1, 3) gives 5 and 10."""
    per_head = torch.tensor([1.0, 2.0, 4.0, 8.0])[:, None].reshape(2, 2, 1)
    model = memo_state([[0.0], [0.0]], rows=1, kv_heads=2, heads=4)
    strided = memo_state([[0.0], [0.0]], rows=1, kv_heads=2, heads=4)
    strided.grouping = "strided"
    close(model.group(per_head), [[3.0], [12.0]])
    close(strided.group(per_head), [[5.0], [10.0]])


# ---- sinks out of the scoring ----------------------------------------------------------------------
def test_stripped_sinks_do_not_spill_into_their_neighbours_through_pooling():
    """Sums 10, 10, 1, 1, 1, 1 (the first two entries sinks), one chunk row (each key seen by 1),
    pooled over 3 keys with zero padding counted. Pooled with the sinks: key 2 gets
    (10 + 1 + 1) / 3 = 4; stripped first: (0 + 1 + 1) / 3 = 2/3, as the reference pools."""
    state = memo_state([10, 10, 1, 1, 1, 1], rows=1)
    close(Conv(kernel=3).score(state), [[20 / 3, 7, 4, 1, 1, 2 / 3]])
    close(Conv(kernel=3).score(state.without_leading(2)), [[2 / 3, 1, 1, 2 / 3]])


# ---- the reference's pruners -----------------------------------------------------------------------
def test_roco_zeroes_the_budget_half_of_lowest_deviation_with_the_references_total():
    """Sums 0.9, 0.3, 0.6, 1.2, 0.4, 0.5 (memory 3 keys, chunk 3 rows: seen by 3, 3, 3, 3, 2, 1);
    scores 0.3, 0.1, 0.2, 0.4, 0.2, 0.5. The squares sum to S = 3 over everything, so the
    deviation is sqrt(3 / n_k - score^2): 0.954, 0.995, 0.980, 0.917, 1.208, 1.658. A budget of
    4 zeroes the 2 lowest: keys 3 and 0 (the two best of the fully seen keys)."""
    state = memo_state([0.9, 0.3, 0.6, 1.2, 0.4, 0.5], rows=3)
    state._memo["square"] = torch.tensor([[0.5, 0.5, 0.5, 0.5, 0.5, 0.5]])
    state.budget = 4
    close(RoCo().score(state), [[0.0, 0.1, 0.2, 0.0, 0.2, 0.5]])


def test_roco_square_sums_are_the_grouped_attention_squared():
    """One head, keys 0, ln 2, 0, chunk rows 2 (the ONE_HEAD case of test_scorers): row 0 gives
    1/3, 2/3; row 1 gives 1/4, 1/2, 1/4; squares summed: 1/9 + 1/16, 4/9 + 1/4, 1/16."""
    q = torch.tensor([[[1.0], [1.0]]])
    k = torch.tensor([[[0.0], [LN2], [0.0]]])
    layer = LayerState(q, k, torch.ones_like(k), torch.arange(3)[None], 1.0)
    close(layer.attention_square_sum(), [[1 / 9 + 1 / 16, 4 / 9 + 1 / 4, 1 / 16]])


def test_random_shared_draws_the_same_entries_for_every_kv_head():
    state = memo_state([0.0] * 36, rows=2, kv_heads=3)
    scores = SharedRandom(seed=5).score(state)
    assert torch.equal(scores[0], scores[1]) and torch.equal(scores[1], scores[2])
    kept = select_kept(scores, state.positions, 6, 2)
    assert all(torch.equal(kept[0], row) for row in kept)
    again = SharedRandom(seed=5)
    again.reset()
    assert torch.equal(again.score(state), scores)


def test_chunk_prefix_keeps_the_oldest_entries():
    state = memo_state([5.0, 1.0, 9.0, 2.0, 7.0, 3.0], rows=2)
    kept = select_kept(ChunkPrefix().score(state), state.positions, 4, 1)
    assert kept.tolist() == [[0, 1, 2, 3]]


def test_random_query_reads_the_cached_keys_and_spends_one_unit_per_query():
    """128 random queries, a softmax each over the keys: the scores of a KV head sum to 128;
    identical cached keys score alike; the rotated keys are not what it reads."""
    cached = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 3.0], [-2.0, 0.5]]])
    rotated = torch.randn(1, 4, 2)
    state = LayerState(None, rotated, torch.ones(1, 4, 2), torch.arange(4)[None], 1.0, rows=1, cached_keys=cached)
    scores = RandomQuery(seed=3).score(state)
    assert scores.shape == (1, 4) and math.isclose(float(scores.sum()), 128.0, rel_tol=1e-5)
    assert math.isclose(float(scores[0, 0]), float(scores[0, 1]), rel_tol=1e-6)
    other = LayerState(None, torch.randn(1, 4, 2), torch.ones(1, 4, 2), torch.arange(4)[None], 1.0, rows=1,
                       cached_keys=cached)
    assert torch.equal(RandomQuery(seed=3).score(other), scores)


# ---- schedules: fixed-incremental, local, review ----------------------------------------------------
def test_fixed_incremental_budgets_add_each_steps_share():
    """M = 10 over 4 steps: shares 3, 3, 2, 2 (M // n, one more for the first M % n), so 3, 6, 8, 10."""
    assert fixed_incremental_budgets(10, 4) == [3, 6, 8, 10]
    schedule = make_schedule("fim", 1000, 256, 10)
    assert schedule.chunk_sizes == (256, 256, 256, 232) and schedule.memory_sizes == (3, 6, 8, 10)
    assert make_schedule("local", 1000, 256, 10).memory_sizes == (0, 0, 0, 0)


def test_fixed_incremental_memory_is_never_scored_again(tiny_model):
    """Each step's kept entries contain all of the step before's: only the chunk competes."""
    ids = torch.randint(0, 128, (260,), generator=torch.Generator().manual_seed(3))
    schedule = make_schedule("fim", 260, 64, 40)
    records = list(ChunkedPrefill(tiny_model, Conv(), sinks=4).run(ids, schedule))
    for before, after in zip(records, records[1:]):
        for layer_before, layer_after in zip(before.kept_positions, after.kept_positions):
            for head_before, head_after in zip(layer_before, layer_after):
                assert set(head_before) <= set(head_after)
                new = set(head_after) - set(head_before)
                assert all(after.chunk_start <= p < after.chunk_start + after.chunk_size for p in new)
    assert [r.memory_after for r in records] == [after for _, after in schedule.cache_lengths(4)] == [12, 20, 28, 36, 40]


def test_local_window_without_sinks_reads_each_chunk_alone(tiny_model):
    """Budget 0 and no sinks: a chunk's states are those of the chunk prefilled on its own."""
    ids = torch.randint(0, 128, (150,), generator=torch.Generator().manual_seed(4))
    engine = ChunkedPrefill(tiny_model, ChunkAttention(), sinks=0, collect_hidden=True, rope="compact")
    records = list(engine.run(ids, make_schedule("local", 150, 64, 0)))
    assert [r.memory_after for r in records] == [0, 0, 0]
    with torch.inference_mode():
        alone = tiny_model.model(input_ids=ids[64:128][None]).last_hidden_state[0]
    torch.testing.assert_close(engine.hidden_chunks[1], alone, rtol=1e-4, atol=1e-4)


def test_review_positions_follow_the_reference_schedulers():
    """12 chunks, M / c = 2.5: chunk k = 3 is re-read; window of 4 chunks (3, 4, 5, 6)."""
    order = list(range(12))
    assert reviewed_steps(12, 1250, 500, ("late", 1, 4)) == order[:7] + [3] + order[7:]
    assert reviewed_steps(12, 1250, 500, ("early", 2, 4)) == [0, 1, 2, 3, 3, 3, 4, 5, 6] + order[7:]
    # uniform: interval 4 / 2 = 2, positions int(2) - 1 = 1 and int(4) - 1 = 3
    assert reviewed_steps(12, 1250, 500, ("uniform", 2, 4)) == [0, 1, 2, 3, 3, 4, 5, 3, 6] + order[7:]
    # exp: base (4 - 1) ** (1 / 2) = 1.73; positions round(1.0) = 1 and the last, 3
    assert reviewed_steps(12, 1250, 500, ("exp", 2, 4)) == [0, 1, 2, 3, 3, 4, 5, 3, 6] + order[7:]
    with pytest.raises(MemstepError, match="exp review needs at least 2"):
        reviewed_steps(12, 1250, 500, ("exp", 1, 4))


def test_review_rereads_a_chunk_and_budgets_follow_the_step(tiny_model):
    schedule = make_schedule("im", 600, 100, 150, "linear", review=("late", 1, 2))
    # chunk k = ceil(150 / 100) = 2 read again after the window (2, 3); step 4 onwards keep M
    assert schedule.chunk_starts == (0, 100, 200, 300, 200, 400, 500)
    assert schedule.tokens == 600 and schedule.steps == 7
    assert schedule.memory_sizes == (25, 50, 75, 100, 125, 150, 150)
    ids = torch.randint(0, 128, (600,), generator=torch.Generator().manual_seed(5))
    records = list(ChunkedPrefill(tiny_model, ChunkAttention(), sinks=4).run(ids, schedule))
    assert records[4].chunk_start == 200 and records[4].tokens_seen == 400
    fraction = records[4].kept_fraction()
    assert len(fraction) == 400 and fraction.max() <= 1.0


# ---- the question inside the prompt ----------------------------------------------------------------
def test_question_inside_the_prompt_is_evicted_like_the_document(tiny_lm):  # noqa: F811
    """The question's tokens are the prompt's last: a scorer that keeps the newest keeps all of
    them, one that keeps the oldest drops all of them; no rule protects them."""
    ids = tiny_lm.tokenizer("The magic number for the castle is 81777. " * 30)["input_ids"]
    fidelity = Fidelity(question_place="prompt")

    def final_positions(scorer):
        run = DocumentRun(tiny_lm, ids, schedule="fm", chunk=64, memory=48, scorer=scorer, question="What is it?",
                          max_new_tokens=2, fidelity=fidelity)
        result = run.run()
        start = len(run.head) + len(ids)
        assert result.prompt_question_tokens == len(run.input_ids) - start > 5
        assert result.tokens == len(run.input_ids) and result.answer is not None
        return result.steps[-1].kept_positions, range(start, len(run.input_ids))

    newest, question = final_positions("recency")
    oldest, _ = final_positions("chunk-prefix")
    assert np.isin(list(question), newest).all()
    assert not np.isin(list(question), oldest).any()


def test_question_inside_the_prompt_refuses_what_cannot_follow_it(tiny_lm):  # noqa: F811
    ids = list(range(300, 500))
    with pytest.raises(MemstepError, match="no held-out continuation"):
        DocumentRun(tiny_lm, ids, question="Why?", continuation_tokens=20, fidelity=REFERENCE)
    with pytest.raises(MemstepError, match="question-aware"):
        DocumentRun(tiny_lm, ids, question="Why?", question_aware=True, fidelity=REFERENCE)
    run = DocumentRun(tiny_lm, ids, schedule="fm", chunk=64, memory=32, question="Why?", max_new_tokens=2,
                      fidelity=REFERENCE)
    run.run()
    with pytest.raises(MemstepError, match="another question needs another run"):
        run.ask("Where?")


# ---- dynamic NTK -------------------------------------------------------------------------------------
def test_dynamic_ntk_factor_is_the_references():
    """max(2^ceil(log2(p / L) + 1) - 1, 1): 1 up to L, 3 up to 2L, 7 up to 4L."""
    assert [ntk_factor(p, 100) for p in (0, 50, 100, 101, 200, 201, 400, 401)] == [1, 1, 1, 3, 3, 7, 7, 15]


def test_dynamic_ntk_needs_compact_positions_and_plain_rope(tiny_model):
    with pytest.raises(MemstepError, match="dynamic NTK rescales the compact positions"):
        ChunkedPrefill(tiny_model, rope="document", fidelity=Fidelity(ntk="dynamic"))
    scaled = make_tiny_model("llama", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(MemstepError, match="plain RoPE"):
        ChunkedPrefill(scaled, fidelity=Fidelity(ntk="dynamic"))


# ---- what the reference preset refuses, on the command line ------------------------------------------
def test_reference_preset_refuses_what_the_reference_cannot_run(capsys, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("A few words. " * 50)
    code, _, err = cli(capsys, "run", doc, "--preset", "reference", "--schedule", "imdc", "--growth", "square-sqrt")
    assert code == 2 and err.count("\n") == 1 and "cannot run IMDC with the layer-wise growth" in err
    assert "TypeError" in err
    code, _, err = cli(capsys, "run", doc, "--preset", "reference", "--memory", "3")
    assert code == 2 and err.count("\n") == 1 and "smaller than --sinks 4" in err
    code, _, err = cli(capsys, "run", doc, "--score-rows", "sideways")
    assert code == 2 and err.count("\n") == 1 and "--score-rows" in err


def test_unknown_switch_values_are_refused():
    with pytest.raises(MemstepError, match="gqa grouping must be one of model, strided"):
        Fidelity(gqa_grouping="diagonal")
    with pytest.raises(MemstepError, match="unknown growth rounding"):
        make_schedule("im", 100, 10, 20, "square", rounding="bankers")
    with pytest.raises(MemstepError, match="custom schedule has none"):
        list(ChunkedPrefill(make_tiny_model(), fidelity=Fidelity(score_rows="last-c")).run(
            torch.arange(20), make_schedule("custom", 20, chunk_sizes=[10, 10], memory_sizes=[5, 5])))


# ---- the evaluation's axis -----------------------------------------------------------------------------
def test_eval_grid_takes_the_reference_switches_as_an_axis(tiny_lm):  # noqa: F811
    from memstep.evaluation.grid import Config, make_grid
    from memstep.evaluation.worker import run_case

    configs = make_grid(["imdc"], ["conv"], [48], 64, fidelities=["memstep", "reference", "reference-no-gqa-grouping"])
    assert [c.fidelity for c in configs] == [None, "reference", "reference-no-gqa-grouping"]
    assert "fidelity" not in configs[0].to_dict() and configs[1].label.endswith("[reference]")
    assert all(Config.from_dict(c.to_dict()) == c for c in configs)
    with pytest.raises(MemstepError, match="unknown fidelity variant"):
        make_grid(["imdc"], ["conv"], [48], 64, fidelities=["reference-no-rope"])
    ids = tiny_lm.tokenizer("The magic number for the castle is 81777. " * 12)["input_ids"]
    case = {"document_ids": ids[:-16], "continuation_ids": ids[-16:], "seed": 0, "question": "What is it?",
            "passkey_tokens": [3, 6]}
    settings = {"sinks": 4, "window": 32, "max_new_tokens": 2}
    cell = run_case(tiny_lm, configs[1].to_dict(), settings, case)  # the question in the prompt: two prefills
    assert cell["continuation_nll"] is not None and cell["answer"] is not None
    plain = run_case(tiny_lm, configs[0].to_dict(), settings, case)
    assert plain["continuation_nll"] is not None and plain["continuation_nll"] != cell["continuation_nll"]


def test_the_reference_preset_keeps_no_sinks_in_a_local_window(capsys, tiny_lm_folder):  # noqa: F811
    import json

    from conftest import ASSETS

    code, out, _ = cli(capsys, "run", ASSETS / "pride_and_prejudice_ch1-12.txt", "--model", tiny_lm_folder,
                       "--max-tokens", 300, "--schedule", "local", "--chunk", 100, "--preset", "reference", "--json",
                       "--quiet")
    data = json.loads(out)
    assert code == 0 and data["sinks"] == 0 and all(s["memory_after"] == 0 for s in data["steps"])
