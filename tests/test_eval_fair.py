"""The evaluation's fairness and sharpness: peers set as their authors set them (the job they
get, the press they build), KL / top-1 agreement against the full cache, the ablation switches
reaching the kept sets, needle kinds, the paired interval, and bad input refused before any
model loads."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from memstep.cli import main
from memstep.evaluation import divergence, runner
from memstep.evaluation.grid import Config, make_grid
from memstep.evaluation.needles import KINDS, answer_matches, make_needle
from memstep.evaluation.stats import paired_difference_interval, wilson_interval
from memstep.evaluation.store import ResultStore
from memstep.evaluation.suite import DEFAULT_HAYSTACK, make_case
from memstep.evaluation.worker import document_run, run_case
from memstep.generate import prompt_parts
from memstep.question_pool import QUESTION_POOL
from memstep.models import LoadedModel

try:
    from conftest import make_tiny_model
    from fixtures_documents import tokenizer  # noqa: F401 (a pytest fixture)
except ImportError:  # tests/ imported as a package
    from tests.conftest import make_tiny_model
    from tests.fixtures_documents import tokenizer  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "peers" / "kvpress_peer.py"
KVPRESS_PYTHON = ROOT / ".venv-kvpress" / "bin" / "python"


@pytest.fixture(scope="module")
def prose():
    return DEFAULT_HAYSTACK.read_text(encoding="utf-8")


# ---- peers: the job they get and the press they build --------------------------------------
def _peer_module(fake_kvpress=None):
    if fake_kvpress is not None:
        sys.modules["kvpress"] = fake_kvpress
    spec = importlib.util.spec_from_file_location("kvpress_peer_under_test", PEER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_kvpress():
    """Stand-ins that only remember how they were built (the wiring under test is ours)."""
    def press(name):
        def init(self, **kwargs):
            self.__dict__.update(kwargs)
        return type(name, (), {"__init__": init})

    fake = types.ModuleType("kvpress")
    for name in ("SnapKVPress", "ChunkKVPress", "FinchPress", "KeyDiffPress", "BlockPress", "KnormPress",
                 "StreamingLLMPress", "ObservedAttentionPress"):
        setattr(fake, name, press(name))
    return fake


def _job_of(config, cases, monkeypatch, tmp_path) -> dict:
    """The job file run_group hands a worker, caught instead of starting the worker."""
    seen = {}

    class NoWorker:
        def __init__(self, command, **kwargs):
            seen["job"] = json.loads(Path(command[-1]).read_text())
            self.stdout = iter(())

        def wait(self):
            return 0

    monkeypatch.setattr(runner, "worker_command", lambda config, path, python=None: ["python3", "-", path])
    monkeypatch.setattr(runner.subprocess, "Popen", NoWorker)
    keys = [f"k{i}" for i in range(len(cases))]
    runner.run_group(config, cases, keys, runner.EvalSettings(), ResultStore(tmp_path), runner.RunReport())
    return seen["job"]


def test_peer_window_is_the_question_in_question_aware_mode(tokenizer, prose, monkeypatch, tmp_path):
    cases = [make_case(prose, tokenizer, 400, 0.5, 0, kind=kind) for kind in ("passkey", "name")]
    questions = [len(c.question_ids) for c in cases]
    assert len(set(questions)) == 2  # two question lengths: the window follows each case's
    monkeypatch.setitem(sys.modules, "kvpress", _fake_kvpress())
    peer = _peer_module()
    for press in ("snapkv", "chunkkv", "finch"):
        job = _job_of(Config("kvpress", "full", None, press, 64, question_aware=True), cases, monkeypatch, tmp_path)
        for item, tokens in zip(job["cases"], questions):
            assert len(item["case"]["question_ids"]) == tokens  # the job carries each case's question
            built, settings = peer.make_press(press, True, len(item["case"]["question_ids"]))
            assert settings["window"] == tokens and settings["window_is"].startswith("the question")
            if press != "finch":  # Finch finds its window at run time, after its delimiter
                assert peer.observed_window(built) == tokens
        if press == "chunkkv":
            assert built.chunk_length == 20 and settings["chunk_length"] == 20
    built, settings = peer.make_press("snapkv", False, 17)
    assert peer.observed_window(built) == 64 and settings["window_is"] == "the context's end"
    built, settings = peer.make_press("keydiff", False, 17)
    assert type(built).__name__ == "BlockPress" and built.block_size == 128 and settings["window"] is None
    with pytest.raises(SystemExit):
        peer.make_press("finch", False, 17)  # Finch reads the question: never run agnostic


def test_snapkv_max15_max_pools_the_windows_scores(monkeypatch):
    """snapkv-max15 is kvpress's SnapKV score with max_pool1d in place of avg_pool1d: by hand, two
    query heads in one KV group, a window of 2 queries over 4 keys, kernel 3 (padding ignored).
    Head 0's window looks at key 1 -> mean [0, 1, 0, 0] -> max-pooled [1, 1, 1, 0]; head 1's at key 3
    (one query, weight 2) -> [0, 0, 0, 1] -> [0, 0, 1, 1]; the group's mean [.5, .5, 1, .5]; the
    window's own 2 keys get the maximum + 1. (kvpress's avg-pool of 3 would give key 0 1/6, not 1/2.)"""
    import torch

    monkeypatch.setitem(sys.modules, "kvpress", _fake_kvpress())
    peer = _peer_module()
    press = peer.max_pooled_snapkv(sys.modules["kvpress"], window=2, kernel=3)
    attentions = torch.zeros(1, 2, 6, 6)
    attentions[0, 0, 4:, 1] = 1.0
    attentions[0, 1, 4, 3] = 2.0
    module = types.SimpleNamespace(config=types.SimpleNamespace(num_attention_heads=2))
    scores = press.score(module, torch.zeros(1, 6, 8), torch.zeros(1, 1, 6, 4), None, attentions, {})
    assert scores.tolist() == [[[0.5, 0.5, 1.0, 0.5, 2.0, 2.0]]]
    built, settings = peer.make_press("snapkv-max15", True, 19)
    assert peer.observed_window(built) == 19 and built.kernel_size == 15 and "max_pool1d kernel 15" in settings["pooling"]


@pytest.mark.kvpress
@pytest.mark.slow  # two kvpress imports in its own virtualenv: ~10 s quiet, ~40 s on a loaded machine
@pytest.mark.skipif(not KVPRESS_PYTHON.exists(), reason="no .venv-kvpress (make kvpress-venv)")
def test_real_kvpress_builds_the_question_window(tokenizer, prose, tmp_path):
    """The same, with kvpress 0.5.5 itself building the presses from a job file."""
    case = make_case(prose, tokenizer, 400, 0.5, 0)
    for press in ("snapkv", "chunkkv"):
        job = {"config": Config("kvpress", "full", None, press, 64, question_aware=True).to_dict(),
               "settings": runner.EvalSettings().key_fields(), "cases": [{"key": "a", "case": case.to_dict()}]}
        path = tmp_path / f"{press}.json"
        path.write_text(json.dumps(job))
        out = subprocess.run([str(KVPRESS_PYTHON), str(PEER), "--describe", str(path)], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
        line = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")][0]
        assert line["window_size"] == len(case.question_ids) == line["window"], out.stderr[-500:]


def test_grid_runs_each_press_as_its_authors_do():
    configs = make_grid(["full"], ["chunk-attention"], [512], 512, ["kvpress"], ["snapkv", "finch", "keydiff"],
                        question_aware=(False, True))
    labels = [c.label for c in configs if c.kind == "kvpress"]
    # Finch only with the question, KeyDiff only without; SnapKV both ways
    assert sorted(labels) == sorted(["kvpress snapkv M=512", "kvpress snapkv M=512 question-aware",
                                     "kvpress finch M=512 question-aware", "kvpress keydiff M=512"])


def test_kept_index_matches_rows_back():
    peer = _peer_module()
    full = torch.randn(3, 50, 8, generator=torch.Generator().manual_seed(0))
    keep = torch.tensor([[7, 8, 30, 2], [40, 1, 9, 8], [3, 4, 5, 6]])  # in cache order, as a press leaves them
    kept = full.gather(1, keep[..., None].expand(-1, -1, 8))
    assert torch.equal(peer.KeptIndex.match(full, kept), keep)
    # answer tokens 7-8: head 0 keeps both, head 1 one of them, head 2 none
    per_layer, whole = peer.retention({0: keep, 1: keep}, range(7, 9))
    assert whole == round(1 / 3, 4) and per_layer == [0.5, 0.5]


def test_peer_drops_the_question_entries_for_the_continuation():
    peer = _peer_module()
    cache = types.SimpleNamespace(layers=[types.SimpleNamespace(keys=torch.arange(12.)[None, None, :, None]
                                                                .expand(1, 2, 12, 4).clone(),
                                                                values=torch.zeros(1, 2, 12, 4))])
    # the press kept these context positions (in cache order); positions >= 100 are the question
    kept = {0: torch.tensor([[100, 3, 5, 101, 7, 9, 102, 11, 13, 103, 15, 17], [1, 100, 101, 2, 102, 4, 5, 103, 6, 8,
                                                                              10, 12]])}
    assert peer.drop_positions(cache, kept, 100)
    assert cache.layers[0].keys.shape[2] == 8
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [1, 2, 4, 5, 7, 8, 10, 11]
    assert cache.layers[0].keys[0, 1, :, 0].tolist() == [0, 3, 5, 6, 8, 9, 10, 11]
    # a press that let a question token go in one head only (SnapKV's pooled window can): the heads
    # hold 8 and 9 document entries, which one cache cannot; nothing is removed and the peer is told
    keys = torch.arange(12.)[None, None, :, None].expand(1, 2, 12, 4).clone()
    cache.layers[0].keys, cache.layers[0].values = keys, torch.zeros(1, 2, 12, 4)
    uneven = {0: torch.tensor([[100, 3, 5, 101, 7, 9, 102, 11, 13, 103, 15, 17], [1, 100, 101, 2, 102, 4, 5, 14, 6, 8,
                                                                               10, 12]])}
    assert not peer.drop_positions(cache, uneven, 100)
    assert torch.equal(cache.layers[0].keys, keys)


# ---- KL and top-1 agreement against the full cache ------------------------------------------
def test_kl_and_top1_by_hand(tmp_path):
    reference = np.log(np.array([[0.5, 0.5], [0.9, 0.1]]))
    mine = np.log(np.array([[0.25, 0.75], [0.9, 0.1]]))
    found = divergence.compare(reference, mine)
    first = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.1438 nats
    assert found["kl"] == pytest.approx(first / 2, abs=1e-6) and found["kl_max"] == pytest.approx(first, abs=1e-6)
    assert found["top1"] == 0.5  # position 0: 0 vs 1; position 1: both 0
    divergence.save_reference(tmp_path / "r.npy", reference)
    assert divergence.score_against(tmp_path / "r.npy", reference)["kl"] == 0.0
    assert divergence.score_against(tmp_path / "none.npy", reference) == {}


@pytest.fixture(scope="module")
def tiny(tokenizer) -> LoadedModel:
    model = make_tiny_model("llama", layers=2, seed=5, vocab_size=len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return LoadedModel(model, tokenizer, "tiny", "cpu", "float32")


def _case(tokenizer, n=300, continuation=12, seed=4) -> dict:
    ids = torch.randint(100, 20000, (n + continuation,), generator=torch.Generator().manual_seed(seed)).tolist()
    question = "What is the magic number for the vault?"
    return {"document_ids": ids[:n], "continuation_ids": ids[n:], "head_ids": prompt_parts(tokenizer).head,
            "question": question, "seed": 0, "passkey_tokens": [150, 153]}


SETTINGS = {"sinks": 4, "window": 32, "max_new_tokens": 2}


def test_kl_is_zero_for_the_full_cache_and_positive_for_a_recency_memory(tiny, tokenizer, tmp_path):
    case = _case(tokenizer)
    path = str(tmp_path / "reference.npy")
    full = run_case(tiny, Config("memstep", "full").to_dict(), SETTINGS, case, {"write": path})
    assert full["kl"] == 0.0 and full["top1"] == 1.0 and full["needle_whole"] == 1.0
    again = run_case(tiny, Config("memstep", "full").to_dict(), SETTINGS, case, {"read": path})
    assert again["kl"] == 0.0  # the full cache against itself, read back from disk
    recency = run_case(tiny, Config("memstep", "fm", None, "recency", 32, 64, "compact").to_dict(), SETTINGS, case,
                       {"read": path})
    assert recency["kl"] > 1e-4 and recency["kl_max"] >= recency["kl"] and 0.0 <= recency["top1"] <= 1.0
    assert recency["needle_whole"] == 0.0  # tokens 150-152 of 300 are far from the last 32
    # the NLL of the continuation is the cross-entropy of the rows the KL was computed from
    logits = np.load(path)
    nll = -float(np.mean([logits[i, t] for i, t in enumerate(case["continuation_ids"])]))
    assert nll == pytest.approx(full["continuation_nll"], abs=1e-4)


# ---- cells from an earlier default pool ------------------------------------------------------
def test_cells_run_at_an_earlier_default_pool_read_as_that_pool(tmp_path):
    """The engine's default question pool was max:15 at weight 0.75, then follow:15 and the tuned recipe (at
    0.75), and is max:15 at weight 1 since 2026-12-07. A stored cell that left pool and weight to the default
    reads as what it recorded, under a key of its own, so today's default runs on that case anew: one from
    before the pool was recorded ran at max:15 and 0.75; a cell that recorded today's default stays the default."""
    aware = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact", True)
    case = {"length": 2048, "depth": 0.5, "seed": 0, "haystack": "h.txt", "start": 0}
    key = "k" * 16
    old = {"key": key, "config": aware.to_dict(), "label": aware.label, **case,
           "settings": {"question_pool": "max:15", "question_weight": 0.75}}
    today = {**old, "key": "t" * 16, "settings": {"question_pool": QUESTION_POOL, "question_weight": 1.0}}
    agnostic = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact")
    plain = {**old, "key": "p" * 16, "config": agnostic.to_dict(), "label": agnostic.label}
    follow = {**old, "key": "f" * 16, "settings": {"question_pool": "follow:15"}}
    unrecorded = {**old, "key": "u" * 16, "settings": None}
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n"
                                                  for c in (old, today, plain, follow, unrecorded)))
    store = ResultStore(tmp_path)
    cells = {c["key"]: c for c in store.cells()}
    assert key not in store and f"{key}-weight-0.75" in store
    migrated = cells[f"{key}-weight-0.75"]  # today's pool, at the weight of its day
    assert "question_pool" not in migrated["config"] and migrated["label"].endswith("weight=0.75")
    assert "question_pool" not in cells["t" * 16]["config"] and cells["t" * 16]["label"] == aware.label
    assert cells["p" * 16]["label"] == agnostic.label  # not question-aware: no pool
    assert cells["f" * 16 + "-weight-0.75-pool-follow:15"]["label"].endswith("pool=follow:15 weight=0.75")
    assert cells["u" * 16 + "-weight-0.75"]["label"].endswith("weight=0.75")


