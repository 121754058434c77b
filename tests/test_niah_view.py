"""The needle test's heatmap: maps from finished cells (hand-counted), one panel per configuration,
and the Evaluate tab's section finding the results by their content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memstep.evaluation.niah_view import niah_figure, niah_maps

ROOT = Path(__file__).resolve().parent.parent


def cells():
    out = []
    for label, recalls in (("memstep full", {(0.0, 2048): [1.0], (0.5, 2048): [1.0], (0.0, 4096): [0.5]}),
                           ("fm M=256", {(0.0, 2048): [0.0], (0.5, 2048): [1.0], (0.0, 4096): [1.0]})):
        for (depth, length), values in recalls.items():
            out += [{"label": label, "kind": "niah", "depth": depth, "length": length, "recall": v} for v in values]
    out.append({"label": "fm M=256", "kind": "passkey", "depth": 0.5, "length": 2048, "correct": True})  # not niah
    out.append({"label": "fm M=256", "kind": "niah-multi", "depth": 0.5, "length": 2048, "recall": 2 / 3})
    return out


def test_maps_hand_counted():
    maps = niah_maps(cells())
    assert set(maps) == {"niah", "niah-multi"}
    full = maps["niah"]["memstep full"]
    assert full["depths"] == [0.0, 0.5] and full["lengths"] == [2048, 4096]
    assert full["score"] == [[1.0, 0.5], [1.0, None]]
    assert full["cases"] == [[1, 1], [1, 0]]
    assert maps["niah"]["fm M=256"]["score"] == [[0.0, 1.0], [1.0, None]]
    assert maps["niah-multi"]["fm M=256"]["score"] == [[2 / 3]]


def test_every_panel_has_the_same_depth_rows():
    """The panels share their depth axis: a configuration run at late depths only (8,192 tokens, 60-100%)
    gets the other panels' rows too, empty, so its values sit on their own depths, text included."""
    rows = [{"label": "full", "kind": "niah", "depth": d, "length": 2048, "recall": 1.0} for d in (0.0, 0.5, 1.0)]
    rows += [{"label": "late", "kind": "niah", "depth": d, "length": 8192, "recall": r} for d, r in ((0.6, 0.0), (1.0, 1.0))]
    maps = niah_maps(rows)["niah"]
    assert maps["late"]["depths"] == maps["full"]["depths"] == [0.0, 0.5, 0.6, 1.0]
    assert maps["late"]["score"] == [[None], [None], [0.0], [1.0]] and maps["late"]["cases"] == [[0], [0], [1], [1]]
    figure = niah_figure({"niah": maps})
    late = figure.data[1]
    assert list(late.y) == ["0%", "50%", "60%", "100%"] and [row[0] for row in late.text] == ["", "", "0", "100"]


def test_depths_draw_to_the_nearest_tenth():
    """A fine grid of depths (memstep eval --depths 0,2,4,...) draws as the harness's rows of tenths,
    each the mean of its cases: 2% and 4% fall in the 0% row, 6% and 14% in the 10% row, 95% in 100%."""
    rows = [{"label": "fm", "kind": "niah", "depth": d, "length": 2048, "recall": r}
            for d, r in ((0.02, 1.0), (0.04, 0.0), (0.06, 1.0), (0.14, 0.5), (0.95, 1.0))]
    found = niah_maps(rows)["niah"]["fm"]
    assert found["depths"] == [0.0, 0.1, 1.0]
    assert found["score"] == [[0.5], [0.75], [1.0]] and found["cases"] == [[2], [2], [1]]


