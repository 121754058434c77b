"""LaCo layer collapse: the merge formula and the notebook variant on hand-set weights, the
search's walk on constructed similarities, the layer surgery (config, layer indices, cache),
save/reload, the engine and planner on a collapsed model, baselines, and the CLI's errors.
Tiny random-init models (milliseconds); one slow test runs the CLI on the embedded model."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import make_tiny_model
from transformers import DynamicCache

from memstep.cli import main
from memstep.engine import cache_keyword
from memstep.compress import baselines
from memstep.compress.data import save_model
from memstep.compress.laco import LayerCollapse, check_settings, merge_layers, mergeable, walk
from memstep.compress.layers import LayerInputs, build_model, final_hidden, model_costs, using_layers
from memstep.errors import MemstepError

CALIBRATION = ["a b c d e f g h", "h g f e d c b a a b", "c c d d e e f f"]


def tiny_batches(model, lengths=(12, 9, 15), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.vocab_size, (1, n), generator=gen) for n in lengths]


class ByteTokenizer:
    """Just enough tokenizer for LayerCollapse on a tiny model: one id per character."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(ch) % 128 for ch in text]}


def fill(layer, value: float) -> None:
    with torch.no_grad():
        for p in layer.parameters():
            p.fill_(value)


# ---- the merge --------------------------------------------------------------------------------
def test_paper_merge_on_hand_set_weights():
    """theta_l + sum_k (theta_{l+k} - theta_l): with weights 1, 2, 4, 7 that is
    1 + (2-1) + (4-1) + (7-1) = 11 for every attention and MLP weight; norms stay 1."""
    model = make_tiny_model(layers=4)
    layers = list(model.model.layers)
    for layer, value in zip(layers, (1.0, 2.0, 4.0, 7.0)):
        fill(layer, value)
    merged = merge_layers(layers, "paper")
    names = [n for n, _ in merged.named_parameters()]
    assert any(n.startswith("self_attn.") for n in names) and any(n.startswith("mlp.") for n in names)
    for name, p in merged.named_parameters():
        expected = 11.0 if mergeable(name) else 1.0
        assert torch.all(p == expected), name
    assert all(torch.all(p == 1.0) for p in layers[0].parameters())  # the inputs are not modified


def test_paper_merge_matches_the_formula_on_random_weights_with_biases_and_qk_norms():
    for family, extra in (("qwen2", {}), ("qwen3", {})):
        model = make_tiny_model(family, layers=5, seed=3, **extra)
        layers = list(model.model.layers)[1:4]
        merged = merge_layers(layers, "paper")
        for name, p in merged.named_parameters():
            base = layers[0].get_parameter(name)
            if mergeable(name):
                expected = base + (layers[1].get_parameter(name) - base) + (layers[2].get_parameter(name) - base)
                torch.testing.assert_close(p, expected, rtol=0, atol=1e-6)
            else:
                assert torch.equal(p, base), name
        names = {n for n, _ in merged.named_parameters()}
        if family == "qwen2":
            assert "self_attn.q_proj.bias" in names and mergeable("self_attn.q_proj.bias")
        else:
            assert "self_attn.q_norm.weight" in names and not mergeable("self_attn.q_norm.weight")


def test_notebook_variant_is_the_last_merged_layer_with_the_base_norms():
    model = make_tiny_model(layers=4, seed=1)
    layers = list(model.model.layers)
    merged = merge_layers(layers[:3], "notebook")
    for name, p in merged.named_parameters():
        source = layers[2] if mergeable(name) else layers[0]
        assert torch.equal(p, source.get_parameter(name)), name
    # with C = 2 the paper formula is the same thing: theta_l + (theta_{l+1} - theta_l)
    two = merge_layers(layers[:2], "paper")
    for name, p in two.named_parameters():
        if mergeable(name):
            torch.testing.assert_close(p, layers[1].get_parameter(name), rtol=0, atol=1e-6)


def test_unknown_variant():
    model = make_tiny_model(layers=2)
    with pytest.raises(MemstepError, match="variant"):
        merge_layers(list(model.model.layers), "average")


# ---- the search's walk ------------------------------------------------------------------------
def run_walk(depth, C, L, H, I, T, sims):  # noqa: E741
    calls = []

    def similarity(l, end):  # noqa: E741
        calls.append((l, end))
        return sims.get(l, 0.0)

    return list(walk(depth, C, L, H, I, T, similarity)), calls


