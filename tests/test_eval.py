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
from memstep.evaluation.suite import DEFAULT_HAYSTACK, make_case
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
        doc = make_haystack(prose, tokenizer, 600, depth, case.passkey, thing=case.question.split("the ")[-1][:-1])
        without_needle = doc.text.replace(doc.needle + " ", "", 1) if depth < 1.0 else \
            doc.text[:doc.needle_char_start].rstrip()
        source = prose.strip()
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
    assert "fm knorm M=128" in labels and "imdc-sqrt chunk-attention M=256" in labels
    assert [c.label for c in configs if c.kind == "kvpress"] == ["kvpress snapkv M=128", "kvpress snapkv M=256"]
    assert labels[-1] == "hf full cache" and len(configs) == 1 + 2 * 2 * 2 + 2 + 1


@pytest.mark.parametrize("kwargs", [dict(schedules=["lifo"]), dict(scorers=["magic"]), dict(budgets=[0]),
                                    dict(peers=["vllm"]), dict(presses=["tova"]), dict(chunk=0)])
def test_grid_rejects_bad_settings(kwargs):
    settings = dict(schedules=["fm"], scorers=["knorm"], budgets=[64], chunk=64, peers=[], presses=["snapkv"])
    settings.update(kwargs)
    with pytest.raises(MemstepError):
        make_grid(**settings)


def test_cell_key_changes_with_any_setting():
    config, cell, settings = Config("memstep", "fm", None, "knorm", 64, 64), {"length": 1, "depth": 0.5, "seed": 0}, {"m": 1}
    key = cell_key(config, cell, settings)
    assert key == cell_key(Config.from_dict(config.to_dict()), dict(cell), dict(settings))
    assert key != cell_key(Config("memstep", "fm", None, "knorm", 128, 64), cell, settings)
    assert key != cell_key(config, {**cell, "seed": 1}, settings)
    assert key != cell_key(config, cell, {"m": 2})


# ---- scoring and retention ---------------------------------------------------------------
def test_cell_record_scores_hand_made_answers(tokenizer, prose):
    case = make_case(prose, tokenizer, 300, 0.5, 0)
    config = Config("memstep", "full")
    record = lambda answer: runner._cell_record(config, case, "k", {"answer": answer}, {})  # noqa: E731
    assert record(f"The magic number is {case.passkey}.")["correct"]
    assert not record(f"The magic number is {case.passkey}0.")["correct"]
    assert not record(f"It is {case.passkey[:-1]}.")["correct"]
    assert not record("")["correct"] and not runner._cell_record(config, case, "k", {"answer": None}, {})["correct"]


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

    def fake_group(config, group, keys, settings, store, report, on_cell=None, kvpress_python=None):
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
def _cell(label, kind, length, depth, correct, nll, seconds, peak, schedule="full", budget=None, scorer=None):
    config = Config(kind, schedule, "linear" if schedule in ("im", "imdc") else None, scorer, budget, 512)
    return {"key": f"{label}{length}{depth}", "config": config.to_dict(), "label": label, "peer": kind != "memstep",
            "length": length, "depth": depth, "seed": 0, "correct": correct, "continuation_nll": nll,
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
    assert summary["heatmaps"]["imdc ca M=512"] == {"depths": [0.1, 0.9], "lengths": [8192], "accuracy": [[1.0], [0.0]]}


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
    assert "NOT met" in text and "**fm snap M=512**" in text and "results/heatmaps.png" in text


def test_refresh_readme_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Evaluation\n{report.START}\nold\n{report.END}\n\n## Other\nkeep\n")
    report.refresh_readme(readme, "new table")
    text = readme.read_text()
    assert "old" not in text and "new table" in text and text.endswith("## Other\nkeep\n")
    readme.write_text("no markers")
    with pytest.raises(MemstepError, match="markers"):
        report.refresh_readme(readme, "x")