def test_panels_open_on_the_full_cache_memsteps_default_and_the_presses():
    """The eye goes to the first panels: the full cache, memstep at its defaults, the presses; the
    ablations (an earlier pool, spans, IMDC) after them, whatever order the cells ran in."""
    def cell(label, **config):
        return {"label": label, "kind": "niah", "depth": 0.5, "length": 2048, "recall": 1.0, "config": config}

    cells = [cell("fm pool=max:15", kind="memstep", schedule="fm", question_pool="max:15"),
             cell("imdc", kind="memstep", schedule="imdc"), cell("chunkkv", kind="kvpress", schedule="full"),
             cell("fm", kind="memstep", schedule="fm"), cell("full", kind="memstep", schedule="full"),
             cell("fm span", kind="memstep", schedule="fm", span="fixed20-mean-layer")]
    assert list(niah_maps(cells)["niah"]) == ["full", "fm", "chunkkv", "fm pool=max:15", "imdc", "fm span"]
    # several budgets: memstep's defaults by budget, then each press's budgets side by side
    cells = [cell("chunkkv M=512", kind="kvpress", schedule="full", budget=512),
             cell("fm M=512", kind="memstep", schedule="fm", budget=512),
             cell("snapkv M=128", kind="kvpress", schedule="full", budget=128),
             cell("fm M=128", kind="memstep", schedule="fm", budget=128),
             cell("chunkkv M=128", kind="kvpress", schedule="full", budget=128),
             cell("fm M=256 span", kind="memstep", schedule="fm", budget=256, span="fixed1-max-any"),
             cell("fm M=512 document", kind="memstep", schedule="fm", budget=512, rope="document")]
    assert list(niah_maps(cells)["niah"]) == ["fm M=128", "fm M=512", "chunkkv M=128", "chunkkv M=512", "snapkv M=128",
                                              "fm M=256 span", "fm M=512 document"]


def test_one_panel_per_configuration():
    fig = niah_figure(niah_maps(cells()), "niah")
    assert [t.type for t in fig.data] == ["heatmap", "heatmap"]
    assert fig.data[1].z[0] == (0, 100) or list(fig.data[1].z[0]) == [0, 100]
    assert "no needle-test results" in niah_figure({}, "niah").layout.annotations[0].text


def test_tab_section_reads_the_first_folder_with_needle_results(tmp_path):
    from ui.niah_view import niah_results, niah_view

    plain, niah = tmp_path / "plain", tmp_path / "niah"
    plain.mkdir()
    niah.mkdir()
    (plain / "summary.json").write_text(json.dumps({"rows": []}))
    (niah / "summary.json").write_text(json.dumps({"rows": [], "niah": niah_maps(cells())}))
    folder, maps = niah_results([tmp_path / "missing", plain, niah])
    assert folder == niah and "fm M=256" in maps["niah"]
    note, single, multi = niah_view((folder, maps))
    assert "Dolores Park" in note and len(single.data) == 2 and len(multi.data) == 1
    assert niah_results([plain]) is None


def test_the_multi_needle_variant_from_a_folder_of_its_own(tmp_path):
    """The multi-needle variant runs into its own folder (one test per folder): the section draws
    the single needle from one folder and the variant from the other, and says where each is from."""
    from ui.niah_view import niah_results, niah_view

    single, multi = tmp_path / "niah", tmp_path / "niah-multi"
    for folder, kind in ((single, "niah"), (multi, "niah-multi")):
        folder.mkdir()
        maps = niah_maps([c for c in cells() if c["kind"] == kind])
        (folder / "summary.json").write_text(json.dumps({"rows": [], "niah": maps}))
    assert niah_results([multi, single])[0] == single  # the first with single-needle maps
    note, one, three = niah_view(niah_results([single]), niah_results([single, multi], kind="niah-multi"))
    assert "From `niah`" in note and "Multi-needle from `niah-multi`" in note
    assert len(one.data) == 2 and len(three.data) == 1