def test_walk_accepts_above_T_and_steps_by_I_else_by_one():
    # 12 layers, C=3, from l = 12 - 3 = 9 down to L = 2; accept at 9 and 5 (similarity > 0.5)
    steps, calls = run_walk(12, 3, 2, 12, 2, 0.5, {9: 0.9, 7: 0.5, 6: 0.2, 5: 0.8, 3: 0.49})
    assert [(l, a) for l, _, _, a in steps] == [(9, True), (7, False), (6, False), (5, True), (3, False), (2, False)]
    assert calls[0] == (9, 12)
    # after the merge at 9 the model has 10 layers; the window at 7 is cut at the new top? no: 7..9 fits
    assert calls[1] == (7, 10)
    assert all(l >= 2 for l, _ in calls)  # never below L
    assert steps[1][2] == 0.5 and steps[1][3] is False  # equal to T is not above T


def test_walk_respects_H_and_cuts_windows_at_the_top():
    steps, calls = run_walk(10, 4, 0, 6, 1, 0.5, {2: 0.9, 1: 0.9})
    assert calls[0] == (2, 6)  # l = H - C: layers 6.. are never in the first window
    # accepted at 2 (10 -> 7 layers), then at 1 the window 1..4 covers the merged layer
    assert calls[1] == (1, 5) and [a for *_, a in steps] == [True, True, False]
    steps, calls = run_walk(5, 4, 0, 5, 1, 0.5, {1: 0.9, 0: 0.9})
    assert calls == [(1, 5), (0, 2)]  # after 1..4 merged the model has 2 layers: the window is cut


@pytest.mark.parametrize("C, L, H, I, T, words", [
    (1, 1, 10, 1, 0.5, "C must be at least 2"), (3, 8, 6, 1, 0.5, "L=8 is above H=6"),
    (3, 1, 10, 1, 0.0, "T must be in (0, 1]"), (3, 1, 10, 1, 1.5, "T must be in (0, 1]"),
    (3, 1, 10, 0, 0.5, "I must be at least 1"), (3, 1, 12, 1, 0.5, "above the model's top layer (9"),
    (4, 5, 8, 1, 0.5, "no candidate")])
