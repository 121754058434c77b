"""Whole books in the app and the benchmarks: limits, views at 150 steps, the text window, and
the benchmarks' own arithmetic (fits, intervals), on synthetic data and the embedded tokenizer."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memstep.schedules import make_schedule
from tests.test_figures import fake_records
from ui import figures
from ui.runs import MAX_DOCUMENT_TOKENS, MAX_RUN_STEPS, RESERVED_TOKENS, RunSettings, document_limit


@pytest.fixture(scope="module")
def book():
    """A whole novel's schedule (IMDC, c = M = 1024) and records as a recency scorer keeps them."""
    schedule = make_schedule("imdc", 155_873, 1024, 1024, "linear")
    return schedule, fake_records(schedule, layers=2, heads=1)


def test_compact_runs_are_not_cut_at_the_context_and_the_others_are():
    compact = RunSettings("imdc", 1024, 1024)
    assert document_limit(None, 8192, 24, compact) == (MAX_DOCUMENT_TOKENS - 24,
                                                       f"the app's {MAX_DOCUMENT_TOKENS:,}-token document limit")
    assert document_limit(150_000, 8192, 24, compact) == (150_000, "the max tokens setting")
    room = 8192 - 24 - RESERVED_TOKENS
    for other in (RunSettings("imdc", 1024, 1024, rope="document"), RunSettings("full", 1024, 1024),
                  RunSettings("fm", 4096, 4096)):  # document positions, no eviction, sinks + M + c past 8k
        assert document_limit(None, 8192, 24, other) == (room, "the model's 8,192-token context")
    assert document_limit(None, 8192, 24) == (room, "the model's 8,192-token context")  # no settings: as before


def test_a_whole_book_keeps_under_the_step_cap_at_chunk_1024_and_not_at_512(book):
    from memstep.errors import MemstepError
    from ui.runs import check_settings

    schedule, _ = book
    assert schedule.steps == 153 <= MAX_RUN_STEPS
    check_settings(RunSettings("imdc", 1024, 1024), schedule.tokens)
    with pytest.raises(MemstepError, match="limit"):
        check_settings(RunSettings("imdc", 512, 512), schedule.tokens)


def test_per_step_charts_group_steps_beyond_the_bar_limit(book):
    schedule, records = book
    groups = figures.step_groups(len(records), schedule.steps)
    assert len(groups) == math.ceil(153 / 3) <= figures.MAX_BARS and groups[0] == (0, 3) and groups[-1] == (150, 153)
    for fig in (figures.schedule_figure(schedule, 4), figures.memory_figure(records, schedule.steps),
                figures.seconds_figure(records, schedule.steps, cpu=[r.seconds for r in records])):
        for trace in fig.data:
            assert len(trace.x) <= figures.MAX_BARS, (fig.layout.title.text, trace.name)
    seconds = figures.seconds_figure(records, schedule.steps)
    # a bar is the mean of its steps: fake step i takes 0.1 * (i + 1) s, so steps 1-3 average 0.2 s
    assert seconds.data[0].y[0] == pytest.approx(0.2) and seconds.data[0].x[0] == 2.0
    memory = figures.memory_figure(records, schedule.steps)
    highest = max(records[:3], key=lambda r: r.bytes_modeled)  # a bar is its group's highest step, by part
    assert memory.data[0].y[0] == pytest.approx(highest.bytes_modeled_parts["kv_memory"] / 2 ** 20)
    # a short run keeps one bar per step
    short = make_schedule("imdc", 4096, 512, 512)
    assert len(figures.schedule_figure(short, 4).data[0].x) == short.steps


def test_a_streaming_run_keeps_the_same_groups(book):
    schedule, records = book
    partial = figures.seconds_figure(records[:10], schedule.steps)
    assert list(partial.data[0].x) == [2.0, 5.0, 8.0, 10.0]  # steps 1-3, 4-6, 7-9, then 10 alone so far


