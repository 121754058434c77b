"""Schedules against tables computed by hand from the formulas (RESOURCES.md, schedules.py
docstring), the invariants every schedule keeps, and the IMDC refusal for empty chunks."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from conftest import scan_size

from memstep.errors import MemstepError
from memstep.schedules import (CURVES, GROWTHS, LAYERWISE, custom_schedule, format_table, growth_budgets,
                               layer_growth_budgets, make_schedule)

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
    # square (reference), n = 4, a = floor(512 / 4) = 128: int(i^2 * (512 - 128) / 9 + 128) for
    # i = 0, 1, 2 = 128, int(170.67) = 170, int(298.67) = 298, then M
    (("im", 2048, 512, 512, "square"), ([512, 512, 512, 512], [128, 170, 298, 512])),
    # base 512, floor(mean(128, 170, 298)) = floor(596 / 3) = 198: 512, 710 - 128, 710 - 170, rest
    (("imdc", 2048, 512, 512, "square"), ([512, 582, 540, 414], [128, 170, 298, 512])),
    # the example: 4096 tokens, c = M = 512, n = 8, a = 64: 64, int(448 / 49 + 64) = 73,
    # int(4 * 448 / 49 + 64) = 100, int(9 * 448 / 49 + 64) = 146, ...
    (("im", 4096, 512, 512, "square"), ([512] * 8, [64, 73, 100, 146, 210, 292, 393, 512])),
    # sqrt (reference), n = 4, a = 100: int(sqrt(i) * 300 / sqrt(3) + 100) = 100, int(273.2) = 273,
    # int(344.9) = 344, then M
    (("im", 1000, 250, 400, "sqrt"), ([250, 250, 250, 250], [100, 273, 344, 400])),
    # base 250, floor(mean(100, 273, 344)) = floor(717 / 3) = 239: 250, 489 - 100, 489 - 273, 1000 - 855
    (("imdc", 1000, 250, 400, "sqrt"), ([250, 389, 216, 145], [100, 273, 344, 400])),
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
        return make_schedule(name, tokens, chunk, memory, growth, layers=6)
    except MemstepError as err:
        if name == "fm" and growth in LAYERWISE:
            assert "layer-wise" in str(err)  # FM has no growth curve to make layer-wise
            return None
        assert name == "imdc" and "chunk of" in str(err)  # only IMDC may refuse valid sizes
        return None


@pytest.mark.scan
def test_invariants_over_a_grid_of_settings():
    """Every schedule of the grid (2,100 settings; the suite a seeded 500, MEMSTEP_FULL_SCANS=1 all)."""
    cases = random.Random(0).sample(GRID, scan_size(len(GRID), 500))
    refused = 0
    for name, tokens, chunk, memory, growth in cases:
        schedule = _imdc_possible(name, tokens, chunk, memory, growth)
        if schedule is None:
            refused += name != "fm"
            continue
        chunks, budgets = schedule.chunk_sizes, schedule.memory_sizes
        label = (name, tokens, chunk, memory, growth)
        assert sum(chunks) == tokens, label
        assert all(c >= 1 for c in chunks), label
        assert len(chunks) == len(budgets) == -(-tokens // chunk), label
        assert all(0 <= m <= memory for m in budgets), label
        if schedule.layerwise:  # every layer grows to M; the chunks follow the layer average
            assert all(len(step) == 6 and all(0 <= m <= memory for m in step) for step in schedule.layer_memory_sizes)
            assert schedule.layer_memory_sizes[-1] == (memory,) * 6, label
            assert list(budgets) == [sum(step) // 6 for step in schedule.layer_memory_sizes], label
        assert budgets[-1] == memory, label
        if name in ("fm", "im"):
            assert all(c == chunk for c in chunks[:-1]), label
        if name == "fm":
            assert set(budgets) == {memory}, label
        else:
            assert list(budgets) == sorted(budgets), label  # every growth curve is non-decreasing
            for layer in zip(*(schedule.layer_memory_sizes or [])):
                assert list(layer) == sorted(layer), label
        if name == "imdc" and len(chunks) > 2:
            # memory + chunk stays constant, except the last step (which takes the remainder)
            totals = {budgets[i - 1] + chunks[i] for i in range(1, len(chunks) - 1)}
            assert len(totals) == 1, label
            # the remainder only adds the rounding: floor(L / n) and floor(mean) drop < 2n tokens
            last = budgets[-2] + chunks[-1]
            assert totals.pop() <= last < chunks[1] + budgets[0] + 2 * len(chunks), label
    assert 0 < refused < len(cases) // 3


@pytest.mark.parametrize("growth", CURVES)
def test_growth_budgets_end_at_memory(growth):
    for steps in (1, 2, 7, 40):
        budgets = growth_budgets(1000, steps, growth)
        assert len(budgets) == steps and budgets[-1] == 1000
        assert max(budgets) == 1000


def test_imdc_refuses_empty_chunks_and_names_settings_that_work():
    with pytest.raises(MemstepError) as err:
        make_schedule("imdc", 6000, 500, 1500, "square")
    message = str(err.value)
    # by hand: n = 12, a = 125, m_i = int(i^2 * 1375 / 121 + 125): m_9 = int(1045.45) = 1045, and
    # m_0..m_10 = 125, 136, 170, 227, 306, 409, 534, 681, 852, 1045, 1261 sum to 5746, mean 522,
    # so c_10 = 500 + 522 - 1045 = -23
    assert "step 10" in message and "-23" in message
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


def test_layerwise_budgets_by_hand():
    # double-inverse, 3 layers: layer 0 (the lower half, 3 // 2 = 1 layer) follows inverse-convex,
    # n = 5, M = 300: int(300 / (5 - i)) = 60, 75, 100, 150, 300; layers 1-2 inverse-concave,
    # a = 60: int(360 - 300 / (i + 1)) = 60, 210, 260, 285, then 300
    assert layer_growth_budgets(300, 5, "double-inverse", 3) == [
        [60, 60, 60], [75, 210, 210], [100, 260, 260], [150, 285, 285], [300, 300, 300]]
    # square-sqrt, 4 layers, n = 4, M = 512, a = 128: layers 0-1 square 128, 170, 298, 512;
    # layers 2-3 sqrt int(sqrt(i) * 384 / sqrt(3) + 128) = 128, 349, 441, 512
    assert layer_growth_budgets(512, 4, "square-sqrt", 4) == [
        [128] * 4, [170, 170, 349, 349], [298, 298, 441, 441], [512] * 4]
    # IMDC follows the layer average: floor((60 + 120) / 3) = 60, floor(495 / 3) = 165, floor(620 / 3) = 206,
    # floor(720 / 3) = 240, 300; base 200, mean(60, 165, 206, 240) = floor(167.75) = 167:
    # chunks 200, 367 - 60, 367 - 165, 367 - 206, 1000 - 870
    schedule = make_schedule("imdc", 1000, 200, 300, "double-inverse", layers=3)
    assert schedule.memory_sizes == (60, 165, 206, 240, 300)
    assert schedule.chunk_sizes == (200, 307, 202, 161, 130)
    assert schedule.layer_budgets(1, 3) == [75, 210, 210]
    # each layer's cache: min(budget + 4 sinks, seen); the widest layer for cache_lengths
    assert schedule.layer_cache_lengths(4)[1] == ([64, 64, 64], [79, 214, 214])
    assert schedule.cache_lengths(4)[1] == (64, 214)
    assert schedule.to_dict()["layer_memory_sizes"][1] == [75, 210, 210]


def test_layerwise_growth_needs_layers_and_refuses_fm():
    with pytest.raises(MemstepError, match="number of layers"):
        make_schedule("im", 1000, 200, 300, "square-sqrt")
    with pytest.raises(MemstepError, match="layer-wise.*FM"):
        make_schedule("fm", 1000, 200, 300, "double-inverse", layers=4)
    with pytest.raises(MemstepError, match="made for 3 layers"):
        make_schedule("im", 1000, 200, 300, "double-inverse", layers=3).layer_budgets(0, 30)
