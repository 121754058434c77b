"""Schedules against tables computed by hand from the formulas (RESOURCES.md, schedules.py
docstring), the invariants every schedule keeps, and the IMDC refusal for empty chunks."""

from __future__ import annotations

import itertools
import re

import pytest

from memstep.errors import MemstepError
from memstep.schedules import GROWTHS, custom_schedule, format_table, growth_budgets, make_schedule

# (schedule, tokens, chunk, memory, growth) -> (chunk sizes, memory sizes), worked out by hand:
#   n = ceil(L / c); IM linear m_i = floor(M / n) * (i + 1), last = M; IMDC c_0 = floor(L / n),
#   c_i = floor(L / n) + floor(mean(m_0..m_{n-2})) - m_{i-1}, last chunk = the remainder.
HAND_TABLES = [
    # n = 4; the last chunk is the remainder 1000 - 900
    (("fm", 1000, 300, 200, "linear"), ([300, 300, 300, 100], [200, 200, 200, 200])),
    (("fm", 1024, 256, 128, "linear"), ([256, 256, 256, 256], [128, 128, 128, 128])),
    # floor(200 / 4) = 50 -> 50, 100, 150, then M
    (("im", 1000, 300, 200, "linear"), ([300, 300, 300, 100], [50, 100, 150, 200])),
    # floor(203 / 4) = 50: the last budget jumps to M = 203
    (("im", 1000, 300, 203, "linear"), ([300, 300, 300, 100], [50, 100, 150, 203])),
    # base floor(1000 / 4) = 250, mean(50, 100, 150) = 100: 250, 350 - 50, 350 - 100, 1000 - 800
    (("imdc", 1000, 300, 200, "linear"), ([250, 300, 250, 200], [50, 100, 150, 200])),
    # square, n = 4: floor(512 * ((i + 1) / 4) ** 2) = 32, 128, 288, 512
    (("im", 2048, 512, 512, "square"), ([512, 512, 512, 512], [32, 128, 288, 512])),
    # base 512, floor(mean(32, 128, 288)) = floor(448 / 3) = 149: 512, 661 - 32, 661 - 128, rest
    (("imdc", 2048, 512, 512, "square"), ([512, 629, 533, 374], [32, 128, 288, 512])),
    # sqrt, n = 4: floor(400 * sqrt(0.25, 0.5, 0.75)) = 200, 282, 346, then 400
    (("im", 1000, 250, 400, "sqrt"), ([250, 250, 250, 250], [200, 282, 346, 400])),
    # base 250, mean(200, 282, 346) = 276: 250, 526 - 200, 526 - 282, 1000 - 820
    (("imdc", 1000, 250, 400, "sqrt"), ([250, 326, 244, 180], [200, 282, 346, 400])),
    # inverse-convex, n = 5: floor(300 / (5 - i)) = 60, 75, 100, 150, 300
    (("im", 1000, 200, 300, "inverse-convex"), ([200] * 5, [60, 75, 100, 150, 300])),
    # base 200, floor(mean(60, 75, 100, 150)) = floor(96.25) = 96: 200, 236, 221, 196, 1000 - 853
    (("imdc", 1000, 200, 300, "inverse-convex"), ([200, 236, 221, 196, 147], [60, 75, 100, 150, 300])),
    # inverse-concave, n = 5: floor(300 + 60 - 300 / (i + 1)) = 60, 210, 260, 285, then 300
    (("im", 1000, 200, 300, "inverse-concave"), ([200] * 5, [60, 210, 260, 285, 300])),
    # one step when the chunk covers the document
    (("imdc", 300, 512, 256, "linear"), ([300], [256])),
]


@pytest.mark.parametrize("settings,expected", HAND_TABLES, ids=["-".join(map(str, s)) for s, _ in HAND_TABLES])
def test_schedule_matches_hand_computed_table(settings, expected):
    name, tokens, chunk, memory, growth = settings
    schedule = make_schedule(name, tokens, chunk, memory, growth)
    assert list(schedule.chunk_sizes) == expected[0]
    assert list(schedule.memory_sizes) == expected[1]
    assert schedule.steps == len(expected[0])


def test_full_schedule_is_one_pass_without_eviction():
    schedule = make_schedule("full", 777)
    assert schedule.chunk_sizes == (777,)
    assert schedule.memory_sizes == (777,)
    assert schedule.cache_lengths(4) == [(0, 777)]


def test_chunk_starts_and_cache_lengths_by_hand():
    schedule = make_schedule("imdc", 1000, 300, 200, "linear")  # chunks 250, 300, 250, 200
    assert schedule.chunk_starts == (0, 250, 550, 800)
    # after step i: min(m_i + 4 sinks, tokens seen); before = the previous after
    assert schedule.cache_lengths(4) == [(0, 54), (54, 104), (104, 154), (154, 204)]
    tiny = make_schedule("fm", 10, 3, 5)  # chunks 3, 3, 3, 1; the first step keeps all 3 tokens
    assert tiny.cache_lengths(4) == [(0, 3), (3, 6), (6, 9), (9, 9)]


GRID = list(itertools.product(
    ("fm", "im", "imdc"), (1, 97, 1000, 4096, 10_000), (1, 64, 500, 4096), (0, 4, 300, 512, 2000), GROWTHS))


def _imdc_possible(name, tokens, chunk, memory, growth):
    try:
        return make_schedule(name, tokens, chunk, memory, growth)
    except MemstepError as err:
        assert name == "imdc" and "chunk of" in str(err)  # only IMDC may refuse valid sizes
        return None