def test_cells_of_the_tuned_recipe_read_as_it_and_a_run_naming_it_finds_them(tmp_path, monkeypatch):
    """The tuned recipe (the default until 2026-12-07, now --question-pool tuned, weight 0.75) runs
    follow:15+fade:0.7/8+lend:0.75+last below M = 256 and follow:15+fade:0.7+heads from 256 up under FM. Cells
    run when it (or the default before it, alike from 256 up) was the default read as it at its weight; a run
    naming it finds them, where they run alike (no case runs twice), and a run of today's default does not.
    Elsewhere (M = 128 at the default before it; IMDC, whose budgets grow through smaller steps) a cell keeps
    its own pool."""
    from memstep.evaluation.grid import alike_keys, cell_key, runs_as_default
    from memstep.question_pool import EARLIER_POOLS, TUNED_POOL

    before, fade = EARLIER_POOLS[1], "follow:15+fade:0.7+heads@256"
    assert (TUNED_POOL, before) == ("follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256",
                                    "follow:15+fade:0.7@256/8+heads@256+last<256")

    def fm(budget, pool=None, schedule="fm", weight=None):
        return Config("memstep", schedule, "linear" if schedule == "imdc" else None, "chunk-attention", budget,
                      512, "compact", True, question_pool=pool, question_weight=weight)

    case = {"length": 2048, "depth": 0.5, "seed": 0, "haystack": "h.txt", "start": 0}
    settings = runner.EvalSettings().key_fields()

    def stored(config, recorded):
        return {"key": cell_key(config, case, settings), "config": config.to_dict(), "label": config.label, **case,
                "settings": {"question_pool": recorded, "question_weight": 0.75}}

    cells = {"tuned-256": stored(fm(256), TUNED_POOL), "before-256": stored(fm(256), before),
             "before-128": stored(fm(128), before), "tuned-128": stored(fm(128), TUNED_POOL),
             "imdc-256": stored(fm(256, fade, "imdc"), fade)}
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells.values()))
    store = ResultStore(tmp_path)
    read = {name: next(c for c in store.cells() if c["key"].startswith(cell["key"])) for name, cell in cells.items()}
    for name in cells:
        assert "weight=0.75" in read[name]["label"] and fm(256).label != read[name]["label"], name
    assert read["tuned-256"]["label"] == fm(256, TUNED_POOL, weight=0.75).label
    assert read["before-128"]["label"].endswith(f"pool={before} weight=0.75")
    assert read["imdc-256"]["label"].endswith(f"pool={fade} weight=0.75")
    assert not runs_as_default(fm(256), TUNED_POOL)

    named = make_grid(["fm"], ["chunk-attention"], [128, 256], 512, ropes=("compact",), question_aware=(True,),
                      question_pools=("tuned",))
    assert [c.label for c in named] == [fm(128, TUNED_POOL, weight=0.75).label, fm(256, TUNED_POOL, weight=0.75).label]
    for config in named:  # found: the recipe's own cells, and at 256 the default before it, which runs alike there
        assert any(key in store for key in alike_keys(config, case, settings)), config.label
    assert not any(key in store for key in alike_keys(fm(256), case, settings))  # today's default runs anew
    calls = []
    monkeypatch.setattr(runner, "run_group", lambda config, *args, **kwargs: calls.append(config.label))
    report = runner.run_grid([*named, fm(256)], [types.SimpleNamespace(length=2048, cell=case)],
                             runner.EvalSettings(), store)
    assert calls == [fm(256).label] and report.skipped == 2