def test_the_note_states_memsteps_standing_against_each_press(tmp_path):
    """The section's note carries the README's table (one row per length and budget, from the
    folder's summary): memstep's anchor row, each press counted, and memstep minus the press (the
    paired entry holds the press minus memstep); rows of other tests and ablations stay out."""
    from ui.niah_view import niah_view

    def row(label, kind, correct, counted, **config):
        return {"label": label, "length": 2048, "kinds": ["niah"], "counted": counted, "counted_correct": correct,
                "config": {"kind": kind, "budget": 256, **config}}

    anchor = {**row("fm qa", "memstep", 45, 47, schedule="fm", question_aware=True), "anchor": True, "retention": 0.456}
    summary = {"rows": [anchor, row("fm qa pool=max:15", "memstep", 8, 50, schedule="fm", question_aware=True),
                        {**row("kvpress chunkkv", "kvpress", 41, 50, scorer="chunkkv"), "retention": 0.39},
                        row("kvpress snapkv", "kvpress", 1, 23, scorer="snapkv"),
                        {**row("passkey fm", "memstep", 3, 4, schedule="fm"), "kinds": ["passkey"]}],
               "paired": [{"label": "kvpress chunkkv", "length": 2048, "accuracy_difference": -0.15,
                           "accuracy_difference_low": -0.29, "accuracy_difference_high": -0.02}],
               "niah": niah_maps([c for c in cells() if c["kind"] == "niah"])}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    note = niah_view((tmp_path, summary["niah"]), ())[0]
    assert "| 2,048 | 256 | 45/47 · 0.46 | 41/50 · 0.39 | 1/23 | leads ChunkKV (+15, +2 to +29) |" in note
    assert "8/50" not in note and "3/4" not in note
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "paired": []}))
    assert "| 2,048 | 256 | 45/47 · 0.46 | 41/50 · 0.39 | 1/23 | no press paired here |" in niah_view(
        (tmp_path, summary["niah"]), ())[0]


def test_the_readme_table_puts_each_press_in_its_column_with_memsteps_verdict():
    """The README's needle table (from the same standings as the tab): a column per press that ran
    anywhere, blank where it did not run, and the verdict from memstep's side with its interval."""
    from memstep.evaluation.niah_standing import needle_headline, standing_table, standings

    def row(label, kind, length, budget, correct, counted, retention, **config):
        return {"label": label, "length": length, "kinds": ["niah"], "counted": counted, "counted_correct": correct,
                "retention": retention, "config": {"kind": kind, "budget": budget, **config}}

    summary = {"rows": [{**row("fm 256", "memstep", 2048, 256, 49, 50, 0.456, question_aware=True), "anchor": True},
                        row("snapkv-max15 256", "kvpress", 2048, 256, 46, 50, 0.27, scorer="snapkv-max15"),
                        row("chunkkv 256", "kvpress", 2048, 256, 41, 50, 0.391, scorer="chunkkv"),
                        {**row("fm 128", "memstep", 4096, 128, 14, 28, None, question_aware=True), "anchor": True},
                        row("chunkkv 128", "kvpress", 4096, 128, 5, 28, 0.09, scorer="chunkkv")],
               "paired": [{"label": "chunkkv 256", "length": 2048, "accuracy_difference": -0.16,
                           "accuracy_difference_low": -0.29, "accuracy_difference_high": -0.05},
                          {"label": "snapkv-max15 256", "length": 2048, "accuracy_difference": -0.06,
                           "accuracy_difference_low": -0.17, "accuracy_difference_high": 0.03},
                          {"label": "chunkkv 128", "length": 4096, "accuracy_difference": 0.1,
                           "accuracy_difference_low": 0.02, "accuracy_difference_high": 0.2}]}
    assert [(s.length, s.budget, [v.verdict for v in s.versus]) for s in standings(summary)] == [
        (2048, 256, ["leads", "ties"]), (4096, 128, ["loses"])]
    assert standing_table(standings(summary)).splitlines() == [
        "| tokens | M | memstep | ChunkKV | SnapKV, max-pool 15 | memstep against each press (points, 95% CI) |",
        "|---:|---:|---:|---:|---:|---|",
        "| 2,048 | 256 | 49/50 · 0.46 | 41/50 · 0.39 | 46/50 · 0.27 | leads ChunkKV (+16, +5 to +29); "
        "ties SnapKV, max-pool 15 (+6, -3 to +17) |",
        "| 4,096 | 128 | 14/28 | 5/28 · 0.09 |  | loses ChunkKV (-10, -20 to -2) |"]

    # the sentence over all rows: per press, how many rows each verdict; the leads keep more here
    assert needle_headline(standings(summary)) == (
        "On the public needle test (2 rows: 2,048 to 4,096 tokens, M = 128 to 256; paired 95% intervals), memstep's "
        "question-aware FM leads ChunkKV on 1 of 2 rows, ties it on none and loses to it on 1; leads SnapKV, "
        "max-pool 15 on 0 of 1 row, ties it on 1 and loses to it on none. Wherever it leads, it keeps more of "
        "the answer's entries than the press.")
    summary["rows"][2]["retention"] = 0.5  # ChunkKV now keeps more where memstep leads it
    assert needle_headline(standings(summary)).endswith(
        "Where it leads, it keeps more of the answer than the press on 0 of 1 rows. It keeps less of the "
        "answer than ChunkKV at 2,048 tokens, M = 256.")
    # where it keeps less is said whatever the answers' verdict, per press, rows in order
    summary["rows"][0]["retention"] = 0.2  # below both presses at 2,048 tokens; ties SnapKV there
    summary["rows"][3]["retention"] = 0.05  # below ChunkKV's 0.09 at 4,096 tokens, where it loses
    assert needle_headline(standings(summary)).endswith(
        "It keeps less of the answer than ChunkKV at 2,048 tokens, M = 256 and 4,096 tokens, M = 128; "
        "than SnapKV, max-pool 15 at 2,048 tokens, M = 256.")
    assert needle_headline(standings({})) == ""