def test_the_retained_map_samples_rows_and_keeps_the_latest(book):
    schedule, records = book
    rows = figures.map_rows(schedule.steps, latest=100, current=100)
    assert len(rows) <= figures.MAP_ROWS + 2 and 100 in rows and rows[-1] == 152 and rows[0] == 1
    fig = figures.retained_map_figure(records[:101], schedule.tokens, schedule.steps, current=100)
    heat = fig.data[0]
    z = np.asarray(heat.z)
    assert z.shape[0] == len(rows) and z.size <= figures.MAX_CELLS
    assert list(heat.y) == [r + 1 for r in rows]
    assert len(fig.data[1].x) == 2 * len(rows) + 2  # the unread staircase: two points a row
    assert "every second step" in fig.layout.title.text
    # the latest row's fractions are the record's own, binned
    latest = z[rows.index(100)]
    width = math.ceil(schedule.tokens / z.shape[1])
    kept = records[100].kept_fraction()
    assert latest[0] == pytest.approx(np.mean(kept[:width]))
    # a short run draws every step
    short = make_schedule("imdc", 4096, 512, 512)
    assert figures.map_rows(short.steps) == list(range(short.steps))


def test_the_text_view_shows_a_window_of_a_long_document(book):
    from tests.test_figures import word_document
    from ui.views import TEXT_VIEW_TOKENS, RunView, text_view, text_window

    assert text_window(20_000, 0) == (0, TEXT_VIEW_TOKENS)
    assert text_window(20_000, 9_000) == (9_000 - TEXT_VIEW_TOKENS, 9_000)
    assert text_window(20_000, 25_000) == (20_000 - TEXT_VIEW_TOKENS, 20_000)
    assert text_window(3_000, 2_000) == (0, 3_000)
    schedule = make_schedule("imdc", 20_020, 1024, 1024)
    records = fake_records(schedule)
    document = word_document(schedule)
    document.spans = np.asarray(document.spans)
    view = RunView(document, RunSettings("imdc", 1024, 1024), schedule, records=records)
    html = text_view(view, records[9])  # after 10 steps: document tokens read = tokens seen - 20 prompt tokens
    read = records[9].tokens_seen - 20
    assert f"Showing document tokens {read - TEXT_VIEW_TOKENS + 1:,}-{read:,} of 20,000" in html
    assert f">w{read - 1}<" in html.replace("</span>", "<").replace('">', ">") or f"w{read - 1}" in html
    assert f"w{read}" not in html.split("memstep-paper")[1] and "w1 " not in html  # nothing outside the window
    assert len(html) < 100 * TEXT_VIEW_TOKENS  # about 60 characters of markup a word here, shaded one by one
    assert "memstep-needle" not in html  # the passkey (words 100-103) is outside the window


def test_the_whole_novel_example_sets_the_settings_it_needs():
    from ui import handlers
    from ui.documents import EXAMPLE_SETTINGS, WHOLE_BOOK_EXAMPLE

    out = handlers.choose_example(WHOLE_BOOK_EXAMPLE, None)
    source, question, info = out[:3]
    assert "Pride and Prejudice" in source.name and len(source.text) > 600_000 and question
    assert "155,849 tokens" in info
    assert dict(zip(handlers.EXAMPLE_CONTROLS, out[4:])) == EXAMPLE_SETTINGS[WHOLE_BOOK_EXAMPLE]
    figure, note = handlers.preview(source, None, "imdc", "linear", 1024, 1024, 4, None, "compact")
    assert "153 steps over 155,873 tokens" in note and "on this machine (planned)" in note
    # document positions: the model's context cuts it (and says so)
    _, note = handlers.preview(source, None, "imdc", "linear", 1024, 1024, 4, None, "document")
    assert "cut to 8,040 by the model's 8,192-token context" in note


def test_planned_seconds_are_the_planner_flops_at_the_measured_rate(monkeypatch):
    from ui import estimates, timing

    config = timing.preview_config(None)
    schedule = make_schedule("imdc", 32_768, 1024, 1024)
    monkeypatch.setattr(estimates, "matmul_flops_per_second", lambda: 1e11)
    flops = timing.modeled_flops(config, schedule, 4)
    assert timing.planned_seconds(config, schedule, 4) == pytest.approx(flops / (1e11 * estimates.EFFICIENCY))
    assert timing.planned_seconds(config, schedule, 4, device="cuda") is None
    # linear time: twice the tokens, about twice the seconds (IMDC's steps hold a flat memory + chunk)
    double = timing.planned_seconds(config, make_schedule("imdc", 65_536, 1024, 1024), 4)
    assert 1.9 < double / timing.planned_seconds(config, schedule, 4) < 2.1