def test_imdc_runs_alike_where_only_the_last_cuts_rules_differ_below_its_budget():
    """IMDC's budget grows through smaller steps, so its pools must match as written, but for the rules
    of the last cut alone (+spans, +last): its last cut keeps M, so two pools whose last-cut rules agree
    at M compute the same (+spans:6x20<256 at M = 512 is no rule at all; +last is one at any M)."""
    from memstep.evaluation.grid import runs_alike

    def imdc(budget):
        return Config("memstep", "imdc", "linear", "chunk-attention", budget, 512, "compact", True)

    base = "follow:15+fade:0.7@256/8+heads@256+lend:0.75"
    spans, last = base + "+spans:6x20<256+last<256", base + "+last<256"
    assert runs_alike(imdc(512), spans, last) and runs_alike(imdc(512), last, base)
    assert not runs_alike(imdc(128), spans, last) and not runs_alike(imdc(128), last, base)
    assert not runs_alike(imdc(512), base + "+last", base)  # +last without <N: the last cut at any M
    assert not runs_alike(imdc(512), base + "+spans:6x20", base)
    assert not runs_alike(imdc(512), "follow:15+fade:0.7@256/8+heads@256+last<256", last)  # lending in earlier cuts


def test_the_anchor_is_todays_default_else_the_earlier_default_pool():
    """Rows are paired with question-aware FM at the engine's default pool; at a length where only
    an earlier default (follow:15, then max:15) ran, with the newest of them (not the agnostic FM)."""
    from memstep.evaluation.metrics import anchor_of

    def row(length, **kw):
        config = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact", kw.pop("aware", True), **kw)
        return {"length": length, "label": config.label, "config": config.to_dict()}

    rows = [row(2048, aware=False), row(2048, question_pool="max:15"), row(2048, question_pool="none"),
            row(2048, span="fixed20-mean-layer"), row(2048),
            row(4096, aware=False), row(4096, question_pool="max:15"), row(4096, question_pool="none"),
            row(4096, question_pool="follow:15"),
            row(8192, aware=False), row(8192, question_pool="mean:5"), row(1024, question_pool="max:15")]
    assert anchor_of(rows, 2048)["config"] == Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact",
                                                      True).to_dict()
    assert anchor_of(rows, 4096)["config"]["question_pool"] == "follow:15"  # the newest earlier default first
    assert anchor_of(rows, 1024)["config"]["question_pool"] == "max:15"
    assert not anchor_of(rows, 8192)["config"].get("question_aware")  # no default, no earlier default: agnostic
    # a grid run under an earlier default (48 cases) beside a few cases of today's (6): the grid's own
    grid = [{**row(512, question_pool="follow:15"), "cells": 48}, {**row(512), "cells": 6}]
    assert anchor_of(grid, 512)["config"]["question_pool"] == "follow:15"
    grid[1]["cells"] = 48  # as many cases: today's default
    assert anchor_of(grid, 512)["config"].get("question_pool") is None