def test_bad_settings(C, L, H, I, T, words):  # noqa: E741
    with pytest.raises(MemstepError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_settings(C, L, H, I, T, 10)


# ---- the search on a model --------------------------------------------------------------------
def test_search_runs_only_the_changed_layers_and_agrees_with_a_full_forward():
    model = make_tiny_model(layers=6, seed=2)
    batches = tiny_batches(model)
    stack = LayerInputs(model, batches)
    dense = list(model.model.layers)
    for out, full in zip(stack.final, final_hidden(model, batches)):
        torch.testing.assert_close(out, full)
    candidate = dense[:2] + [merge_layers(dense[2:5])] + dense[5:]
    origins = [0, 1, 2, 5]
    with using_layers(model, candidate, origins):
        expected = final_hidden(model, batches)
    assert len(model.model.layers) == 6 and model.config.num_hidden_layers == 6  # restored
    for got, want in zip(stack.final_hidden(candidate, origins, start=2), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        stack.final_hidden(candidate, origins, start=3)  # layer 2 is not the dense one


def test_search_result_is_consistent_and_leaves_the_dense_model_alone():
    model = make_tiny_model(layers=8, seed=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, C=3, L=1, I=1, T=0.05, variant="paper")
    records = list(search)
    result = search.result
    assert records and records[0].index == 7 - 3 and all(r.index >= 1 for r in records)  # H: the top index, 7
    accepted = [r for r in records if r.accepted]
    assert all(r.similarity > 0.05 for r in accepted) and all(r.similarity <= 0.05 for r in records
                                                               if not r.accepted)
    assert result.layers_after == 8 - sum(len(r.layers) - 1 for r in accepted)
    assert sorted(i for g in result.groups for i in g) == list(range(8))  # every layer stands somewhere
    assert len(result.removed) == result.layers_before - result.layers_after
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    collapsed = search.build()
    assert collapsed.config.num_hidden_layers == result.layers_after == len(collapsed.model.layers)
    assert model.config.num_hidden_layers == 8 and len(model.model.layers) == 8
    json.dumps(result.to_dict())  # plain data


def test_search_takes_the_threshold_at_its_word():
    model = make_tiny_model(layers=6, seed=5)
    search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, C=2, L=0, I=1, T=1.0)
    records = list(search)
    assert len(records) == 4 and not any(r.accepted for r in records)  # l = 5 - 2 .. 0; nothing is above 1
    assert search.result.removed == [] and search.result.layers_after == 6
    not_a_decoder = SimpleNamespace(config=SimpleNamespace(model_type="gpt2"))
    with pytest.raises(MemstepError, match="not supported"):
        LayerCollapse(not_a_decoder, ByteTokenizer(), CALIBRATION)


# ---- the collapsed model ----------------------------------------------------------------------
def collapsed_tiny(family="llama", layers=6, removed=(1, 4), **overrides):
    model = make_tiny_model(family, layers=layers, seed=7, **overrides)
    return model, baselines.remove_layers(model, list(removed), info={"method": "test"})


def test_built_model_has_a_consistent_config_layer_indices_and_cache():
    model, small = collapsed_tiny("qwen2", layers=6, removed=(1, 4), use_sliding_window=True, sliding_window=8,
                                  max_window_layers=3)
    assert model.config.layer_types[3:] == ["sliding_attention"] * 3
    assert small.config.num_hidden_layers == 4 and len(small.model.layers) == 4
    assert small.config.layer_types == [model.config.layer_types[i] for i in (0, 2, 3, 5)]
    assert [layer.self_attn.layer_idx for layer in small.model.layers] == [0, 1, 2, 3]
    # a cached, token-by-token forward gives the full forward's logits: the cache layout agrees
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = small(input_ids=ids).logits
        cache, kw = DynamicCache(config=small.config), cache_keyword(small)  # laid out from the collapsed config
        steps = [small(input_ids=ids[:, :6], use_cache=True, **{kw: cache}).logits]
        for t in range(6, 10):
            steps.append(small(input_ids=ids[:, t:t + 1], use_cache=True, **{kw: cache}).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-4)
    assert len(cache.layers) == 4
    # the same as running the dense model's layers 0, 2, 3, 5
    dense_layers = list(model.model.layers)
    with using_layers(model, [dense_layers[i] for i in (0, 2, 3, 5)], [0, 2, 3, 5]), torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, full)


def test_costs_drop_by_the_removed_layers():
    model, small = collapsed_tiny(layers=6, removed=(1, 4))
    dense, after = model_costs(model), model_costs(small)
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert dense["params"] - after["params"] == 2 * per_layer
    assert after["weight_bytes"] == 4 * after["params"]
    assert dense["kv_bytes_per_token"] == 6 * 2 * 2 * 16 * 4 and after["kv_bytes_per_token"] == 4 * 2 * 2 * 16 * 4


def test_baselines_hand_computed():
    assert baselines.uniform_layers(30, 9) == [1, 5, 8, 11, 15, 18, 21, 25, 28]
    assert baselines.uniform_layers(10, 1) == [5]
    assert baselines.lowest_influence([0.5, 0.1, 0.3, 0.1, 0.9], 3) == [1, 2, 3]
    with pytest.raises(MemstepError):
        baselines.uniform_layers(4, 4)
    model = make_tiny_model(layers=4, seed=8)
    scores = LayerInputs(model, tiny_batches(model)).block_influence()
    assert len(scores) == 4 and all(0 <= s <= 2 for s in scores)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A 6-layer random Llama with the embedded model's tokenizer, LaCo-collapsed and saved."""
    from transformers import AutoTokenizer

    from memstep.models import embedded_model_folder

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_folder()))
    except MemstepError as err:
        pytest.skip(str(err))
    model = make_tiny_model(layers=6, seed=9, vocab_size=len(tokenizer), max_position_embeddings=8192)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    search = LayerCollapse(model, tokenizer, ["It was a truth universally acknowledged. " * 4] * 2,
                           C=3, L=2, I=3, T=0.01)  # one merge at most: 6 -> 4 layers
    search.run()
    folder = tmp_path_factory.mktemp("laco") / "tiny-laco"
    collapsed = search.build()
    save_model(collapsed, tokenizer, folder, info=collapsed.config.memstep_compress)
    return folder, collapsed, search.result, model, tokenizer


