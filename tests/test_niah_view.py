"""The needle test's heatmap: maps from finished cells (hand-counted), one panel per configuration,
and the Evaluate tab's section finding the results by their content."""

from __future__ import annotations

import json

from memstep.evaluation.niah_view import niah_figure, niah_maps


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


def test_depths_draw_to_the_nearest_tenth():
    """A fine grid of depths (memstep eval --depths 0,2,4,...) draws as the harness's rows of tenths,
    each the mean of its cases: 2% and 4% fall in the 0% row, 6% and 14% in the 10% row, 95% in 100%."""
    rows = [{"label": "fm", "kind": "niah", "depth": d, "length": 2048, "recall": r}
            for d, r in ((0.02, 1.0), (0.04, 0.0), (0.06, 1.0), (0.14, 0.5), (0.95, 1.0))]
    found = niah_maps(rows)["niah"]["fm"]
    assert found["depths"] == [0.0, 0.1, 1.0]
    assert found["score"] == [[0.5], [0.75], [1.0]] and found["cases"] == [[2], [2], [1]]


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