def test_rows_pair_with_the_anchor_at_their_own_budget():
    """Where one length ran at two budgets, each budget has its anchor, and a press is paired with
    memstep's FM at its own M, never across budgets."""
    from memstep.evaluation import metrics

    full = Config("memstep", "full")
    cells = []
    for budget, memstep_right in ((256, False), (512, True)):
        fm = Config("memstep", "fm", None, "chunk-attention", budget, 512, "compact", True)
        press = Config("kvpress", "full", None, "chunkkv", budget, question_aware=True)
        for i in range(6):
            cells += [_fair_cell(fm, i / 6, memstep_right, 0.1), _fair_cell(press, i / 6, True, 0.1)]
    cells += [_fair_cell(full, i / 6, True, 0.0) for i in range(6)]
    summary = metrics.summarize(cells)
    assert sorted(r["config"]["budget"] for r in summary["rows"] if r.get("anchor")) == [256, 512]
    paired = {p["label"]: p["accuracy_difference"] for p in summary["paired"]}
    assert paired["kvpress chunkkv M=256 question-aware"] == 1.0  # against FM at 256, which answers none
    assert paired["kvpress chunkkv M=512 question-aware"] == 0.0  # against FM at 512, which answers all
    assert "fm chunk-attention M=512 compact question-aware" not in paired  # not paired with the M=256 FM


