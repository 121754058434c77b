"""The app's figures, text highlight and summary numbers are pure functions of schedules
and step records: checked here on synthetic records, without a model or a browser."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

from memstep.memory import ModelShape, step_bytes
from memstep.records import RunResult, StepRecord
from memstep.schedules import make_schedule
from ui import figures
from ui.highlight import highlight_html
from ui.summary import ComparedRun, compare_rows, needle_kept

SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128, params=100_000)
MIB = 1024 ** 2


def fake_records(schedule, sinks=4, layers=2, heads=2, measured=None):
    """Records as the engine would yield them with a recency scorer: the sinks and the most
    recent positions are kept, by every layer and head alike."""
    records, before = [], 0
    for step, ((_, after), start, size, budget) in enumerate(zip(
            schedule.cache_lengths(sinks), schedule.chunk_starts, schedule.chunk_sizes, schedule.memory_sizes)):
        seen = start + size
        recent = after - min(sinks, after)
        kept = np.array(sorted(set(range(min(sinks, seen))) | set(range(seen - recent, seen))))
        parts = step_bytes(SHAPE, before, size, after)
        total = parts.pop("total")
        records.append(StepRecord(
            step=step, steps=schedule.steps, chunk_start=start, chunk_size=size, memory_before=before,
            memory_budget=budget, memory_after=after, seconds=0.1 * (step + 1),
            bytes_measured=None if measured is None else measured + step, bytes_modeled=total,
            bytes_modeled_parts=parts, kv_bytes_actual=0,
            kept_positions=np.broadcast_to(kept, (layers, heads, len(kept))).copy(), evicted=before + size > after))
        before = after
    return records


@pytest.fixture
def imdc():
    return make_schedule("imdc", 2048, 512, 512, "linear")


def test_schedule_figure_draws_the_schedule_math(imdc):
    fig = figures.schedule_figure(imdc, sinks=4)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    lengths = imdc.cache_lengths(4)
    assert list(bars["memory before the step"].y) == [b for b, _ in lengths]
    assert list(bars["chunk"].y) == list(imdc.chunk_sizes)
    kept = next(t for t in fig.data if t.name == "kept after the step")
    assert list(kept.y) == [a for _, a in lengths]
    peak = max(b + c for (b, _), c in zip(lengths, imdc.chunk_sizes))
    assert any(f"peak memory + chunk: {peak:,}" in a.text.replace("<br>", " ") for a in fig.layout.annotations)
    assert all(o == 1.0 for o in bars["chunk"].marker.opacity)  # a preview: nothing faded
    assert not fig.layout.shapes  # and no step highlighted


def test_schedule_figure_fades_steps_not_run_and_highlights_the_current_one(imdc):
    fig = figures.schedule_figure(imdc, sinks=4, done=2, current=1)
    chunk = next(t for t in fig.data if t.name == "chunk")
    assert list(chunk.marker.opacity) == [1.0, 1.0, 0.28, 0.28]
    (shape,) = fig.layout.shapes
    assert (shape.x0, shape.x1) == (1.5, 2.5)  # step 2 (1-based) of the x axis


def test_full_schedule_has_no_budget_line():
    fig = figures.schedule_figure(make_schedule("full", 900), sinks=4)
    assert "budget + sinks" not in [t.name for t in fig.data]
    assert list(next(t for t in fig.data if t.name == "chunk").y) == [900]


def test_retained_matrix_marks_kept_evicted_and_unread_positions(imdc):
    records = fake_records(imdc)
    z, width = figures.retained_matrix(records[:2], imdc.tokens, imdc.steps, max_columns=4096)
    assert width == 1 and z.shape == (4, 2048)
    first_end = imdc.chunk_sizes[0]
    after = records[0].memory_after
    assert np.all(z[0, :4] == 1.0)  # sinks
    assert np.all(z[0, first_end - (after - 4):first_end] == 1.0)  # the most recent positions
    assert np.all(z[0, 4:first_end - (after - 4)] == 0.0)  # read, then evicted
    assert np.all(np.isnan(z[0, first_end:]))  # not read yet
    assert np.all(np.isnan(z[2:]))  # steps not run


def test_retained_matrix_bins_long_documents_to_the_column_limit():
    schedule = make_schedule("fm", 10_000, 2_000, 500)
    records = fake_records(schedule)
    z, width = figures.retained_matrix(records, schedule.tokens, schedule.steps, max_columns=1000)
    assert width == 10 and z.shape == (5, 1000)
    exact, _ = figures.retained_matrix(records, schedule.tokens, schedule.steps, max_columns=10_000)
    np.testing.assert_allclose(z[-1], exact[-1].reshape(1000, 10).mean(axis=1), rtol=1e-6)


def test_retained_map_marks_sinks_passkey_and_current_chunk(imdc):
    records = fake_records(imdc)
    fig = figures.retained_map_figure(records[:3], imdc.tokens, imdc.steps, prefix_tokens=20, sinks=4,
                                      needle=(700, 712), current=2)
    assert fig.data[0].type == "heatmap" and np.asarray(fig.data[0].z).shape == (4, 1024)  # 2 tokens a column
    labels = [a.text for a in fig.layout.annotations]
    assert "sinks" in labels and "passkey" in labels
    outline = [s for s in fig.layout.shapes if s.type == "rect" and s.yref in (None, "y")]
    assert (outline[0].x0, outline[0].x1) == (records[2].chunk_start - 0.5, records[2].tokens_seen - 0.5)
    plain = figures.retained_map_figure(records, imdc.tokens, imdc.steps, sinks=0)
    assert not [a for a in plain.layout.annotations if a.text in ("sinks", "passkey")]


def test_memory_figure_stacks_modeled_parts_without_weights_and_says_measured_is_missing(imdc):
    records = fake_records(imdc)
    fig = figures.memory_figure(records, imdc.steps)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert "weights" not in bars and len(bars) == 4
    assert list(bars["KV memory"].y) == pytest.approx([r.bytes_modeled_parts["kv_memory"] / MIB for r in records])
    assert not [t for t in fig.data if t.type == "scatter"]
    assert "n/a" in fig.layout.xaxis.title.text
    assert "weights" in fig.layout.yaxis.title.text


def test_memory_figure_draws_the_measured_peak_when_the_device_has_one(imdc):
    records = fake_records(imdc, measured=50 * MIB)
    weights = records[0].bytes_modeled_parts["weights"]
    (line,) = [t for t in figures.memory_figure(records, imdc.steps).data if t.type == "scatter"]
    assert list(line.y) == pytest.approx([(50 * MIB + i - weights) / MIB for i in range(4)])
    with_weights = figures.memory_figure(records, imdc.steps, include_weights=True)
    assert "weights" in [t.name for t in with_weights.data]


def test_seconds_figure_and_placeholders(imdc):
    records = fake_records(imdc)
    fig = figures.seconds_figure(records, imdc.steps)
    assert list(fig.data[0].y) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert "1.0 s wall" in fig.layout.title.text and len(fig.data) == 1
    with_cpu = figures.seconds_figure(records, imdc.steps, cpu=[0.2] * 4, note="shared machine: load 5.0 on 2 cores")
    assert "0.8 s CPU" in with_cpu.layout.title.text and list(with_cpu.data[1].y) == [0.2] * 4
    assert "load 5.0 on 2 cores" in with_cpu.layout.xaxis.title.text
    empty = figures.seconds_figure([], 4)
    assert not empty.data and "Run" in empty.layout.annotations[0].text


def test_compare_figures_overlay_each_run_along_the_document(imdc):
    fm = make_schedule("fm", 2048, 512, 512)
    runs = [("FM", fake_records(fm)), ("IMDC", fake_records(imdc))]
    sizes = figures.compare_sizes_figure(runs)
    held = next(t for t in sizes.data if t.name == "IMDC: memory + chunk")
    assert list(held.x) == [x for s, c in zip(imdc.chunk_starts, imdc.chunk_sizes) for x in (s, s + c)]
    assert len(sizes.data) == 4
    memory = figures.compare_memory_figure(runs)
    assert [t.name for t in memory.data] == ["FM: modeled", "IMDC: modeled"]
    assert figures.compare_sizes_figure([("FM", [])]).layout.annotations  # placeholder


def test_highlight_shades_tokens_escapes_html_and_outlines_the_needle():
    text = "A <b> tag & a secret 12345 here."
    spans = [(0, 1), (1, 5), (5, 9), (9, 11), (11, 20), (20, 26), (26, 27), (27, 32)]
    fractions = [1.0, 0.0, 0.0, 0.5, 0.5, 1.0, 1.0, float("nan")]
    out = highlight_html(text, spans, fractions, needle_chars=(21, 26))
    body = out.split('overflow-y:auto')[1]
    assert "<b>" not in body and "&lt;b&gt;" in body
    assert html.unescape(re.sub(r"<[^>]+>", "", body.split(">", 1)[1])) == text[:32]
    needle = re.search(r'<span id="memstep-needle" data-mark="needle" style="outline:2px solid #dc2626[^"]*">(.*?</span>)</span>',
                       body)
    assert needle and html.unescape(re.sub(r"<[^>]+>", "", needle.group(1))) == " 12345"  # one outlined piece
    assert body.count('id="memstep-needle"') == 1 and 'href="#memstep-needle"' in out
    assert "color:#6b7280;font-style:italic" in body  # the unread token (AA contrast)
    with pytest.raises(ValueError):
        highlight_html(text, spans, fractions[:-1])


def _compared(label, schedule_name, records, answer, passkey="12345", needle=(100, 104), cpu=None, flops=None):
    result = RunResult(model="m", tokens=2048, prefix_tokens=0, schedule={}, scorer="s", sinks=4, device="cpu",
                       dtype="float32", steps=records, answer=answer)
    return ComparedRun(label, schedule_name, records, len(records), result, passkey, needle, cpu, flops)


def test_compare_rows_give_ratios_against_fm_and_the_passkey_verdict(imdc):
    fm = fake_records(make_schedule("fm", 2048, 512, 512))
    im = fake_records(imdc)
    rows = compare_rows([_compared("FM", "fm", fm, "It is 12345."), _compared("IMDC", "imdc", im, "It is 1234.")])
    assert rows[0][4] == "1.00×" and rows[0][9] == "1.00×" and rows[0][-1] == "✓ yes"
    assert rows[0][3] == "—" and rows[0][5] == "—"  # no CPU seconds measured, no FLOPs modeled
    fm_memory = max(r.bytes_modeled for r in fm) - fm[0].bytes_modeled_parts["weights"]
    im_memory = max(r.bytes_modeled for r in im) - im[0].bytes_modeled_parts["weights"]
    assert rows[1][9] == f"{im_memory / fm_memory:.2f}×"
    assert rows[1][-1] == "✗ no"
    assert rows[1][11] == "0%"  # the recency records evicted position 100
    no_fm = compare_rows([_compared("IMDC", "imdc", im, "x")])
    assert no_fm[0][4] == "—"


def test_compare_time_ratios_divide_cpu_seconds_and_modeled_flops(imdc):
    """Wall seconds of runs taken at different moments on a shared CPU are not a speed result:
    the ratio divides each configuration's own CPU seconds, and the FLOP ratio the planner's count."""
    fm = fake_records(make_schedule("fm", 2048, 512, 512))
    im = fake_records(imdc)
    for record in im:  # a burst of other jobs made IMDC's wall seconds ten times longer
        record.seconds *= 10
    runs = [_compared("FM", "fm", fm, "x", cpu=[1.0] * len(fm), flops=400),
            _compared("IMDC", "imdc", im, "x", cpu=[0.9] * len(im), flops=300)]
    rows = compare_rows(runs)
    assert rows[1][3] == f"{0.9 * len(im):.2f}" and rows[1][4] == f"{0.9 * len(im) / len(fm):.2f}×"
    assert rows[1][5] == "0.75×"
    from ui.summary import compare_headers
    assert compare_headers(True)[4] == "× FM CPU time" and compare_headers(False)[4] == "× FM wall time"


def test_needle_kept_is_the_mean_fraction_over_the_needle_tokens(imdc):
    last = fake_records(imdc)[-1]
    assert needle_kept(last, (0, 4)) == 1.0
    assert needle_kept(last, (2040, 2048)) == 1.0
    assert needle_kept(last, None) is None
    assert needle_kept(fake_records(imdc)[0], (2040, 2048)) is None  # not read yet


def test_runs_with_many_steps_get_fewer_columns():
    assert figures.bin_width(4000, steps=8) == 2  # 2,000 columns
    assert figures.bin_width(4000, steps=400) == 4  # 1,000 columns: 400 x 1,000 cells
    assert figures.bin_width(100, steps=400) == 1


def test_compact_records_keep_their_kept_fraction(imdc):
    from ui.views import compact

    record = fake_records(imdc)[-1]
    small = compact(record)
    assert small.kept_positions.dtype == np.uint16
    np.testing.assert_array_equal(small.kept_fraction(), record.kept_fraction())


def word_document(schedule, prefix=20):
    """A prepared document of one word per token, the passkey in words 100-103."""
    from ui.documents import DocumentSource
    from ui.runs import PreparedDocument

    words = [f"w{i}" for i in range(schedule.tokens - prefix)]
    spans, at = [], 0
    for word in words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    source = DocumentSource("doc", " ".join(words), "q?", "123", (spans[100][0], spans[103][1]))
    return PreparedDocument(source, list(range(len(words))), spans, prefix, (100, 104))


def test_a_run_view_renders_any_step_for_replay(imdc):
    from ui.runs import RunSettings
    from ui.views import RunView, render, stats_html

    document = word_document(imdc)
    view = RunView(document, RunSettings("imdc", 512, 512), imdc, records=fake_records(imdc))

    shown = render(view, 1)  # after the second step
    z = np.asarray(shown.retained.data[0].z)
    assert not np.isnan(z[1]).all() and np.isnan(z[2:]).all()
    assert list(shown.sizes.data[1].marker.opacity) == [1.0, 1.0, 0.28, 0.28]
    assert "color:#6b7280;font-style:italic" in shown.text  # the words not read yet are grey
    assert 'data-stat="steps"' in stats_html(view, 1) and "2 / 4" in stats_html(view, 1)
    assert "passkey in memory" in stats_html(view)  # the needle was read by the last step
    assert "4 / 4" in stats_html(view) and 'data-progress="1.000"' in stats_html(view)


def test_stop_ends_the_run_on_its_own_last_update(imdc, monkeypatch):
    """Stop marks the session; the run's stream then sends one last update (the steps so
    far, stopped) and reads no further. Only a session whose run streams keeps its Stop."""
    from types import SimpleNamespace

    from ui import handlers
    from ui.runs import RunSettings
    from ui.views import RunView

    pulled = []

    def stream():
        yield "schedule", imdc
        for record in fake_records(imdc):
            pulled.append(record.step)
            yield "step", record

    def run(session):
        return handlers._stream_run(stream(), word_document(imdc), RunSettings("imdc", 512, 512), None, False, 0.0,
                                    lambda *args, **kwargs: None, session)

    monkeypatch.setattr(handlers, "_STOP_REQUESTS", set())
    monkeypatch.setattr(handlers, "UPDATE_SECONDS", 0.0)  # one update per step (fast fake steps are batched)
    monkeypatch.setattr(handlers, "_RUNNING", {"s1", "s2", "s3"})  # run_document marks them while they stream
    handlers.stop_run(SimpleNamespace(session_hash="idle"))  # a Stop with no run: not stored
    assert "idle" not in handlers._STOP_REQUESTS
    updates = run("s1")
    view = next(v for v in next(updates) if isinstance(v, RunView))
    next(updates)  # the first step is shown
    handlers.stop_run(SimpleNamespace(session_hash="s2"))  # another running session's Stop: not this run's
    next(updates)
    assert len(view.records) == 2 and not view.stopped
    handlers.stop_run(SimpleNamespace(session_hash="s1"))
    last = next(updates)
    stats = last[0]
    # the step the Stop waited for (it had run) counts: stopped after step 3, and nothing read after it
    assert view.stopped and 'data-stat="state"' in stats and "stopped" in stats and "3 / 4" in stats
    assert "Stopped" in last[6]  # the answer box says so
    with pytest.raises(StopIteration):
        next(updates)
    assert len(view.records) == 3 and pulled == [0, 1, 2]  # the stream was not read any further
    assert "s1" not in handlers._STOP_REQUESTS
    # Stop pressed while the model loads: the first update is already the last
    handlers.stop_run(SimpleNamespace(session_hash="s3"))
    updates = run("s3")
    first = next(updates)
    assert "stopped" in first[0] and "0 / 4" in first[0]
    with pytest.raises(StopIteration):
        next(updates)


def test_layer_memory_figure_draws_each_layers_entries_and_budget():
    record = StepRecord(step=1, steps=4, chunk_start=100, chunk_size=100, memory_before=64, memory_budget=150,
                        memory_after=214, seconds=0.1, bytes_measured=None, bytes_modeled=1, bytes_modeled_parts={},
                        kv_bytes_actual=0, kept_positions=np.zeros((3, 2, 214), dtype=int), evicted=True,
                        layer_memory_after=[79, 214, 214], layer_budgets=[75, 210, 210])
    fig = figures.layer_memory_figure(record, sinks=4)
    bars, budgets = fig.data
    assert list(bars.x) == [1, 2, 3] and list(bars.y) == [79, 214, 214]
    assert list(budgets.y) == [79, 214, 214]  # budget + 4 sinks
    assert "after step 2" in fig.layout.title.text
    assert figures.layer_memory_figure(None, 4).layout.annotations  # placeholder before a step


def _at_the_foot(legend) -> bool:
    """A horizontal legend anchored at the bottom edge of the whole figure: wrapping to more
    rows (a phone) grows it downwards into the margin, never up into the title band."""
    return (legend.orientation == "h" and legend.yref == "container" and legend.y == 0
            and legend.yanchor == "bottom" and legend.xref == "container")


def test_legends_sit_at_the_foot_and_titles_fit_a_phone(imdc):
    records = fake_records(imdc, measured=100 * MIB)
    charts = [figures.schedule_figure(imdc, sinks=4, done=imdc.steps),
              figures.retained_map_figure(records, imdc.tokens, imdc.steps),
              figures.memory_figure(records, imdc.steps), figures.seconds_figure(records, imdc.steps),
              figures.placeholder_figure("run to see", "Memory per step"),
              figures.compare_sizes_figure([("FM c512 M512", records), ("IMDC c512 M512", records)])]
    for fig in charts:
        assert _at_the_foot(fig.layout.legend), fig.layout.title.text
        title = fig.layout.title
        assert (title.yref, title.y, title.yanchor, title.xref, title.x) == ("container", 1, "top", "container", 0)
        # 14 px text: about 40 characters fit a 390 px phone's chart
        assert max(len(line) for line in title.text.split("<br>")) <= 40, title.text
    # the charts with a legend get room for it to wrap on a phone
    assert charts[0].layout.height == 320 + figures.LEGEND_ROOM and charts[2].layout.height == 300 + figures.LEGEND_ROOM
    assert any(t.showlegend is not False for t in charts[0].data)


def test_a_long_title_is_broken_into_lines_a_phone_can_show():
    assert figures._two_lines("Retained tokens: what memory holds after each step", 40) == \
        "Retained tokens:<br>what memory holds after each step"
    assert figures._two_lines("short", 40) == "short"