def test_saved_model_reloads_with_its_layers_and_logits(tiny_folder):
    from transformers import AutoModelForCausalLM

    folder, collapsed, result, _, _ = tiny_folder
    assert result.removed, "the tiny search should collapse something at T=0.01"
    reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert reloaded.config.num_hidden_layers == result.layers_after == len(reloaded.model.layers)
    assert json.loads((folder / "memstep_compress.json").read_text())["removed"] == result.removed
    ids = torch.randint(0, 1000, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, collapsed(input_ids=ids).logits)


def test_collapsed_model_runs_fm_and_imdc_in_the_engine(tiny_folder):
    from memstep.models import load_model
    from memstep.runner import DocumentRun

    folder, _, result, _, tokenizer = tiny_folder
    lm = load_model(str(folder), device="cpu", dtype="float32")
    ids = tokenizer("It is a truth universally acknowledged. " * 60, add_special_tokens=False)["input_ids"][:400]
    for schedule in ("fm", "imdc"):
        run = DocumentRun(lm, ids, schedule=schedule, chunk=64, memory=64, question="What is acknowledged?",
                          max_new_tokens=4)
        records = list(run)
        assert len(records) == run.schedule.steps > 2
        assert run.engine.cache.get_seq_length() <= 64 + 4 + 64
        assert len(run.engine.cache.layers) == result.layers_after
        assert run.result.answer is not None


def test_planner_takes_the_collapsed_folder(tiny_folder, capsys):
    from memstep import planner

    folder, _, result, model, _ = tiny_folder
    shape = planner.resolve_model(str(folder), "fp32")
    dense = planner.resolve_model(model.config.to_dict(), "fp32")
    assert shape.layers == result.layers_after < dense.layers
    assert shape.kv_bytes_per_token * dense.layers == dense.kv_bytes_per_token * shape.layers
    code = main(["plan", "--model", str(folder), "--gpu", "l4", "--tokens", "4096", "--chunk", "512",
                 "--memory", "512", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["model"]["layers"] == result.layers_after


# ---- the command line -------------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["--C", "1"], "C must be at least 2"), (["--L", "9", "--H", "5"], "L=9 is above H=5"),
    (["--T", "0"], "T must be in (0, 1]"), (["--T", "1.2"], "T must be in (0, 1]"),
    (["--I", "0"], "I must be at least 1"), (["--calibration", "/nonexistent.txt"], "File not found"),
    (["--variant", "mean"], "invalid choice"), (["--passkey-cases", "0"], "--passkey-cases must be at least 1")])
def test_cli_bad_parameters_exit_2_with_one_line(capsys, argv, words):
    code = main(["compress", "laco", *argv])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memstep: error:") and words in lines[0], err


def test_cli_rejects_an_unsupported_model_and_H_above_the_depth(tiny_folder, tmp_path, capsys):
    folder = tiny_folder[0]
    code = main(["compress", "laco", "--model", str(folder), "--H", "40", "--no-eval", "--quiet"])
    _, err = capsys.readouterr()
    assert code == 2 and "above the model's" in err and len(err.strip().splitlines()) == 1
    config = json.loads((folder / "config.json").read_text())
    other = tmp_path / "gpt2ish"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    code = main(["compress", "laco", "--model", str(other), "--no-eval", "--quiet"])
    _, err = capsys.readouterr()
    assert code == 2 and "not supported" in err and len(err.strip().splitlines()) == 1