# ---- the ablation switches reach the kept sets ----------------------------------------------
def _kept_steps(lm, config: Config, case: dict) -> list[np.ndarray]:
    return [step.kept_positions for step in document_run(lm, config.to_dict(), SETTINGS, case, case["question"], [])
            .run().steps]


def _kept(lm, config: Config, case: dict) -> np.ndarray:
    return _kept_steps(lm, config, case)[-1]


def test_ablation_switches_change_the_kept_sets(tiny, tokenizer):
    """Each switch changes what some step keeps, and every run ends at M. The weights run at the newest
    earlier default without +last: the default's last cut below 256 entries per head ranks by the question
    alone whatever the weight, and on this tiny case the earlier cuts keep the same sets."""
    from memstep.question_pool import EARLIER_POOLS

    case = _case(tokenizer, n=400, continuation=0)
    aware = lambda **kw: Config("memstep", kw.pop("schedule", "fm"), None, "chunk-attention", 48,  # noqa: E731
                                kw.pop("chunk", 96), "compact", True, None, kw.get("pool"), kw.get("weight"))
    steps = _kept_steps(tiny, aware(), case)
    base = steps[-1]
    before = next(pool for pool in EARLIER_POOLS if "+last" not in pool)

    def differ(one, other):
        return len(one) != len(other) or any(not np.array_equal(a, b) for a, b in zip(one, other))

    for variant in (aware(pool="mean:5"), aware(pool="none"), aware(pool="follow:15"), aware(pool=before),
                    aware(schedule="once", chunk=None)):
        other = _kept_steps(tiny, variant, case)
        assert other[-1].shape == base.shape and differ(other, steps), variant.label
    at_before = _kept_steps(tiny, aware(pool=before, weight=0.75), case)  # its weight of the day
    for weight in (0.25, 1.0):
        assert differ(_kept_steps(tiny, aware(pool=before, weight=weight), case), at_before), weight
    # the engine's defaults written out keep the very same sets as leaving them unset
    assert np.array_equal(_kept(tiny, aware(pool=QUESTION_POOL, weight=1.0), case), base)
    once = document_run(tiny, aware(schedule="once", chunk=None).to_dict(), SETTINGS, case, case["question"], [])
    assert once.schedule.steps == 1 and once.schedule.memory_sizes[-1] == 48


