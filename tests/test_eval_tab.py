"""The Evaluate tab's pure parts and the evaluation figures, on a hand-made summary."""

from __future__ import annotations

import json
import os
import time

import pytest

from memstep.evaluation import metrics, plots, report

try:
    from test_eval import _cell
except ImportError:  # tests/ imported as a package
    from tests.test_eval import _cell


@pytest.fixture
def summary():
    cells = []
    for length in (1024, 8192):
        for depth in (0.1, 0.5, 0.9):
            cells += [_cell("memstep full", "memstep", length, depth, True, 2.0, 40, 5000 * 2**20),
                      _cell("imdc ca M=512", "memstep", length, depth, depth != 0.5, 2.4, 20, 800 * 2**20,
                            "imdc", 512, "ca"),
                      _cell("kvpress snapkv M=512", "kvpress", length, depth, True, 2.1, 25, 4000 * 2**20,
                            "full", 512, "snapkv"),
                      _cell("hf full cache", "hf", length, depth, True, 2.0, 38, 5100 * 2**20)]
    return metrics.summarize(cells)


def test_heatmap_figure_has_one_panel_per_configuration(summary):
    fig = plots.heatmap_figure(summary)
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    assert len(heatmaps) == 4
    imdc = heatmaps[[a.text.replace("<br>", " ") for a in fig.layout.annotations].index("imdc ca M=512")]
    assert list(imdc.y) == ["10%", "50%", "90%"] and list(imdc.x) == ["1k", "8k"]
    assert [list(row) for row in imdc.z] == [[100, 100], [0, 0], [100, 100]]
    assert sum(1 for t in heatmaps if t.showscale) == 1


def test_tradeoff_figure_marks_peers(summary):
    fig = plots.tradeoff_figure(summary)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"memstep", "kvpress", "HF full cache"}
    assert list(by_name["kvpress"].marker.symbol) == ["diamond"]
    assert list(by_name["HF full cache"].marker.symbol) == ["star"]
    memstep = by_name["memstep"]
    assert list(memstep.text) == ["imdc ca M=512", "memstep full"]
    assert list(memstep.x) == [800, 5000] and list(memstep.y) == [pytest.approx(200 / 3), 100]
    assert memstep.marker.size[1] > memstep.marker.size[0]  # slower = bigger
    assert "8192 tokens" in fig.layout.title.text
    assert "1024 tokens" in plots.tradeoff_figure(summary, 1024).layout.title.text


def test_tradeoff_figure_tells_the_rope_modes_apart():
    cells = [_cell("memstep full", "memstep", 2048, 0.5, True, 2.0, 40, 5000 * 2**20)]
    cells += [_cell(f"fm ca M=128 {rope}", "memstep", 2048, 0.5, True, 2.2, 20, 900 * 2**20, "fm", 128, "ca", rope)
              for rope in ("compact", "document", "shared")]
    memstep = next(t for t in plots.tradeoff_figure(metrics.summarize(cells)).data if t.name == "memstep")
    symbols = dict(zip(memstep.text, memstep.marker.symbol))
    assert symbols == {"memstep full": "circle", "fm ca M=128 compact": "circle",
                       "fm ca M=128 document": "circle-open", "fm ca M=128 shared": "circle-dot"}


def test_intervals_figure_draws_the_intervals(summary):
    fig = plots.intervals_figure(summary)
    accuracy = [t for t in fig.data if t.xaxis == "x"]  # the 1024-token row, left panel
    imdc = next(t for t in accuracy if "imdc ca M=512" in t.y)
    i = list(imdc.y).index("imdc ca M=512")
    # 2/3 answered: 66.7% with the Wilson interval 20.8-93.9% as asymmetric bars
    assert imdc.x[i] == pytest.approx(200 / 3)
    assert imdc.error_x.arrayminus[i] == pytest.approx(200 / 3 - 20.77, abs=0.01)
    assert imdc.error_x.array[i] == pytest.approx(93.85 - 200 / 3, abs=0.01)
    gaps = [t for t in fig.data if t.xaxis == "x2" and "imdc ca M=512" in t.y]
    assert gaps and gaps[0].x[list(gaps[0].y).index("imdc ca M=512")] == pytest.approx(0.4)
    assert {t.marker.color for t in fig.data} == set(plots.KIND_COLORS.values())
    assert "1024 tokens" in fig.layout.annotations[0].text and "8192 tokens" in fig.layout.annotations[2].text
    tradeoff = {t.name: t for t in plots.tradeoff_figure(summary).data}
    assert tradeoff["memstep"].error_y.arrayminus[0] == pytest.approx(200 / 3 - 20.77, abs=0.01)