def test_cli_runs_search_measures_and_saves_on_a_tiny_model(tiny_folder, tmp_path, capsys):
    """The seeded tiny model's LaCo is worse than block influence: refused (exit 1, no folder, one
    stderr line with both perplexities and the flag), then saved with --keep-worse, which says so."""
    folder = tiny_folder[0]
    out_folder = tmp_path / "again"
    argv = ["compress", "laco", "--model", str(folder), "--C", "2", "--L", "0", "--I", "1", "--T", "0.01",
            "--passkey-cases", "1", "--passkey-tokens", "200", "--prefill-tokens", "128", "--sentences", "2",
            "--perplexity-windows", "2", "--calibration-tokens", "16", "--output", str(out_folder), "--json", "--quiet"]
    code = main(argv)
    out, err = capsys.readouterr()
    report = json.loads(out)
    models = report["models"]
    laco, baseline = models["laco-paper"]["perplexity"], models["block-influence"]["perplexity"]
    assert laco > baseline and report["guard"]["worse"]  # this seed's merge is worse than dropping
    last = err.strip().splitlines()[-1]
    assert code == 1 and not out_folder.exists() and report["saved"] is None, err
    assert last.startswith("memstep: not saved: ") and "--keep-worse" in last
    assert f"{laco:,.2f}" in last and f"{baseline:,.2f}" in last and last == f"memstep: {report['refused']}"
    code = main(argv + ["--keep-worse"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["refused"] is None and report["kept_worse"].startswith("saved although the check finds it worse")
    assert f"{laco:,.2f}" in report["kept_worse"] and "--keep-worse" in report["kept_worse"]
    search = report["searches"]["paper"]
    assert search["candidates"] and search["layers_after"] < search["layers_before"]
    models = report["models"]
    assert set(models) == {"dense", "laco-paper", "block-influence", "uniform"}
    removed = len(search["removed"])
    assert len(models["block-influence"]["removed"]) == len(models["uniform"]["removed"]) == removed
    for key in ("laco-paper", "block-influence", "uniform"):
        assert models[key]["layers"] == models["dense"]["layers"] - removed
        assert models[key]["kv_bytes_per_token"] < models["dense"]["kv_bytes_per_token"]
        assert models[key]["perplexity"] > 0 and 0 <= models[key]["passkey_accuracy"] <= 1
    assert report["saved"] == str(out_folder) and (out_folder / "config.json").is_file()


def test_cli_no_eval_never_saves_unchecked(tiny_folder, tmp_path, capsys):
    """--no-eval keeps the check: dense, LaCo and block influence on a few held-out windows. The
    seeded tiny model's merge is worse: nothing saved, exit 1, one line; --keep-worse saves it and
    says so. The help says that the check still runs."""
    out_folder = tmp_path / "unchecked"
    argv = ["compress", "laco", "--model", str(tiny_folder[0]), "--C", "2", "--L", "0", "--I", "1", "--T", "0.01",
            "--sentences", "2", "--calibration-tokens", "16", "--no-eval", "--output", str(out_folder), "--quiet"]
    code = main(argv)
    out, err = capsys.readouterr()
    refusal = [line for line in out.splitlines() if line.startswith("not saved: ")]
    assert code == 1 and not out_folder.exists() and "saved to" not in out, out
    assert len(refusal) == 1 and "--keep-worse saves it anyway" in refusal[0]
    assert re.search(r"perplexity [\d,.]+ against [\d,.]+ \(dense [\d,.]+\)", refusal[0])
    assert err.strip().splitlines()[-1] == f"memstep: {refusal[0]}"
    assert "check only (--no-eval): perplexity on 1024 held-out tokens" in out
    assert "block influence (ShortGPT)" in out and "uniform removal" not in out and "passkey " not in out
    code = main(argv + ["--keep-worse"])
    out, err = capsys.readouterr()
    assert code == 0 and (out_folder / "config.json").is_file(), err
    assert re.search(r"^saved although the check finds it worse \(--keep-worse\): .* perplexity [\d,.]+ against",
                     out, re.M) and f"saved to {out_folder}" in out
    with pytest.raises(SystemExit):
        main(["compress", "laco", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "the check still runs (held-out perplexity of the dense model, LaCo and block influence" in help_text
    assert "--keep-worse" in help_text


def test_cli_prints_the_table_with_both_baselines(tiny_folder, capsys):
    """A short real search (C=2) printed as a table: LaCo's row, block influence and uniform
    removal, with perplexities (the embedded model's CLI run is test_cli_defaults_...)."""
    code = main(["compress", "laco", "--model", str(tiny_folder[0]), "--C", "2", "--L", "0", "--I", "1",
                 "--T", "0.01", "--sentences", "2", "--calibration-tokens", "16", "--passkey-cases", "1",
                 "--passkey-tokens", "200", "--prefill-tokens", "128", "--perplexity-windows", "1", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(r"LaCo \(paper\) on \S+: 4 -> [1-3] layers", out), out
    assert "block influence (ShortGPT)" in out and "uniform removal" in out and "perplexity" in out


def test_variants_with_the_same_weights_share_their_measurements(tiny_folder):
    """At C=2 the paper's formula and the notebook's give the same weights (within float
    rounding): the second variant reuses the first one's row instead of measuring again."""
    from memstep.compress.collapse_run import CollapseRun
    from memstep.compress.quality import make_probe
    from memstep.models import LoadedModel

    _, _, _, model, tokenizer = tiny_folder
    lm = LoadedModel(model, tokenizer, "tiny", "cpu", "float32")
    probe = make_probe(tokenizer, windows=1, passkey_cases=1, passkey_tokens=200, prefill_tokens=64)
    run = CollapseRun(lm, ["It was a truth universally acknowledged. " * 4] * 2, variants=("paper", "notebook"),
                      probe=probe, baselines=False, C=2, L=0, I=1, T=0.01)
    events = list(run)
    models = run.report["models"]
    assert run.report["searches"]["paper"]["removed"] == run.report["searches"]["notebook"]["removed"] != []
    assert models["laco-notebook"]["same_as"] == "laco-paper"
    assert 0 <= models["laco-notebook"]["max_weight_difference"] <= 1e-5
    assert models["laco-notebook"]["perplexity"] == models["laco-paper"]["perplexity"]
    # dense, paper, notebook (reused) and block influence: the guard's baseline is always measured
    assert [e["event"] for e in events].count("model") == 4 and events[-1]["event"] == "done"
    assert "uniform" not in models and run.report["guard"]["baseline"] == "block influence (ShortGPT)"


# ---- the paper's code: a real merge by default, its L/H, special tokens, chained vs one RDSC ----
class BosTokenizer(ByteTokenizer):
    """Adds a BOS id (127) in front when asked for special tokens, as Llama's tokenizer does."""

    def __call__(self, text, add_special_tokens=True):
        ids = super().__call__(text)["input_ids"]
        return {"input_ids": ([127] if add_special_tokens else []) + ids}


def always_similar(monkeypatch):
    from memstep.compress import laco

    monkeypatch.setattr(laco, "mean_similarity", lambda reference, candidate: 1.0)


def test_default_merge_is_a_real_merge_unlike_every_original_layer(monkeypatch):
    """With the defaults (C >= 3, paper formula) the merged layer is none of the layers it stands
    for, nor any other original layer: C = 2 would copy the upper one."""
    from memstep.compress.laco import DEFAULTS

    assert DEFAULTS["C"] >= 3
    always_similar(monkeypatch)  # accept the first candidate, whatever a tiny random model scores
    model = make_tiny_model(layers=6, seed=11)
    search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, **{k: v for k, v in DEFAULTS.items() if k != "T"},
                           T=0.5)
    first = next(iter(search))
    assert first.accepted and len(first.merged) == DEFAULTS["C"]
    merged = search.layers[first.index]
    originals = list(model.model.layers)
    for name, p in merged.named_parameters():
        if mergeable(name):
            for i, layer in enumerate(originals):  # both (every) member of its group, and every other layer
                assert (p - layer.get_parameter(name)).abs().max() > 1e-3, (name, i)


def test_C2_warns_that_rdsc_keeps_the_upper_layer(capsys, tiny_folder):
    from memstep.compress.laco import C2_WARNING, settings_warnings

    assert settings_warnings(2) == [C2_WARNING] and settings_warnings(3) == []
    model = make_tiny_model(layers=4, seed=1)
    search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, C=2, L=0, T=1.0)
    search.run()
    assert search.result.warnings == [C2_WARNING]
    code = main(["compress", "laco", "--model", str(tiny_folder[0]), "--C", "2", "--T", "1", "--no-eval", "--quiet",
                 "--sentences", "1", "--calibration-tokens", "8"])
    out, err = capsys.readouterr()
    assert code == 0 and err.count("memstep: warning: C = 2: RDSC then reduces to keeping the upper layer") == 1
    assert "warning: C = 2" in out


def test_H_and_L_follow_the_notebook():
    """HIGHEST_LAY is an index: the first window is H-C .. H-1 (the top layer is left out);
    LOWEST_LAY defaults to 0; H = depth lets the first window reach the top."""
    model = make_tiny_model(layers=8, seed=2)
    search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, C=3, T=1.0)
    records = list(search)
    assert search.H == 7 and records[0].layers == [4, 5, 6] and records[-1].layers == [0, 1, 2]
    search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, C=3, H=8, T=1.0)
    assert next(iter(search)).layers == [5, 6, 7]


def test_calibration_is_tokenized_as_the_models_own_input():
    from memstep.compress.layers import calibration_batches

    batches = calibration_batches(BosTokenizer(), ["abc", "de"], 3, "cpu")
    assert [b.tolist() for b in batches] == [[[127, 97, 98]], [[127, 100, 101]]]  # BOS first, then cut to 3


def test_chained_merges_differ_from_one_rdsc_over_the_run(monkeypatch):
    """Two accepted windows (2,3,4) then (1, merged 2, 5): chained, the merged layer is
    theta_1 + (M - theta_1) + (theta_5 - theta_1) with M = theta_2 + (theta_3 - theta_2) + (theta_4 - theta_2);
    one RDSC over 1..5 is theta_1 + sum_k (theta_k - theta_1); chained - run = 2 (theta_1 - theta_2)."""
    always_similar(monkeypatch)
    model = make_tiny_model(layers=6, seed=4)
    t = [{n: p.detach().clone() for n, p in layer.named_parameters()} for layer in model.model.layers]
    results = {}
    for merge in ("chained", "run"):
        search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, C=3, L=1, H=5, I=1, T=0.5, merge=merge)
        records = list(search)
        assert [r.merged for r in records] == [[2, 3, 4], [1, 2, 3, 4, 5]]
        results[merge] = (search.layers[1], search.result)
    chained, run = results["chained"][0], results["run"][0]
    for name, p in chained.named_parameters():
        if mergeable(name):
            m = t[2][name] + (t[3][name] - t[2][name]) + (t[4][name] - t[2][name])
            torch.testing.assert_close(p, t[1][name] + (m - t[1][name]) + (t[5][name] - t[1][name]), rtol=0, atol=1e-5)
            whole = t[1][name] + sum(t[k][name] - t[1][name] for k in (2, 3, 4, 5))
            torch.testing.assert_close(run.get_parameter(name), whole, rtol=0, atol=1e-5)
            torch.testing.assert_close(p - run.get_parameter(name), 2 * (t[1][name] - t[2][name]), rtol=0, atol=1e-5)
    largest = max((2 * (t[1][n] - t[2][n])).abs().max().item() for n in t[1] if mergeable(n))
    assert results["chained"][1].chain_difference == pytest.approx({1: largest}, abs=1e-5)
    assert results["run"][1].chain_difference == {1: 0.0}
    assert results["run"][1].settings["merge"] == "run"


@pytest.mark.slow
def test_cli_defaults_on_the_embedded_model_merge_for_real(tmp_path, capsys, embedded):
    """`memstep compress laco` with its search defaults: the saved merged layer differs from every
    original layer, the members of its group included. --no-eval still checks it against block
    influence (it is worse on this model), so saving it takes --keep-worse, and the report says so."""
    from safetensors.torch import load_file

    out_folder = tmp_path / "laco-default"
    # the search's defaults (C, L, H, I, T, variant, reference, merge) on 2 of its 6 calibration
    # paragraphs, 64 tokens each (a quarter of the search's work; a merge of three layers either way)
    code = main(["compress", "laco", "--no-eval", "--quiet", "--output", str(out_folder), "--json",
                 "--sentences", "2", "--calibration-tokens", "64", "--keep-worse"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    models = report["models"]
    assert report["probe"]["check_only"] and set(models) == {"dense", "laco-paper", "block-influence"}
    assert report["guard"]["worse"] and models["laco-paper"]["perplexity"] > models["block-influence"]["perplexity"]
    assert report["kept_worse"].startswith("saved although the check finds it worse (--keep-worse)")
    search = report["searches"]["paper"]
    assert search["settings"]["C"] >= 3 and search["merges"], search["candidates"]
    dense = embedded.model.state_dict()  # the session's load (tests/conftest.py)
    saved = {}
    for path in out_folder.glob("*.safetensors"):
        saved.update(load_file(str(path)))
    groups = search["groups"]
    for new_index, group in enumerate(groups):
        if len(group) < 2:
            continue
        for part in ("self_attn.q_proj.weight", "mlp.down_proj.weight"):
            merged = saved[f"model.layers.{new_index}.{part}"]
            for original in range(search["layers_before"]):
                assert (merged - dense[f"model.layers.{original}.{part}"]).abs().max() > 1e-3, (group, original, part)
