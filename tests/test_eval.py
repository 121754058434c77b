"""memstep.evaluation: suite placement and continuation, scoring, grid keys, resume,
metrics on hand-made cells, the worker protocol and the kvpress peer's pure parts."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from memstep.errors import MemstepError
from memstep.evaluation import metrics, process, report, runner
from memstep.evaluation.grid import Config, cell_key, make_grid
from memstep.evaluation.store import ResultStore
from memstep.evaluation.suite import DEFAULT_HAYSTACK, make_case, rotate
from memstep.evaluation.worker import retention_per_layer
from memstep.passkey import make_haystack

try:
    from fixtures_documents import tokenizer  # noqa: F401 (a pytest fixture)
    from test_passkey import sentence_tokens
except ImportError:  # tests/ imported as a package
    from tests.fixtures_documents import tokenizer  # noqa: F401
    from tests.test_passkey import sentence_tokens


@pytest.fixture(scope="module")
def prose():
    return DEFAULT_HAYSTACK.read_text(encoding="utf-8")


# ---- suite -------------------------------------------------------------------------------
@pytest.mark.parametrize("length,depth", [(400, 0.0), (1000, 0.25), (1000, 0.5), (2048, 0.9), (700, 1.0)])
def test_case_places_the_passkey_at_depth_and_length(tokenizer, prose, length, depth):
    case = make_case(prose, tokenizer, length, depth, seed=3)
    slack = sentence_tokens(tokenizer, prose)
    ids = case.document_ids
    assert length - slack <= len(ids) <= length
    digits = tokenizer.decode(ids[slice(*case.passkey_tokens)]).strip()
    assert digits == case.passkey and case.passkey in case.question or digits == case.passkey
    needle = tokenizer.decode(ids[slice(*case.needle_tokens)]).strip()
    assert needle.endswith(f"is {case.passkey}.")
    assert case.needle_tokens[0] <= case.passkey_tokens[0] < case.passkey_tokens[1] <= case.needle_tokens[1]
    haystack_tokens = len(ids) - (case.needle_tokens[1] - case.needle_tokens[0])
    assert abs(case.needle_tokens[0] - depth * haystack_tokens) <= slack
    # the question names the needle's thing; the prompt framing is the chat template's
    assert case.question.split("the ")[-1].rstrip("?") in needle
    assert tokenizer.decode(case.question_ids).count(case.question) == 1


def test_continuation_is_the_prose_after_the_haystack(tokenizer, prose):
    for depth in (0.0, 0.5, 1.0):
        case = make_case(prose, tokenizer, 600, depth, seed=1, continuation_tokens=24)
        window = rotate(prose, case.start)  # the case's own window of the text
        doc = make_haystack(window, tokenizer, 600, depth, case.passkey, thing=case.question.split("the ")[-1][:-1])
        without_needle = doc.text.replace(doc.needle + " ", "", 1) if depth < 1.0 else \
            doc.text[:doc.needle_char_start].rstrip()
        source = window
        assert source.startswith(without_needle)
        following = tokenizer.decode(case.continuation_ids)
        assert len(case.continuation_ids) == 24
        assert source[len(without_needle):].startswith(following)


def test_cases_differ_by_seed_and_are_reproducible(tokenizer, prose):
    a, b = make_case(prose, tokenizer, 300, 0.5, 0), make_case(prose, tokenizer, 300, 0.5, 1)
    assert a.passkey != b.passkey
    assert make_case(prose, tokenizer, 300, 0.5, 0).document_ids == a.document_ids


# ---- grid and keys -----------------------------------------------------------------------
def test_grid_full_once_peers_at_each_budget():
    configs = make_grid(["full", "fm", "imdc-sqrt"], ["chunk-attention", "knorm"], [128, 256], 64,
                        peers=["kvpress", "hf"], presses=["snapkv"])
    labels = [c.label for c in configs]
    assert labels.count("memstep full") == 1
    assert "fm knorm M=128 compact" in labels and "imdc-sqrt chunk-attention M=256 compact" in labels
    assert [c.label for c in configs if c.kind == "kvpress"] == ["kvpress snapkv M=128", "kvpress snapkv M=256"]
    assert labels[-1] == "hf full cache" and len(configs) == 1 + 2 * 2 * 2 + 2 + 1


@pytest.mark.parametrize("kwargs", [dict(schedules=["lifo"]), dict(scorers=["magic"]), dict(budgets=[0]),
                                    dict(peers=["vllm"]), dict(presses=["tova"]), dict(chunk=0),
                                    dict(ropes=["true"]), dict(ropes=[])])
def test_grid_rejects_bad_settings(kwargs):
    settings = dict(schedules=["fm"], scorers=["knorm"], budgets=[64], chunk=64, peers=[], presses=["snapkv"])
    settings.update(kwargs)
    with pytest.raises(MemstepError):
        make_grid(**settings)


def test_cell_key_changes_with_any_setting():
    config = Config("memstep", "fm", None, "knorm", 64, 64, "compact")
    cell, settings = {"haystack": "a.txt", "length": 1, "depth": 0.5, "seed": 0, "start": 0}, {"m": 1}
    key = cell_key(config, cell, settings)
    assert key == cell_key(Config.from_dict(config.to_dict()), dict(cell), dict(settings))
    assert key != cell_key(Config("memstep", "fm", None, "knorm", 128, 64, "compact"), cell, settings)
    assert key != cell_key(Config("memstep", "fm", None, "knorm", 64, 64, "document"), cell, settings)
    assert key != cell_key(config, {**cell, "seed": 1}, settings)
    assert key != cell_key(config, {**cell, "haystack": "b.txt"}, settings)
    assert key != cell_key(config, cell, {"m": 2})


def test_rope_axis_in_grid_and_labels():
    configs = make_grid(["full", "fm", "imdc"], ["chunk-attention"], [512], 512, peers=["kvpress"],
                        presses=["snapkv"], ropes=["compact", "document"])
    assert [c.label for c in configs] == [
        "memstep full", "fm chunk-attention M=512 compact", "fm chunk-attention M=512 document",
        "imdc chunk-attention M=512 compact", "imdc chunk-attention M=512 document", "kvpress snapkv M=512"]
    # without eviction both position modes are the same run: the full cache and the peers carry none
    assert [c.rope for c in configs if c.is_peer or c.schedule == "full"] == [None, None]
    assert len({cell_key(c, {"length": 1}, {}) for c in configs}) == len(configs)
    assert [c.label for c in make_grid(["fm"], ["knorm"], [64], 64)] == ["fm knorm M=64 compact"]  # the default


def test_question_aware_axis_in_grid_labels_and_keys():
    configs = make_grid(["fm"], ["chunk-attention", "knorm"], [512], 512, peers=["kvpress"], presses=["snapkv"],
                        question_aware=(False, True))
    assert [c.label for c in configs] == [
        "fm chunk-attention M=512 compact", "fm knorm M=512 compact",
        "fm chunk-attention M=512 shared question-aware",  # knorm reads no attention: no question-aware variant
        "kvpress snapkv M=512", "kvpress snapkv M=512 question-aware"]
    # an agnostic configuration's dict (and so its cells' keys) is what it was before the axis existed
    assert "question_aware" not in configs[0].to_dict() and configs[2].to_dict()["question_aware"] is True
    assert Config.from_dict(configs[2].to_dict()) == configs[2]
    assert len({cell_key(c, {"length": 1}, {}) for c in configs}) == len(configs)


LEGACY_LINE = (  # a cell as `memstep eval` wrote it before the rope and haystack axes (results/cells.jsonl)
    '{"answer": "It is 14688.", "baseline_rss_bytes": 951787520, "config": {"budget": 512, "chunk": 512, '
    '"growth": null, "kind": "memstep", "schedule": "fm", "scorer": "chunk-attention"}, "continuation_nll": 2.9, '
    '"correct": false, "depth": 0.1, "document_tokens": 2041, "key": "0ed379fdde23ee99", '
    '"label": "fm chunk-attention M=512", "length": 2048, "memory_entries": 516, "passkey": "14688", '
    '"peak_device_bytes": null, "peak_rss_bytes": 1150812160, "peer": false, "prefill_seconds": 12.7, '
    '"retention": [0.5], "seconds": 14.2, "seed": 0, "transformers": "5.24.0"}')


def test_legacy_cells_load_as_document_positions(tmp_path):
    (tmp_path / "cells.jsonl").write_text(
        LEGACY_LINE + "\n" + LEGACY_LINE.replace('"schedule": "fm", "scorer": "chunk-attention"',
                                                 '"schedule": "full", "scorer": null')
        .replace("0ed379fdde23ee99", "full").replace("fm chunk-attention M=512", "memstep full") + "\n")
    store = ResultStore(tmp_path)
    assert "0ed379fdde23ee99" in store and "full" in store  # the same keys: nothing reruns, nothing is renamed
    cells = {c["key"]: c for c in store.cells()}
    fm, full = cells["0ed379fdde23ee99"], cells["full"]
    assert fm["config"]["rope"] == "document" and fm["label"] == "fm chunk-attention M=512 document"
    assert full["config"]["rope"] is None and full["label"] == "memstep full"
    assert fm["haystack"] == full["haystack"] == "pride_and_prejudice_ch1-12.txt"
    # a compact configuration never takes the old cell's key
    compact = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact")
    cell = {"haystack": fm["haystack"], "length": 2048, "depth": 0.1, "seed": 0, "start": 0}
    assert cell_key(compact, cell, runner.EvalSettings().key_fields()) not in store
    rows = {r["label"]: r for r in metrics.summarize(store.cells())["rows"]}
    assert rows["fm chunk-attention M=512 document"]["nll_gap"] == pytest.approx(0.0)


def test_cases_over_several_haystacks(tokenizer):
    from memstep.evaluation.suite import DEFAULT_HAYSTACKS, make_cases, paragraph_starts, read_haystacks

    cases = make_cases(tokenizer, [300], [0.2, 0.8], [0, 1], continuation_tokens=8)
    texts = read_haystacks()
    assert list(texts) == [p.name for p in DEFAULT_HAYSTACKS] == ["pride_and_prejudice_ch1-12.txt",
                                                                  "persuasion_excerpt.txt"]
    assert len(cases) == 8 and [c.haystack for c in cases].count("persuasion_excerpt.txt") == 4
    assert len({tuple(c.document_ids) for c in cases}) == 8  # every case its own document
    assert len({tuple(c.continuation_ids) for c in cases}) == 8  # and its own held-out prose
    assert len({c.passkey for c in cases}) == 8
    for case in cases:
        text = texts[case.haystack].strip()
        assert case.start in paragraph_starts(text)
        first = tokenizer.decode(case.document_ids[:5]).strip()
        assert text[case.start:].startswith(first) or case.needle_tokens[0] == 0
        assert case.cell == {"haystack": case.haystack, "length": 300, "depth": case.depth, "seed": case.seed,
                             "start": case.start}
    # a wider grid leaves the cases it shares with a narrower one exactly as they were
    (again,) = make_cases(tokenizer, [300], [0.8], [1], [DEFAULT_HAYSTACKS[1]], continuation_tokens=8)
    assert again == next(c for c in cases if c.cell == again.cell)


def test_haystacks_bad_input(tmp_path):
    from memstep.evaluation.suite import read_haystacks

    with pytest.raises(MemstepError, match="not found"):
        read_haystacks([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(MemstepError, match="empty"):
        read_haystacks([tmp_path / "empty.txt"])
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "pride_and_prejudice_ch1-12.txt").write_text("Some prose.")
    with pytest.raises(MemstepError, match="rename"):
        read_haystacks([DEFAULT_HAYSTACK, tmp_path / "a" / "pride_and_prejudice_ch1-12.txt"])


def test_window_start_is_a_paragraph_with_room(prose):
    from memstep.evaluation.suite import paragraph_starts, window_start

    text = prose.strip()
    starts = {window_start(prose, "p.txt", 2048, d, s) for d in (0.1, 0.5, 0.9) for s in range(4)}
    assert len(starts) > 6 and starts <= set(paragraph_starts(text))
    assert all(s + 5 * 2048 <= len(text) for s in starts)
    assert window_start(prose, "p.txt", 2048, 0.5, 1) == window_start(prose, "p.txt", 2048, 0.5, 1)
    assert window_start("One.\n\nTwo.", "short.txt", 8192, 0.5, 0) in (0, 6)  # shorter than the window


def test_worker_passes_the_rope_mode(monkeypatch):
    from memstep import runner as document_runner
    from memstep.evaluation import worker

    seen = []

    class FakeRun:
        def __init__(self, lm, ids, **kwargs):
            seen.append(kwargs)

        def run(self):
            step = type("Step", (), {"memory_after": 36, "kept_positions": np.zeros((1, 1, 36), dtype=int)})
            self.result = type("Result", (), {"answer": "1", "continuation_nll": 2.0, "seconds": 0.1,
                                              "prefix_tokens": 0, "steps": [step], "peak_bytes_modeled": 1,
                                              "question_pool": None, "question_weight": None,
                                              "schedule": {"steps": 1}})
            return self.result

    monkeypatch.setattr(document_runner, "DocumentRun", FakeRun)
    case = {"document_ids": list(range(50)), "continuation_ids": [1, 2], "seed": 0, "question": "q?",
            "passkey_tokens": [3, 5]}
    settings = {"sinks": 4, "window": 32, "max_new_tokens": 4}
    for rope in ("compact", "document"):
        worker.run_case(None, Config("memstep", "fm", None, "knorm", 32, 16, rope).to_dict(), settings, case)
    worker.run_case(None, Config("memstep", "full").to_dict(), settings, case)
    assert [k.get("rope") for k in seen] == ["compact", "document", None]  # full: the engine's default
    worker.run_case(None, Config("memstep", "fm", None, "conv", 32, 16, "compact", True).to_dict(), settings, case)
    assert [k["question_aware"] for k in seen] == [False, False, False, True]
    # the ablation axes reach the run; "once" is FM with one chunk holding the head and the whole document
    case["head_ids"] = [7, 8, 9]
    worker.run_case(None, Config("memstep", "once", None, "conv", 32, None, "compact", True, None, "mean:5",
                                 0.5).to_dict(), settings, case)
    assert seen[-1]["schedule"] == "fm" and seen[-1]["chunk"] == 3 + 50
    assert seen[-1]["question_pool"] == "mean:5" and seen[-1]["question_weight"] == 0.5
    worker.run_case(None, Config("memstep", "fm", None, "conv", 32, 16, "compact", True).to_dict(), settings, case)
    assert "question_pool" not in seen[-1] and "question_weight" not in seen[-1]  # the engine's defaults


# ---- scoring and retention ---------------------------------------------------------------
def test_cell_record_scores_hand_made_answers(tokenizer, prose):
    case = make_case(prose, tokenizer, 300, 0.5, 0)
    config = Config("memstep", "full")
    record = lambda answer: runner.cell_record(config, case, "k", {"answer": answer}, {})  # noqa: E731
    assert record(f"The magic number is {case.passkey}.")["correct"]
    assert not record(f"The magic number is {case.passkey}0.")["correct"]
    assert not record(f"It is {case.passkey[:-1]}.")["correct"]
    assert not record("")["correct"] and not runner.cell_record(config, case, "k", {"answer": None}, {})["correct"]


def test_retention_per_layer():
    kept = np.array([[[0, 5, 6, 7], [0, 1, 2, 6]], [[0, 1, 2, 3], [0, 1, 2, 3]]])  # (layers, heads, kept)
    assert retention_per_layer(kept, range(5, 7)) == [0.75, 0.0]


# ---- store and resume --------------------------------------------------------------------
def test_store_survives_a_cut_line_and_reloads(tmp_path):
    store = ResultStore(tmp_path)
    store.add({"key": "a", "x": 1})
    with store.path.open("a") as handle:
        handle.write('{"key": "b", "x"')  # an interrupted write
    again = ResultStore(tmp_path)
    assert "a" in again and "b" not in again and len(again) == 1


def test_run_grid_skips_finished_cells(tmp_path, tokenizer, prose, monkeypatch):
    cases = [make_case(prose, tokenizer, 300, d, 0) for d in (0.2, 0.8)]
    configs = [Config("memstep", "full"), Config("memstep", "fm", None, "knorm", 64, 64)]
    settings = runner.EvalSettings()
    calls = []

    def fake_group(config, group, keys, settings, store, report, on_cell=None, kvpress_python=None,
                   divergence=False):
        calls.append((config.label, [c.depth for c in group]))
        for key in keys:
            store.add({"key": key})
            report.ran += 1

    monkeypatch.setattr(runner, "run_group", fake_group)
    store = ResultStore(tmp_path)
    done = cell_key(configs[1], cases[0].cell, settings.key_fields())
    store.add({"key": done})
    first = runner.run_grid(configs, cases, settings, store)
    assert calls == [("memstep full", [0.2, 0.8]), ("fm knorm M=64", [0.8])]
    assert (first.ran, first.skipped) == (3, 1)
    calls.clear()
    second = runner.run_grid(configs, cases, settings, ResultStore(tmp_path))
    assert calls == [] and (second.ran, second.skipped) == (0, 4)


def test_missing_kvpress_venv_fails_before_any_work(tmp_path):
    with pytest.raises(MemstepError, match="kvpress-venv"):
        runner.run_grid([Config("memstep", "full"), Config("kvpress", "full", None, "snapkv", 64)], [],
                        runner.EvalSettings(), ResultStore(tmp_path), kvpress_python=tmp_path / "no-python")


# ---- protocol and peer -------------------------------------------------------------------
def test_parse_line_reads_events_and_ignores_noise():
    line = json.dumps({"event": "cell", "key": "k", "answer": "12345", "peak_rss_bytes": 10})
    assert process.parse_line(line + "\n")["answer"] == "12345"
    for noise in ("Loading weights: 100%", "{not json", '{"no_event": 1}', "[1, 2]", ""):
        assert process.parse_line(noise) is None


def test_peak_resident_is_at_least_resident():
    assert process.peak_resident_bytes() >= process.resident_bytes() > 0


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("kvpress_peer", runner.PEER_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # kvpress itself is imported only when a press is made
    return module


@pytest.mark.parametrize("tokens,keep", [(8192, 516), (2048, 516), (333, 68), (1000, 999)])
def test_peer_ratio_keeps_exactly_the_budget(peer, tokens, keep):
    class Press:
        compression_ratio = 0.0

    press = Press()
    peer.set_ratio(press, tokens, keep)
    assert max(1, int(tokens * (1 - press.compression_ratio))) == keep  # kvpress's compute_n_kept
    peer.set_ratio(press, 100, 200)
    assert press.compression_ratio == 0.0


def test_peer_output_becomes_cells(tmp_path, tokenizer, prose, monkeypatch):
    """A fake peer printing the protocol (plus library noise) is read into scored cells."""
    case = make_case(prose, tokenizer, 300, 0.5, 0)
    script = tmp_path / "peer.py"
    script.write_text(
        "import json, sys\njob = json.load(open(sys.argv[1]))\nprint('Loading weights: 100%')\n"
        "print(json.dumps({'event': 'ready', 'baseline_rss_bytes': 100, 'transformers': '5.2.0'}))\n"
        "for item in job['cases']:\n"
        "    print(json.dumps({'event': 'cell', 'key': item['key'], 'answer': 'It is ' + item['case']['passkey'],"
        " 'continuation_nll': 2.5, 'prefill_seconds': 0.5, 'seconds': 1.0, 'peak_rss_bytes': 300,"
        " 'memory_entries': 68, 'retention': None}))\n")
    monkeypatch.setattr(runner, "worker_command", lambda config, path, python=None: ["python3", str(script), path])
    store, report = ResultStore(tmp_path / "out"), runner.RunReport()
    runner.run_group(Config("kvpress", "full", None, "snapkv", 64), [case], ["key1"], runner.EvalSettings(),
                     store, report)
    (cell,) = store.cells()
    assert report.ran == 1 and not report.errors
    assert cell["correct"] and cell["peer"] and cell["label"] == "kvpress snapkv M=64"
    assert (cell["peak_rss_bytes"], cell["baseline_rss_bytes"], cell["transformers"]) == (300, 100, "5.2.0")


# ---- metrics and report ------------------------------------------------------------------
def _cell(label, kind, length, depth, correct, nll, seconds, peak, schedule="full", budget=None, scorer=None,
          rope=None, haystack="a.txt", seed=0):
    config = Config(kind, schedule, "linear" if schedule in ("im", "imdc") else None, scorer, budget, 512, rope)
    return {"key": f"{label}{length}{depth}{haystack}{seed}", "config": config.to_dict(), "label": label,
            "peer": kind != "memstep", "haystack": haystack,
            "length": length, "depth": depth, "seed": seed, "correct": correct, "continuation_nll": nll,
            "prefill_seconds": seconds / 2, "seconds": seconds, "peak_rss_bytes": peak, "baseline_rss_bytes": 100,
            "peak_device_bytes": None, "memory_entries": 516, "retention": [1.0, 1.0] if correct else [1.0, 0.5]}


@pytest.fixture
def cells():
    out = []
    for depth in (0.1, 0.9):
        out += [_cell("memstep full", "memstep", 8192, depth, True, 2.0, 40, 5000),
                _cell("fm ca M=512", "memstep", 8192, depth, True, 2.2, 30, 1000, "fm", 512, "ca"),
                _cell("imdc ca M=512", "memstep", 8192, depth, depth < 0.5, 2.4, 20, 800, "imdc", 512, "ca"),
                _cell("kvpress snapkv M=512", "kvpress", 8192, depth, True, 2.1, 25, 4000, "full", 512, "snapkv"),
                _cell("kvpress knorm M=512", "kvpress", 8192, depth, False, 3.0, 10, 300, "full", 512, "knorm"),
                _cell("fm snap M=512", "memstep", 8192, depth, depth < 0.5, 2.5, 30, 4500, "fm", 512, "snap")]
    return out


def test_summary_rows_heatmaps_and_gap(cells):
    summary = metrics.summarize(cells)
    rows = {r["label"]: r for r in summary["rows"]}
    assert rows["imdc ca M=512"]["accuracy"] == 0.5 and rows["fm ca M=512"]["accuracy"] == 1.0
    assert rows["imdc ca M=512"]["nll_gap"] == pytest.approx(0.4)
    assert rows["memstep full"]["nll_gap"] == 0.0
    assert rows["imdc ca M=512"]["working_rss_bytes"] == 700
    assert rows["imdc ca M=512"]["retention"] == pytest.approx(0.875)
    assert rows["imdc ca M=512"]["retained_and_correct"] == 1.0
    assert summary["heatmaps"]["imdc ca M=512"] == {"depths": [0.1, 0.9], "lengths": [8192], "accuracy": [[1.0], [0.0]],
                                                    "cases": [[1], [1]]}


def test_goals_and_dominated(cells):
    summary = metrics.summarize(cells)
    (accuracy,) = summary["goals"]["imdc_vs_fm_accuracy"]
    assert accuracy["points"] == -50.0 and not accuracy["met"]
    memory = {g["kvpress"]: g for g in summary["goals"]["imdc_vs_kvpress_memory"]}
    assert memory["kvpress snapkv M=512"]["peak_ratio"] == 0.2 and memory["kvpress snapkv M=512"]["met"]
    assert memory["kvpress snapkv M=512"]["working_ratio"] == pytest.approx(0.179, abs=1e-3)
    assert memory["kvpress snapkv M=512"]["met_above_baseline"]
    assert not memory["kvpress knorm M=512"]["met"]  # imdc uses more memory and time than knorm
    assert not memory["kvpress knorm M=512"]["met_above_baseline"]
    beaten = {(d["label"], d["beaten_by"]) for d in summary["dominated"]}
    # less accurate, more memory, more seconds than kvpress snapkv
    assert beaten == {("fm snap M=512", "kvpress snapkv M=512")}
    # full (better NLL), fm ca (cheaper) and imdc ca (knorm is less accurate) lose to no peer on both
    text = report.markdown(summary, "results/")
    assert "**fm snap M=512**" in text and "results/heatmaps.png" in text
    assert "Goal" not in text and "NOT met" in report.goals_text(summary)  # goals: the CLI's output, not the README


def test_wilson_interval_by_hand():
    from memstep.evaluation.stats import wilson_interval

    # z = 1.959964, z^2 = 3.841459; n = 12: 1 + z^2/n = 1.320122, z^2/2n = 0.160061, z^2/4n^2 = 0.006669
    # 0/12: centre 0.160061/1.320122 = 0.121247, half 1.484684 * sqrt(0.006669) = 0.121247
    assert wilson_interval(0, 12) == (0.0, pytest.approx(0.242494, abs=1e-6))
    # 6/12: centre 0.5, half 1.484684 * sqrt(0.25/12 + 0.006669) = 0.246218
    assert wilson_interval(6, 12) == (pytest.approx(0.253782, abs=1e-6), pytest.approx(0.746218, abs=1e-6))
    assert wilson_interval(12, 12) == (pytest.approx(0.757506, abs=1e-6), 1.0)
    # 3/10: 1 + z^2/n = 1.384146; centre (0.3 + 0.192073)/1.384146 = 0.355506;
    # half 1.416011 * sqrt(0.021 + 0.009604) = 0.247713
    assert wilson_interval(3, 10) == (pytest.approx(0.107793, abs=1e-5), pytest.approx(0.603219, abs=1e-5))
    for bad in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_t_quantiles_and_mean_interval_by_hand():
    from memstep.evaluation.stats import mean_interval, t_quantile_975

    assert t_quantile_975(1) == 12.7062 and t_quantile_975(11) == 2.2010 and t_quantile_975(30) == 2.0423
    # beyond the table: Cornish-Fisher, against the printed values for 40, 60 and 120 degrees of freedom
    assert t_quantile_975(40) == pytest.approx(2.0211, abs=2e-4)
    assert t_quantile_975(60) == pytest.approx(2.0003, abs=2e-4)
    assert t_quantile_975(120) == pytest.approx(1.9799, abs=2e-4)
    assert 1.9599 < t_quantile_975(10**6) < 1.9601  # the normal quantile
    with pytest.raises(ValueError):
        t_quantile_975(0)
    # 0.1, 0.2, 0.3, 0.4: mean 0.25, s = 0.129099, t(3) = 3.1824: half 3.1824 * 0.129099 / 2 = 0.205423
    found = mean_interval([0.1, 0.2, 0.3, 0.4, None])
    assert found["n"] == 4 and found["mean"] == pytest.approx(0.25)
    assert found["half"] == pytest.approx(0.205423, abs=1e-6) and found["low"] == pytest.approx(0.25 - 0.205423)
    assert mean_interval([0.7]) == {"mean": 0.7, "low": None, "high": None, "half": None, "n": 1}
    assert mean_interval([]) is None and mean_interval([None]) is None


def test_summary_carries_intervals_and_contrasts():
    cells = []
    for i, (depth, haystack) in enumerate((d, h) for d in (0.2, 0.5, 0.8) for h in ("a.txt", "b.txt")):
        base = 2.0 + 0.1 * i  # the full cache's NLL differs by case; the gaps are paired per case
        cells += [_cell("memstep full", "memstep", 2048, depth, True, base, 10, 900, haystack=haystack),
                  _cell("fm ca M=64 compact", "memstep", 2048, depth, i < 3, base + 0.05 * i, 10, 800, "fm", 64,
                        "chunk-attention", "compact", haystack),
                  _cell("fm ca M=64 document", "memstep", 2048, depth, i < 2, base + 0.1, 10, 800, "fm", 64,
                        "chunk-attention", "document", haystack),
                  _cell("fm conv M=64 compact", "memstep", 2048, depth, i % 2 == 0, base + 0.2, 10, 800, "fm", 64,
                        "conv", "compact", haystack)]
    summary = metrics.summarize(cells)
    rows = {r["label"]: r for r in summary["rows"]}
    compact = rows["fm ca M=64 compact"]
    assert (compact["correct"], compact["cells"], compact["accuracy"]) == (3, 6, 0.5)
    assert compact["haystacks"] == ["a.txt", "b.txt"]
    # 3/6: 1 + z^2/6 = 1.640243, centre 0.5, half 1.194923 * sqrt(1/24 + 3.841459/144) = 0.312384
    assert (compact["accuracy_low"], compact["accuracy_high"]) == (pytest.approx(0.187616, abs=1e-5),
                                                                    pytest.approx(0.812384, abs=1e-5))
    # gaps 0, 0.05, ..., 0.25: mean 0.125, s = 0.093541, t(5) = 2.5706: half 0.098168
    assert compact["nll_gap"] == pytest.approx(0.125) and compact["nll_gap_cases"] == 6
    assert compact["nll_gap_high"] - compact["nll_gap"] == pytest.approx(0.098168, abs=1e-5)
    assert rows["fm ca M=64 document"]["nll_gap_low"] == pytest.approx(0.1)  # no spread: a zero-width interval
    assert rows["memstep full"]["retention_low"] == 1.0 and rows["fm ca M=64 compact"]["retention_high"] <= 1.0
    found = {(c["axis"], c["first"], c["second"]): c for c in summary["contrasts"]}
    assert set(found) == {("rope", "fm ca M=64 compact", "fm ca M=64 document"),
                          ("scorer", "fm conv M=64 compact", "fm ca M=64 compact")}
    rope = found[("rope", "fm ca M=64 compact", "fm ca M=64 document")]
    assert (rope["cases"], rope["first_correct"], rope["second_correct"]) == (6, 3, 2)
    assert (rope["only_first"], rope["only_second"]) == (1, 0)
    assert rope["nll_difference"] == pytest.approx(0.025)  # mean of 0.05 i - 0.1
    assert rope["nll_difference_high"] - rope["nll_difference"] == pytest.approx(0.098168, abs=1e-5)
    text = report.markdown(summary)
    assert "| 2048 | fm ca M=64 compact | 3/6 (50%, 95% CI 19-81%) |" in text
    assert "+0.125 ± 0.098" in text and "passkeys 3 vs 2 of 6 (only the first: 1, only the second: 0)" in text
    assert summary["heatmaps"]["fm ca M=64 compact"]["cases"] == [[2], [2], [2]]


def test_report_formats():
    assert report.plus_minus(0.0123, 0.0023, 0.0223) == "+0.012 ± 0.010"
    assert report.plus_minus(-0.5, None, None) == "-0.500" and report.plus_minus(None, None, None) == "-"
    row = {"correct": 0, "cells": 12, "accuracy": 0.0, "accuracy_low": 0.0, "accuracy_high": 0.2425}
    assert report.accuracy_text(row) == "0/12 (0%, 95% CI 0-24%)"
    assert report.retention_text({"retention": 0.5, "retention_low": 0.3, "retention_high": 0.7}) == "50% (30-70%)"
    assert report.retention_text({"retention": None}) == "-"


def test_refresh_readme_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Evaluation\n{report.START}\nold\n{report.END}\n\n## Other\nkeep\n")
    report.refresh_readme(readme, "new table")
    text = readme.read_text()
    assert "old" not in text and "new table" in text and text.endswith("## Other\nkeep\n")
    readme.write_text("no markers")
    with pytest.raises(MemstepError, match="markers"):
        report.refresh_readme(readme, "x")


def test_goals_compare_like_with_like_question_aware_included():
    from memstep.evaluation.metrics import goals

    def row(kind, schedule, aware, accuracy, label):
        config = Config(kind, schedule, "linear" if schedule == "imdc" else None, "chunk-attention"
                        if kind == "memstep" else "snapkv", 512, 512 if kind == "memstep" else None,
                        "compact" if kind == "memstep" else None, aware).to_dict()
        return {"config": config, "label": label, "length": 2048, "accuracy": accuracy, "cells": 12,
                "peak_rss_bytes": 100, "working_rss_bytes": 10, "seconds": 1.0}

    rows = [row("memstep", "imdc", False, 0.0, "imdc"), row("memstep", "fm", False, 0.0, "fm"),
            row("memstep", "imdc", True, 1.0, "imdc qa"), row("memstep", "fm", True, 1.0, "fm qa"),
            row("kvpress", "full", False, 0.0, "press"), row("kvpress", "full", True, 0.0, "press qa")]
    result = goals(rows)
    assert [(g["imdc"], g["fm"]) for g in result["imdc_vs_fm_accuracy"]] == [("imdc", "fm"), ("imdc qa", "fm qa")]
    assert [(g["imdc"], g["kvpress"]) for g in result["imdc_vs_kvpress_memory"]] == [
        ("imdc", "press"), ("imdc qa", "press qa")]