def test_figures_of_empty_results():
    empty = {"rows": [], "heatmaps": {}}
    assert plots.heatmap_figure(empty).layout.annotations[0].text.startswith("no passkey")
    assert plots.tradeoff_figure(empty).layout.annotations[0].text.startswith("no results")
    assert plots.intervals_figure(empty).layout.annotations[0].text.startswith("no results")


def test_results_are_chosen_by_content_never_by_file_time(tmp_path, summary):
    from ui.tabs import evaluate as eval_tab

    assert eval_tab.chosen_results([tmp_path / "none"]) is None
    assert "No evaluation results" in eval_tab.headline(None)
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, rows in ((first, summary["rows"]), (second, [])):
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({**summary, "rows": rows}))
    # the second folder's summary is newer (a fresh clone writes files in any order): the order decides
    os.utime(first / "summary.json", (time.time() - 600, time.time() - 600))
    folder, found = eval_tab.chosen_results([first, second])
    assert folder == first and eval_tab.lengths(found) == [1024, 8192]
    # a summary in today's form (KL against the full cache) wins over an older form earlier in the order
    fair = tmp_path / "fair"
    fair.mkdir()
    (fair / "summary.json").write_text(json.dumps({**summary, "rows": [{**summary["rows"][0], "kl": 0.1}]}))
    assert eval_tab.chosen_results([first, fair])[0] == fair
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text("{cut")
    assert eval_tab.chosen_results([broken, first])[0] == first  # a cut file is passed over
    rows = eval_tab.table_rows(found)
    assert len(rows[0]) == len(eval_tab.TABLE_HEADERS)
    imdc = next(r for r in rows if r[1] == "imdc ca M=512" and r[0] == 8192)
    # 2/3: Wilson 20.8-93.9%; the kept passkey 100%, 75%, 100%: mean 91.7%, t(2) interval 56-100%
    assert imdc[2:] == ["memstep", "2/3 (67%, 95% CI 21-94%)", "92% (56-100%)", "+0.400 ± 0.000", 20.0, 800.0,
                        pytest.approx(800 - 100 / 2**20, abs=1)]
    assert "4 configurations at 1024, 8192 tokens" in eval_tab.headline((folder, found))


def test_a_summary_from_before_the_intervals_still_shows(summary):
    """results/summary.json written by an older memstep (no counts, intervals, contrasts)."""
    from ui.tabs import evaluate as eval_tab

    new_fields = ("correct", "accuracy_low", "accuracy_high", "nll_gap_low", "nll_gap_high", "nll_gap_cases",
                  "retention_low", "retention_high", "retention_cases", "haystacks")
    old = {**summary, "rows": [{k: v for k, v in r.items() if k not in new_fields} for r in summary["rows"]]}
    old.pop("contrasts")
    rows = eval_tab.table_rows(old)
    imdc = next(r for r in rows if r[1] == "imdc ca M=512" and r[0] == 8192)
    assert imdc[3:6] == ["2/3 (67%, 95% CI 21-94%)", "92%", "+0.400"]
    assert plots.intervals_figure(old).data and "none" in report.contrasts_text(old)