# ---- needles ---------------------------------------------------------------------------------
def test_needle_kinds_are_drawn_per_case_and_answers_match_whole_words(tokenizer, prose):
    for kind in KINDS:
        needle = make_needle(kind, "a-2048-0.5-0")
        assert needle == make_needle(kind, "a-2048-0.5-0") and needle.answer in needle.sentence
        case = make_case(prose, tokenizer, 600, 0.5, 0, kind=kind)
        start, end = case.passkey_tokens
        assert case.kind == kind and needle.answer != "" and tokenizer.decode(
            case.document_ids[start:end]).strip().strip(".") == case.passkey
    template = make_needle("passkey", "x").question
    assert all("magic number" not in make_needle(kind, "x").question for kind in KINDS if kind != "passkey")
    assert "magic number" in template  # the others are phrasings other than the passkey template
    assert answer_matches("The code is 51537.", "51537") and not answer_matches("It is 5121", "51537")
    assert answer_matches("It was Ottoline.", "ottoline") and not answer_matches("Ottolines", "Ottoline")


def test_paired_interval_by_hand():
    # no correlation (both x neither == only_first x only_second): Newcombe's unpaired hybrid interval
    diff, low, high = paired_difference_interval(4, 4, 2, 2)
    p1, p2 = 8 / 12, 6 / 12
    l1, u1 = wilson_interval(8, 12)
    l2, u2 = wilson_interval(6, 12)
    assert diff == pytest.approx(p1 - p2)
    assert low == pytest.approx(p1 - p2 - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2))
    assert high == pytest.approx(p1 - p2 + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))
    # positively correlated pairs: phi from ad - bc shrunk by n/2 (Newcombe's correction)
    diff, low, high = paired_difference_interval(6, 2, 0, 4)
    n, p1, p2 = 12, 8 / 12, 6 / 12
    l1, u1 = wilson_interval(8, 12)
    l2, u2 = wilson_interval(6, 12)
    phi = (6 * 4 - 2 * 0 - n / 2) / math.sqrt(8 * 4 * 6 * 6)
    assert low == pytest.approx(p1 - p2 - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    assert high == pytest.approx(p1 - p2 + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    assert high - low < paired_difference_interval(4, 4, 2, 2)[2] - paired_difference_interval(4, 4, 2, 2)[1]
    low = 1.0 - math.sqrt((1.0 - wilson_interval(10, 10)[0]) ** 2 + wilson_interval(0, 10)[1] ** 2)
    assert paired_difference_interval(0, 10, 0, 0) == pytest.approx((1.0, low, 1.0))  # 10 discordant of 10


# ---- bad input: one line, exit 2, before any model loads ------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--presses", "magic"], "unknown kvpress press 'magic': kvpress 0.5.5 has no such press"),
    (["--presses", "h2o"], "kvpress 0.5.5 has no such press"),
    (["--presses", "tova"], "not wired in memstep's peer"),
    (["--needles", "riddle"], "unknown needle kind 'riddle'"),
    (["--metrics", "bleu"], "unknown metric 'bleu'"),
    (["--question-pools", "max:4"], "question pool 'max:4'"),
    (["--question-weights", "1.5"], "question weights must be in (0, 1]"),
    (["--lengths", "8192", "--haystacks", "SHORT"], "too short for 8192-token cases"),
])
def test_bad_input_is_one_line_exit_2_before_any_model(argv, words, tmp_path, capsys, monkeypatch):
    import memstep.models

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(memstep.models, "load_model", no_model)
    monkeypatch.setattr(runner, "run_grid", no_model)
    short = tmp_path / "short.txt"
    short.write_text("It was a fine day. " * 300)
    argv = [str(short) if a == "SHORT" else a for a in argv]
    assert main(["eval", "--peers", "kvpress", *argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


# ---- summary: counted accuracy, KL rows, paired against the anchor ---------------------------
def _fair_cell(config: Config, depth: float, correct: bool, kl: float, settings=None) -> dict:
    return {"key": f"{config.label}{depth}", "config": config.to_dict(), "label": config.label,
            "peer": config.is_peer, "haystack": "a.txt", "length": 2048, "depth": depth, "seed": 0, "kind": "word",
            "correct": correct, "continuation_nll": 2.0 + kl, "prefill_seconds": 1.0, "seconds": 2.0,
            "peak_rss_bytes": 10, "baseline_rss_bytes": 5, "memory_entries": 516, "retention": [0.5],
            "kl": kl, "top1": 1.0 - kl, "needle_whole": 0.5, "settings": settings}


def test_counted_accuracy_kl_and_paired_rows():
    from memstep.evaluation import metrics, report

    full = Config("memstep", "full")
    anchor = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact", True)
    press = Config("kvpress", "full", None, "snapkv", 512, question_aware=True)
    depths = (0.1, 0.3, 0.5, 0.7)
    cells = [_fair_cell(full, d, d < 0.6, 0.0) for d in depths]  # the full cache answers 0.1, 0.3 and 0.5
    cells += [_fair_cell(anchor, d, ok, kl) for d, ok, kl in zip(depths, (True, True, False, True), (.1, .2, .3, .4))]
    cells += [_fair_cell(press, d, ok, kl, {"window": w, "press": "SnapKVPress", "window_is": "the question"})
              for d, ok, kl, w in zip(depths, (True, False, False, True), (.2, .4, .4, .4), (19, 21, 21, 20))]
    summary = metrics.summarize(cells)
    rows = {r["label"]: r for r in summary["rows"]}
    mine, peer = rows[anchor.label], rows[press.label]
    assert (mine["counted"], mine["counted_correct"]) == (3, 2)  # depth 0.7 answered but not counted
    assert (peer["counted"], peer["counted_correct"]) == (3, 1)
    assert (mine["counted_low"], mine["counted_high"]) == pytest.approx(wilson_interval(2, 3))
    assert mine["kl"] == pytest.approx(0.25) and peer["peer_settings"]["window"] == [19, 21]
    (paired,) = [p for p in summary["paired"] if p["label"] == press.label]
    assert paired["anchor"] == anchor.label and (paired["cases"], paired["counted"]) == (4, 3)
    assert (paired["only_row"], paired["only_anchor"]) == (0, 1)
    assert paired["kl_difference"] == pytest.approx(0.1)  # (0.1 + 0.2 + 0.1 + 0.0) / 4
    text = report.fair_table(summary)
    assert "window 19-21 tokens = the question" in text and "2/3 (67%" in text
    assert any("do not tell them apart" in line for line in report.unsupported(summary))


def test_evaluate_tab_leads_with_the_takeaway_and_the_numbers():
    from memstep.evaluation import metrics
    from ui.tabs import evaluate

    full = Config("memstep", "full")
    anchor = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact", True)
    agnostic = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact")
    cells = []
    for i, depth in enumerate((0.1, 0.2, 0.3, 0.4, 0.5, 0.6)):
        recorded = {"question_pool": QUESTION_POOL, "question_weight": 0.75, "chunk": 512}  # as the worker records them
        cells += [_fair_cell(full, depth, True, 0.0), _fair_cell(anchor, depth, True, 0.05 + i / 100, recorded),
                  _fair_cell(agnostic, depth, False, 0.06 + i / 100)]
    summary = metrics.summarize(cells)
    rows = evaluate.table_rows(summary)
    assert evaluate.FAIR_HEADERS[2].startswith("answered") and evaluate.FAIR_HEADERS[-1] == "settings"
    row = next(r for r in rows if r[1] == anchor.label)
    assert row[2].startswith("6/6") and row[-1] == f"c 512, pool {QUESTION_POOL}, weight 0.75"
    text = evaluate.takeaway(summary)
    assert text.startswith("**Takeaway (2,048 tokens, M = 512).** When the question is known, use question-aware FM")
    assert "0/6" in text and "paired difference +100 points" in text


def test_takeaway_without_kl_for_memstep_says_so():
    """A default row run for answers only (no KL): the takeaway says KL was not measured for it,
    never "paired -", and claims nothing about fidelity."""
    from memstep.evaluation import metrics, report

    full = Config("memstep", "full")
    anchor = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact", True)
    agnostic = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact")
    cells = []
    for i in range(6):
        cells += [_fair_cell(full, i / 6, True, 0.0), _fair_cell(agnostic, i / 6, False, 0.1),
                  {**_fair_cell(anchor, i / 6, True, 0.1), "kl": None, "top1": None}]
    text = report.recommendation(metrics.summarize(cells))
    assert "KL not measured for it" in text and "paired -" not in text and "costs nothing measurable" not in text


def test_takeaway_compares_longer_documents_with_the_press_that_answers_most():
    """Past the takeaway's length, one sentence per length: memstep's question-aware FM against
    the press answering most (not the one closest in KL), paired, with the interval's verdict."""
    from memstep.evaluation import metrics, report

    full = Config("memstep", "full")
    anchor = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact", True)
    agnostic = Config("memstep", "fm", None, "chunk-attention", 512, 512, "compact")
    close = Config("kvpress", "full", None, "snapkv", 512, question_aware=True)
    answering = Config("kvpress", "full", None, "chunkkv", 512, question_aware=True)
    cells = []
    for i in range(12):
        depth = i / 12
        cells += [_fair_cell(full, depth, True, 0.0), _fair_cell(anchor, depth, True, 0.1),
                  _fair_cell(agnostic, depth, False, 0.1)]
        longer = [_fair_cell(full, depth, True, 0.0), _fair_cell(anchor, depth, False, 0.2),
                  _fair_cell(close, depth, False, 0.01), _fair_cell(answering, depth, True, 0.3)]
        for cell in longer:
            cell.update(length=4096, key=cell["key"] + "-4096")
        cells += longer
    summary = metrics.summarize(cells)
    text = report.recommendation(summary)
    assert text.startswith("**Takeaway (2,048 tokens, M = 512).**")
    longer = text.split(" Longer documents: ")[1]
    assert longer.startswith("at 4,096 tokens memstep answers 0/12") and answering.label + " 12/12" in longer
    assert longer.endswith(f"{answering.label} answers more).") and close.label not in longer
    line = next(line for line in report.fair_takeaway(summary) if "4,096 tokens" in line)
    assert close.label in line and answering.label in line  # the closest in KL and the one answering most

    # the press ran on other cases than memstep at 8,192 tokens: said so, not a "-" where the interval goes
    for i in range(4):
        for config, depth in ((full, i / 4), (full, i / 4 + 0.01), (anchor, i / 4), (answering, i / 4 + 0.01)):
            cell = _fair_cell(config, depth, True, 0.1)
            cells.append({**cell, "length": 8192, "key": cell["key"] + "-8192"})
    tail = report.recommendation(metrics.summarize(cells)).split("at 8,192 tokens ")[1]
    assert tail.endswith("(not paired: no counted case in common).") and "paired -" not in tail