def test_invariants_over_a_grid_of_settings():
    refused = 0
    for name, tokens, chunk, memory, growth in GRID:
        schedule = _imdc_possible(name, tokens, chunk, memory, growth)
        if schedule is None:
            refused += 1
            continue
        chunks, budgets = schedule.chunk_sizes, schedule.memory_sizes
        label = (name, tokens, chunk, memory, growth)
        assert sum(chunks) == tokens, label
        assert all(c >= 1 for c in chunks), label
        assert len(chunks) == len(budgets) == -(-tokens // chunk), label
        assert all(0 <= m <= memory for m in budgets), label
        assert budgets[-1] == memory, label
        if name in ("fm", "im"):
            assert all(c == chunk for c in chunks[:-1]), label
        if name == "fm":
            assert set(budgets) == {memory}, label
        else:
            assert list(budgets) == sorted(budgets), label  # every growth curve is non-decreasing
        if name == "imdc" and len(chunks) > 2:
            # memory + chunk stays constant, except the last step (which takes the remainder)
            totals = {budgets[i - 1] + chunks[i] for i in range(1, len(chunks) - 1)}
            assert len(totals) == 1, label
            # the remainder only adds the rounding: floor(L / n) and floor(mean) drop < 2n tokens
            last = budgets[-2] + chunks[-1]
            assert totals.pop() <= last < chunks[1] + budgets[0] + 2 * len(chunks), label
    assert 0 < refused < len(GRID) // 3


@pytest.mark.parametrize("growth", GROWTHS)
def test_growth_budgets_end_at_memory(growth):
    for steps in (1, 2, 7, 40):
        budgets = growth_budgets(1000, steps, growth)
        assert len(budgets) == steps and budgets[-1] == 1000
        assert max(budgets) == 1000


def test_imdc_refuses_empty_chunks_and_names_settings_that_work():
    with pytest.raises(MemstepError) as err:
        make_schedule("imdc", 6000, 500, 1500, "square")
    message = str(err.value)
    # by hand: n = 12, m_9 = floor(1500 * 100 / 144) = 1041, mean(m_0..m_10) = floor(5265 / 11) = 478,
    # so c_10 = 500 + 478 - 1041 = -63
    assert "step 10" in message and "-63" in message
    assert "'im'" in message
    suggested = int(re.search(r"at most (\d+) tokens", message).group(1))
    assert 0 < suggested < 1500
    for memory in (suggested, suggested // 2, 1):
        schedule = make_schedule("imdc", 6000, 500, memory, "square")
        assert min(schedule.chunk_sizes) >= 1 and sum(schedule.chunk_sizes) == 6000
    make_schedule("im", 6000, 500, 1500, "square")  # the alternative the message names works


@pytest.mark.parametrize("args,words", [
    (("fm", 100, 0, 10), "chunk size"),
    (("im", 100, 10, -1), "memory size"),
    (("fm", 0, 10, 10), "at least 1"),
    (("nope", 100, 10, 10), "unknown schedule"),
    (("im", 100, 10, 10, "cubic"), "unknown growth"),
    (("fm", 100, None, 10), "needs a chunk size"),
])
def test_bad_settings_raise_memstep_error(args, words):
    with pytest.raises(MemstepError, match=words):
        make_schedule(*args)


def test_custom_schedule_checks_its_lists():
    schedule = custom_schedule(10, [4, 6], [3, 5])
    assert schedule.chunk_sizes == (4, 6) and schedule.memory_sizes == (3, 5)
    assert make_schedule("custom", 10, chunk_sizes=[4, 6], memory_sizes=[3, 5]) == schedule
    with pytest.raises(MemstepError, match="add up to 9"):
        custom_schedule(10, [4, 5], [3, 5])
    with pytest.raises(MemstepError, match="as many memory sizes"):
        custom_schedule(10, [4, 6], [3])
    with pytest.raises(MemstepError, match="at least 1 token"):
        custom_schedule(10, [10, 0], [3, 3])


def test_to_dict_and_table():
    schedule = make_schedule("imdc", 1000, 300, 200, "linear")
    data = schedule.to_dict()
    assert data["chunk_sizes"] == [250, 300, 250, 200]
    assert data["memory_sizes"] == [50, 100, 150, 200]
    assert data["schedule"] == "imdc" and data["growth"] == "linear" and data["tokens"] == 1000
    assert data["chunk"] == 300 and data["memory"] == 200
    table = format_table(schedule, sinks=4)
    lines = table.splitlines()
    assert len(lines) == 1 + 4 + 1
    # step 2: start 550, chunk 250, budget 150, memory before 104 (100 + 4 sinks) + chunk = 354
    assert lines[3].split() == ["2", "550", "250", "150", "354"]
    assert "peak memory + chunk 354" in lines[-1]  # steps 1..2: 54 + 300 = 104 + 250 = 354


def test_run_settings_checks_name_the_fix():
    from memstep.schedules import check_run_settings

    with pytest.raises(MemstepError, match="at most 100"):
        check_run_settings("imdc", 100, 512, 64, 4)
    with pytest.raises(MemstepError, match="at least 4"):
        check_run_settings("fm", 1000, 64, 2, 4)
    check_run_settings("full", 100, 512, 0, 4)  # full ignores chunk and memory
    check_run_settings("im", 1000, 64, 4, 4)