def test_bench_long_fits_a_slope_and_a_growth_by_hand():
    from benchmarks.bench_long import fits

    rows = [{"schedule": "imdc", "tokens": t, "prefilled": t, "prefill_cpu_seconds": 3.0 * t / 1000,
             "peak_rss": 1000 + t // 1024, "peak_rss_above_model": 100 + t // 1024} for t in (8192, 32768, 131072)]
    rows += [{"schedule": "full", "tokens": t, "prefilled": t, "prefill_cpu_seconds": (t / 1000) ** 2,
              "peak_rss": 2 * t, "peak_rss_above_model": t} for t in (8192, 16384)]
    got = fits(rows)
    assert got["imdc"]["time_slope"] == pytest.approx(1.0)
    assert got["full"]["time_slope"] == pytest.approx(2.0)
    assert got["imdc"]["peak_rss_growth"] == pytest.approx((1000 + 128) / (1000 + 8) - 1)
    assert got["imdc"]["peak_rss_above_model_growth"] == pytest.approx(228 / 108 - 1)
    assert got["full"]["peak_rss_growth"] == pytest.approx(1.0)
    assert got["imdc"]["peak_anonymous_growth"] is None  # rows measured before the split was sampled
    for row, anonymous in zip(rows, (400, 410, 440)):
        row["peak_anonymous_sampled"], row["peak_file_sampled"] = anonymous, 500
    assert fits(rows)["imdc"]["peak_anonymous_growth"] == pytest.approx(440 / 400 - 1)


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux smaps_rollup only")
def test_bench_long_splits_resident_memory_into_anonymous_and_file_backed():
    from benchmarks.bench_long import resident_parts

    # a process of its own that allocates 64 MB of anonymous memory (touched) between two readings:
    # in this process another test's threads could free memory between them (seen once in the suite)
    script = ("import sys; print('ready', flush=True); sys.stdin.readline(); block = bytearray(64 << 20); "
              "print('allocated', flush=True); sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        before = resident_parts(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "allocated"
        after = resident_parts(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=60)
    assert before["file"] > 0 and after["anonymous"] - before["anonymous"] >= 60 << 20
    assert abs(after["file"] - before["file"]) < 8 << 20
    assert resident_parts(2 ** 22 + 7) == {}  # no such process


def test_bench_long_quality_intervals_by_hand():
    from benchmarks.bench_long_quality import block_bootstrap, wilson

    # Wilson 95% for 0/5 and 5/5: [0, 0.4345] and [0.5655, 1]
    assert wilson(0, 5) == pytest.approx((0.0, 0.4345), abs=1e-4)
    assert wilson(5, 5) == pytest.approx((0.5655, 1.0), abs=1e-4)
    assert wilson(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    mean, low, high = block_bootstrap([np.full(64, 2.0), np.full(64, 4.0)])
    assert mean == pytest.approx(3.0) and 2.0 <= low <= mean <= high <= 4.0
    constant = block_bootstrap([np.full(100, 1.5)])
    assert constant == pytest.approx((1.5, 1.5, 1.5))


def test_fast_steps_are_batched_into_fewer_page_updates_and_the_last_shows_them_all(book, monkeypatch):
    from ui import handlers
    from ui.views import RunView
    from tests.test_figures import word_document

    schedule = make_schedule("imdc", 12_020, 512, 512)
    records = fake_records(schedule)

    def stream():
        yield "schedule", schedule
        yield from (("step", r) for r in records)

    def updates():
        return list(handlers._stream_run(stream(), word_document(schedule), RunSettings("imdc", 512, 512), None,
                                         False, 0.0, lambda *a, **k: None, "batch"))

    batched = updates()
    view = next(v for v in batched[-1] if isinstance(v, RunView))
    assert len(view.records) == schedule.steps == 24
    assert len(batched) < schedule.steps // 2  # instant steps: a few updates, not one per step
    assert "24 / 24" in batched[-1][0]
    monkeypatch.setattr(handlers, "UPDATE_SECONDS", 0.0)
    assert len(updates()) == schedule.steps + 1  # batching off: the first update, then one per step


def test_no_full_cache_reference_past_the_models_context():
    from ui.runs import reference_fits

    assert reference_fits(8192 - 128, 8192) and not reference_fits(8192 - 127, 8192)
    assert not reference_fits(155_873, 8192)  # the whole novel: a quadratic 156k prefill, out of range