def test_eval_docs_writes_the_needle_table_between_its_markers_and_nothing_else(tmp_path):
    """`make eval-docs` fills the README's needle block from the folder's summary and keeps the text
    around it; a folder without needle rows stops it with one line, the README untouched."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("eval_docs_niah", ROOT / "benchmarks" / "eval_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    anchor = {"label": "fm", "length": 2048, "kinds": ["niah"], "counted": 4, "counted_correct": 3, "anchor": True,
              "config": {"kind": "memstep", "budget": 256, "question_aware": True}}
    (tmp_path / "niah").mkdir()
    (tmp_path / "niah" / "summary.json").write_text(json.dumps({"rows": [anchor], "paired": []}))
    (tmp_path / "empty").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{docs.NIAH_START}\nold\n{docs.NIAH_END}\nafter\n")
    docs.replace_block(readme, docs.niah_block(tmp_path / "niah"), docs.NIAH_START, docs.NIAH_END)
    text = readme.read_text()
    assert text.startswith(f"before\n{docs.NIAH_START}\n") and text.endswith(f"{docs.NIAH_END}\nafter\n")
    assert "| 2,048 | 256 | 3/4 | no press paired here |" in text and "old" not in text
    with pytest.raises(SystemExit, match="no needle-test rows"):
        docs.niah_block(tmp_path / "empty")
    assert readme.read_text() == text


def test_the_fidelity_table_turns_each_pair_to_memsteps_side_and_says_closer_only_beyond_the_interval(tmp_path):
    """Beyond the needle: KL and top-1 per row (from --metrics kl), memstep minus each press with its t
    interval (the paired entries hold the press minus memstep), the verdict on KL alone; rows without KL
    (a needle folder run without it) make no row, and eval_docs refuses such a folder in one line."""
    from memstep.evaluation.niah_standing import fidelities, fidelity_headline, fidelity_table

    def row(label, kind, length, budget, kl, top1, cases=12, **config):
        return {"label": label, "length": length, "kinds": ["niah"], "kl": kl, "top1": top1, "kl_cases": cases,
                "config": {"kind": kind, "budget": budget, **config}}

    def pair(label, length, kl, kl_low, kl_high, top1, top1_low, top1_high):
        return {"label": label, "length": length, "kl_difference": kl, "kl_difference_low": kl_low,
                "kl_difference_high": kl_high, "top1_difference": top1, "top1_difference_low": top1_low,
                "top1_difference_high": top1_high}

    summary = {"rows": [{**row("fm 128", "memstep", 2048, 128, 1.25, 0.61, question_aware=True), "anchor": True},
                        row("snapkv-max15 128", "kvpress", 2048, 128, 1.31, 0.6, scorer="snapkv-max15"),
                        row("chunkkv 128", "kvpress", 2048, 128, 1.5, 0.55, scorer="chunkkv"),
                        {**row("fm 512", "memstep", 4096, 512, 0.4, 0.8, question_aware=True), "anchor": True},
                        row("chunkkv 512", "kvpress", 4096, 512, 0.3, 0.85, scorer="chunkkv"),
                        {**row("fm 256", "memstep", 8192, 256, None, None, question_aware=True), "anchor": True}],
               "paired": [pair("chunkkv 128", 2048, 0.25, 0.1, 0.4, -0.06, -0.1, -0.02),
                          pair("snapkv-max15 128", 2048, 0.06, -0.02, 0.14, 0.003, -0.05, 0.03),
                          pair("chunkkv 512", 4096, -0.1, -0.15, -0.05, 0.05, 0.0, 0.1)]}
    found = fidelities(summary)
    assert [(f.length, f.budget, [v.verdict for v in f.versus]) for f in found] == [
        (2048, 128, ["closer", "as close"]), (4096, 512, ["farther"])]
    assert fidelity_table(found).splitlines() == [  # one row per press; the row's own values on its first
        "| tokens · M | memstep | press | memstep is | press KL · top-1 | KL difference (95% CI) | "
        "top-1 difference (points) | depths |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
        "| 2,048 · 128 | 1.25 · 0.61 | ChunkKV | closer | 1.50 · 0.55 | -0.25 (-0.40 to -0.10) | +6 (+2 to +10) | 12 |",
        "|  |  | SnapKV, max-pool 15 | as close | 1.31 · 0.60 | -0.06 (-0.14 to +0.02) | +0 (-3 to +5) | 12 |",  # not -0
        "| 4,096 · 512 | 0.40 · 0.80 | ChunkKV | farther | 0.30 · 0.85 | +0.10 (+0.05 to +0.15) | -5 (-10 to +0) | 12 |"]
    alone = fidelities({"rows": [r for r in summary["rows"] if r["config"]["kind"] == "memstep"]})
    assert fidelity_table(alone).splitlines()[2] == "| 2,048 · 128 | 1.25 · 0.61 | no press paired here |  |  |  |  | 12 |"
    assert fidelity_headline(found) == (
        "Beyond the needle (2 rows, 12 depths each): over the essay tokens that follow each document, memstep's "
        "question-aware memory predicts the next token closer than ChunkKV on 1 of 2 rows, as close on none and "
        "farther on 1; closer than SnapKV, max-pool 15 on none of 1 row, as close on 1 and farther on none (KL "
        "from the full cache's predictions, paired 95% t intervals).")
    assert fidelity_headline(fidelities({})) == ""

    import importlib.util
    spec = importlib.util.spec_from_file_location("eval_docs_fidelity", ROOT / "benchmarks" / "eval_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    block = docs.fidelity_block(tmp_path)
    assert block.startswith(fidelity_headline(found) + "\n\nMean KL") and fidelity_table(found) in block
    assert "over the essay tokens that follow each document (nats" in block  # no run settings: no count
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "run": {"settings": {"continuation_tokens": 16}}}))
    assert "over the 16 essay tokens that follow each document (nats" in docs.fidelity_block(tmp_path)
    assert "|" not in docs.fidelity_block(tmp_path, table=False)
    (tmp_path / "summary.json").write_text(json.dumps({"rows": [summary["rows"][-1]], "paired": []}))
    with pytest.raises(SystemExit, match="no needle-test rows with KL"):
        docs.fidelity_block(tmp_path)


def test_the_note_adds_the_fidelity_table_from_the_first_folder_that_measured_kl(tmp_path):
    """The Evaluate tab's needle note ends with KL and top-1 over the essay that follows, from the needle
    folder itself when it ran --metrics kl, else from the committed KL folder; nothing where neither did."""
    import ui.niah_view as view

    def row(label, kind, kl, **config):
        return {"label": label, "length": 2048, "kinds": ["niah"], "counted": 4, "counted_correct": 3, "kl": kl,
                "top1": 0.5, "kl_cases": 12, "config": {"kind": kind, "budget": 128, **config}}

    summary = {"rows": [{**row("fm", "memstep", 1.2, question_aware=True), "anchor": True},
                        row("chunkkv", "kvpress", 1.4, scorer="chunkkv")],
               "paired": [{"label": "chunkkv", "length": 2048, "kl_difference": 0.2, "kl_difference_low": 0.1,
                           "kl_difference_high": 0.3, "top1_difference": 0.0, "top1_difference_low": -0.1,
                           "top1_difference_high": 0.1}],
               "niah": niah_maps([c for c in cells() if c["kind"] == "niah"])}
    plain, measured = tmp_path / "plain", tmp_path / "kl"
    for folder, kl in ((plain, None), (measured, 1.2)):
        folder.mkdir()
        found = json.loads(json.dumps(summary))
        found["rows"][0]["kl"] = kl
        found["run"] = {"settings": {"continuation_tokens": 24}}  # the caption says what the run scored
        (folder / "summary.json").write_text(json.dumps(found))
    note = view.fidelity_note([plain, measured])
    assert note.startswith("\n\nBeyond the needle (1 row, 12 depths each): ") and "From `kl`:" in note
    assert "closer than ChunkKV on 1 of 1 row, as close on none and farther on none" in note
    assert "top-1 agreement over the 24 essay tokens after each document" in note
    assert view.fidelity_note([(plain, {}), (measured, {"rows": []})]) == ""  # loaded summaries are not read again
    assert view.fidelity_note([(plain, {}), measured]) == note
    assert "| 2,048 · 128 | 1.20 · 0.50 | ChunkKV | closer | 1.40 · 0.50 | -0.20 (-0.30 to -0.10) | +0 (-10 to +10) | 12 |" \
        in view.niah_view((measured, summary["niah"]), ())[0]
    assert view.fidelity_note([plain, tmp_path / "absent"]) == ""
    old = view.FIDELITY_FOLDERS
    try:
        view.FIDELITY_FOLDERS = (tmp_path / "absent",)
        assert "Beyond the needle" not in view.niah_view((plain, summary["niah"]), ())[0]
        view.FIDELITY_FOLDERS = (measured,)
        assert "Beyond the needle" in view.niah_view((plain, summary["niah"]), ())[0]
    finally:
        view.FIDELITY_FOLDERS = old


def test_eval_docs_writes_a_block_into_every_file_that_marks_it_and_refuses_when_none_does(tmp_path):
    """The needle standing (the dev grid) sits in the docs, not the README: eval_docs writes it where its
    markers are, leaves a file without them untouched, and stops in one line when no file has them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("eval_docs_marked", ROOT / "benchmarks" / "eval_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    readme, notes = tmp_path / "README.md", tmp_path / "notes.md"
    readme.write_text("no markers here\n")
    notes.write_text(f"a\n{docs.NIAH_START}\nold\n{docs.NIAH_END}\nb\n")
    docs.replace_where_marked([readme, notes], "new", docs.NIAH_START, docs.NIAH_END)
    assert readme.read_text() == "no markers here\n"
    assert notes.read_text() == f"a\n{docs.NIAH_START}\nnew\n{docs.NIAH_END}\nb\n"
    with pytest.raises(SystemExit, match="has a"):
        docs.replace_where_marked([readme], "new", docs.NIAH_START, docs.NIAH_END)