def test_build_tab_inside_blocks(tmp_path, monkeypatch, summary):
    import gradio as gr

    from ui.tabs import evaluate as eval_tab

    (tmp_path / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(eval_tab, "RESULT_FOLDERS", (tmp_path,))
    monkeypatch.delenv("MEMSTEP_RESULTS", raising=False)
    with gr.Blocks() as demo, gr.Tab("Evaluate"):
        parts = eval_tab.build_tab()
    assert set(parts) == {"headline", "takeaway", "status", "heatmaps", "tradeoff", "table", "contrasts", "intervals"}
    assert "Paired differences" in parts["contrasts"].value
    assert "Goal" not in parts["takeaway"].value + parts["status"].value + parts["contrasts"].value
    # the takeaway leads: per length, the full cache and the compressed memories with their intervals
    assert "**8,192 tokens** (3 cases per configuration): the full cache answers 3/3 (100%, 95% CI 44-100%)" \
        in parts["takeaway"].value
    assert parts["table"].headers[3] == "passkey accuracy (95% CI)"


def test_evaluate_figures_fit_a_phone(summary):
    """Built without knowing the screen: legends and the colour bar sit at the figure's foot
    (growing downwards when they wrap), and panel titles come in short lines that fit a
    phone's narrow panels side by side."""
    heatmaps, tradeoff, intervals = (plots.heatmap_figure(summary), plots.tradeoff_figure(summary),
                                     plots.intervals_figure(summary))
    for legend in (tradeoff.layout.legend, intervals.layout.legend,
                   next(t for t in heatmaps.data if t.showscale).colorbar):
        assert (legend.orientation, legend.yref, legend.y, legend.yanchor) == ("h", "container", 0, "bottom")
    for fig in (heatmaps, tradeoff, intervals):
        assert (fig.layout.title.yref, fig.layout.title.y, fig.layout.title.yanchor) == ("container", 1, "top")
    for fig in (heatmaps, intervals):
        lines = [line for a in fig.layout.annotations for line in a.text.split("<br>")]
        assert lines and max(map(len, lines)) <= 16, lines
    ticks = [line for axis in (intervals.layout.yaxis, intervals.layout.yaxis3) for text in axis.ticktext
             for line in text.split("<br>")]
    assert ticks and max(map(len, ticks)) <= 28, ticks  # configuration names on short lines
    assert intervals.layout.yaxis.tickmode == "array" and set(intervals.layout.yaxis.tickvals) <= set(
        r["label"] for r in summary["rows"])
    assert plots._wrap("imdc chunk-attention M=512 compact question-aware", 28) == \
        "imdc chunk-attention M=512<br>compact question-aware"
    # a question pool has no spaces: it breaks before its + suffixes, each line within the width
    assert plots._wrap("fm M=512 pool=follow:15+fade:0.7@256/8+heads@256+last<256", 28) == \
        "fm M=512<br>pool=follow:15<br>+fade:0.7@256/8+heads@256<br>+last<256"
    long = {"heatmaps": {"kvpress streaming-llm M=512": {"lengths": [1024], "depths": [0.5], "accuracy": [[1.0]]}},
            "rows": []}
    assert plots.heatmap_figure(long, labels=["kvpress streaming-llm M=512"]).layout.annotations[0].text == \
        "kvpress<br>streaming-llm<br>M=512"


def test_the_shipped_results_lead_with_the_readme_takeaway_comparison():
    """On a fresh clone (no results/local), the tab shows results/eval and its headline names the
    evaluation the README's takeaway names: memstep's question-aware FM against kvpress ChunkKV,
    with the counts the README states."""
    import re
    from pathlib import Path

    from ui.tabs import evaluate as eval_tab

    folder, found = eval_tab.chosen_results([eval_tab.ROOT / "results" / "eval"])
    sentence = eval_tab.evaluation_headline(found)
    readme = (Path(eval_tab.ROOT) / "README.md").read_text(encoding="utf-8")
    takeaway = readme[readme.index("**Takeaway"):]
    aware = re.search(r"question-aware FM .*?answers (\d+/\d+)", takeaway).group(1)
    press = re.search(r"best kvpress press here, kvpress (\w+) .*?answers (\d+/\d+)", takeaway)
    assert press.group(1) == "chunkkv"
    assert f"question-aware FM answers {aware}" in sentence and f"kvpress ChunkKV" in sentence
    assert f"{press.group(2)}; the paired 95% interval" in sentence and "streaming" not in sentence.lower()
    assert not (eval_tab.ROOT / "results" / "summary.json").exists()  # the legacy grid left the root


def test_headline_says_which_side_an_interval_favours(summary):
    from ui.tabs import evaluate as eval_tab

    assert eval_tab.evaluation_headline(summary) == ""  # no question-aware row, no counted press: no sentence
    aware = {"length": 2048, "label": "fm qa", "counted": 10, "counted_correct": 9, "counted_accuracy": 0.9,
             "config": {"kind": "memstep", "schedule": "fm", "question_aware": True, "budget": 512}}
    press = {"length": 2048, "label": "kvpress snapkv", "counted": 10, "counted_correct": 2, "counted_accuracy": 0.2,
             "kl": 0.1, "config": {"kind": "kvpress", "scorer": "snapkv", "budget": 512}}
    # a press at another budget is no comparison: memstep at M = 512 beside a press at 256 says nothing
    elsewhere = {**press, "config": {**press["config"], "budget": 256}}
    assert eval_tab.evaluation_headline({"rows": [aware, elsewhere], "paired": []}) == ""
    paired = [{"length": 2048, "label": "kvpress snapkv", "accuracy_difference_low": -0.9,
               "accuracy_difference_high": -0.3}]
    sentence = eval_tab.evaluation_headline({"rows": [aware, press], "paired": paired})
    assert sentence.startswith("At 2,048 tokens with a memory of 512 tokens, memstep's question-aware FM answers "
                               "9/10") and "kvpress SnapKV, the press that answers most, 2/10" in sentence
    assert sentence.endswith("(memstep minus SnapKV: +30 to +90 points) favours memstep.")
    paired[0].update(accuracy_difference_low=-0.1, accuracy_difference_high=0.3)  # an interval across 0
    assert eval_tab.evaluation_headline({"rows": [aware, press], "paired": paired}).endswith(
        "(memstep minus SnapKV: -30 to +10 points) does not tell them apart.")
    paired[0].update(accuracy_difference_low=0.1, accuracy_difference_high=0.3)  # the press ahead
    assert eval_tab.evaluation_headline({"rows": [aware, press], "paired": paired}).endswith(
        "(memstep minus SnapKV: -30 to -10 points) favours kvpress SnapKV.")
    # both at two budgets: each budget in turn, the smallest first, each with its own interval; a press
    # named once, and named again where another press answers most
    small = {**aware, "label": "fm qa 128", "counted_correct": 5,
             "config": {**aware["config"], "budget": 128}}
    small_press = {**press, "label": "kvpress snapkv 128", "counted_correct": 8, "counted_accuracy": 0.8,
                   "config": {**press["config"], "budget": 128}}
    paired = [{"length": 2048, "label": "kvpress snapkv 128", "accuracy_difference_low": 0.1,
               "accuracy_difference_high": 0.5},  # the press ahead at 128
              {"length": 2048, "label": "kvpress snapkv", "accuracy_difference_low": -0.2,
               "accuracy_difference_high": 0.1}]  # not told apart at 512
    assert eval_tab.evaluation_headline({"rows": [aware, press, small, small_press], "paired": paired}) == (
        "At 2,048 tokens, of the questions the full cache answers, memstep's question-aware FM answers 5/10 with a "
        "memory of 128 tokens, where kvpress SnapKV, the press that answers most there, answers 8/10 (memstep minus "
        "SnapKV: -50 to -10 points, SnapKV ahead); 9/10 with a memory of 512 tokens, SnapKV 2/10 (-10 to +20 "
        "points, not told apart).")
    chunkkv = {**press, "label": "kvpress chunkkv", "counted_correct": 3, "counted_accuracy": 0.3,
               "config": {**press["config"], "scorer": "chunkkv"}}
    paired.append({"length": 2048, "label": "kvpress chunkkv", "accuracy_difference_low": -0.9,
                   "accuracy_difference_high": -0.2})  # memstep ahead at 512
    assert eval_tab.evaluation_headline({"rows": [aware, press, chunkkv, small, small_press], "paired": paired}) \
        .endswith("9/10 with a memory of 512 tokens, where kvpress ChunkKV, the press that answers most there, "
                  "answers 3/10 (memstep minus ChunkKV: +20 to +90 points, memstep ahead).")


def _write(folder, summary, lengths):
    """A summary.json in ``folder`` holding ``summary``'s rows at ``lengths`` only."""
    folder.mkdir()
    rows = [r for r in summary["rows"] if r["length"] in lengths]
    (folder / "summary.json").write_text(json.dumps({**summary, "rows": rows}))


def test_memstep_results_comes_before_the_shipped_results(tmp_path, monkeypatch, summary):
    """$MEMSTEP_RESULTS (a user's own evaluation) is looked at first: with results in both it and
    the shipped folders, the tab shows the user's; unset, the shipped ones."""
    from ui.tabs import evaluate as eval_tab

    mine, shipped = tmp_path / "mine", tmp_path / "shipped"
    _write(mine, summary, {1024})
    _write(shipped, summary, {8192})
    monkeypatch.setattr(eval_tab, "RESULT_FOLDERS", (shipped,))
    monkeypatch.setenv("MEMSTEP_RESULTS", str(mine))
    assert eval_tab.result_folders() == [mine, shipped]
    shown = eval_tab.show()
    assert shown[7]["choices"] == [1024] and "1024 tokens" in shown[1]  # the lengths and the status: the user's
    monkeypatch.delenv("MEMSTEP_RESULTS")
    assert eval_tab.result_folders() == [shipped] and eval_tab.show()[7]["choices"] == [8192]


def test_the_tradeoff_chart_opens_at_the_longest_length(tmp_path, monkeypatch, summary):
    """With results at several lengths the trade-off chart (and its length box) start at the longest;
    another length is drawn when chosen, and a length the results lack falls back to the longest."""
    from ui.tabs import evaluate as eval_tab

    folder = tmp_path / "results"
    _write(folder, summary, {1024, 8192})
    monkeypatch.setattr(eval_tab, "RESULT_FOLDERS", (folder,))
    monkeypatch.delenv("MEMSTEP_RESULTS", raising=False)
    title = lambda shown: shown[3].layout.title.text  # noqa: E731 - the trade-off chart's title names its length
    first = eval_tab.show()
    assert first[7]["value"] == 8192 and "at 8192 tokens" in title(first)
    assert "at 8192 tokens" in plots.tradeoff_figure(summary).layout.title.text  # the figure's own default too
    assert "at 1024 tokens" in title(eval_tab.show(1024)) and "at 8192 tokens" in title(eval_tab.show(4096))


def test_the_tab_says_which_split_its_results_are_of(tmp_path):
    """The frozen test split is shown before the development grid, and the note says which one is shown."""
    from ui.tabs import evaluate as eval_tab

    folders = [f.name for f in eval_tab.RESULT_FOLDERS]
    assert folders.index("test-split") < folders.index("eval")
    assert eval_tab.split_note({"run": {"split": "test"}}).startswith("**The frozen test split**")
    assert eval_tab.split_note({"run": {"split": "dev"}}).startswith("**The development split**")
    assert eval_tab.split_note({}).startswith("**The development split**")  # results from before the splits


def test_the_headline_names_its_split_first():
    from ui.tabs import evaluate as eval_tab

    aware = {"length": 2048, "label": "fm qa", "counted": 10, "counted_correct": 9, "counted_accuracy": 0.9,
             "config": {"kind": "memstep", "schedule": "fm", "question_aware": True, "budget": 256}}
    press = {"length": 2048, "label": "kvpress chunkkv", "counted": 10, "counted_correct": 8, "counted_accuracy": 0.8,
             "kl": 0.1, "config": {"kind": "kvpress", "scorer": "chunkkv", "budget": 256}}
    for split, first in (("test", "### Frozen test split: at 2,048 tokens"), ("dev", "### Development split: at 2,048")):
        summary = {"rows": [aware, press], "paired": [], "run": {"split": split}}
        assert eval_tab.headline_markdown(summary).startswith(first)


def test_the_trade_off_opens_at_the_length_with_the_most_configurations():
    """A length where only the full cache has run (one point) is not where the trade-off chart opens;
    with as many configurations at each length, the longest."""
    from ui.tabs import evaluate as eval_tab

    def rows(length, n):
        return [{"length": length, "label": f"row {i}", "config": {"kind": "memstep"}} for i in range(n)]

    assert eval_tab.default_length({"rows": rows(2048, 10) + rows(4096, 1)}) == 2048
    assert eval_tab.default_length({"rows": rows(2048, 3) + rows(4096, 3)}) == 4096
    assert eval_tab.default_length({"rows": []}) is None


def test_the_headline_title_groups_the_budgets_by_verdict():
    """The title gives the verdicts alone, budgets with one verdict grouped; nothing where a pair has no
    interval (it would claim what was not measured)."""
    from ui.tabs import evaluate as eval_tab

    def pair(budget, low, high):
        aware = {"length": 2048, "label": f"fm {budget}", "counted": 10, "counted_correct": 5, "counted_accuracy": 0.5,
                 "config": {"kind": "memstep", "schedule": "fm", "question_aware": True, "budget": budget}}
        press = {"length": 2048, "label": f"chunkkv {budget}", "counted": 10, "counted_correct": 6,
                 "counted_accuracy": 0.6, "config": {"kind": "kvpress", "scorer": "chunkkv", "budget": budget}}
        # the store's side: press minus memstep
        return [aware, press], {"length": 2048, "label": f"chunkkv {budget}", "accuracy_difference_low": low,
                                "accuracy_difference_high": high}

    found = [pair(128, 0.02, 0.2), pair(256, -0.12, 0.04), pair(512, -0.07, 0.04), pair(1024, -0.3, -0.1)]
    summary = {"rows": [r for rows, _ in found for r in rows], "paired": [p for _, p in found]}
    assert eval_tab.headline_title(summary) == (
        "2,048 tokens: ChunkKV answers more than memstep at M = 128; memstep and ChunkKV not told apart at "
        "M = 256 and 512; memstep answers more than ChunkKV at M = 1024")
    markdown = eval_tab.headline_markdown({**summary, "run": {"split": "test"}})
    assert markdown.startswith("### Frozen test split, 2,048 tokens: ChunkKV answers more") and "\n\nAt 2,048" in markdown
    assert eval_tab.headline_title({**summary, "paired": summary["paired"][1:]}) == ""


def test_every_press_the_grid_runs_has_a_name_a_reader_knows():
    """The headline names a press by its paper (never by a grid label such as 'kvpress snapkv-max15 M=256')."""
    from memstep.evaluation.grid import PRESS_NAMES, PRESSES

    assert set(PRESSES) <= set(PRESS_NAMES), sorted(set(PRESSES) - set(PRESS_NAMES))
