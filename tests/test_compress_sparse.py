"""Pruning with reconstruction (memstep compress sparse): masks reach the requested sparsity and
N:M pattern, Wanda and SparseGPT on hand-made layers, BR and GP on a tiny model (zeros stay zeros),
every block pruned, self-generated calibration (a pool of texts, windows at random offsets), epochs
over every window (added windows add steps), saving keeps the zeros, bad parameters."""

from __future__ import annotations

import copy
import math
import random
import re

import pytest
import torch
from conftest import make_tiny_model

from memstep.compress.sparse import SparseConfig, SparsePruning
from memstep.compress.sparse import process as process_module
from memstep.compress.sparse.blocks import (decoder_layers, embed, layer_kwargs, linear_layers,
                                            normalized_error, run_block)
from memstep.compress.sparse.calibration import (draw_windows, first_token_pool, self_generated_texts,
                                                 self_generated_windows)
from memstep.compress.sparse.masks import (Pattern, magnitude_mask, parse_nm, sparsegpt_prune, wanda_mask,
                                           wanda_scores)
from memstep.compress.sparse.reconstruct import TrainOptions, train_blocks, train_layer
from memstep.errors import MemstepError
from memstep.models import LoadedModel

FAST = dict(samples=4, seq_len=24, held_out_samples=2, steps=6, batch_size=2, lr=3e-3)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from memstep import models

    try:
        return AutoTokenizer.from_pretrained(str(models.embedded_model_folder()))
    except MemstepError as err:
        pytest.skip(str(err))


def tiny_lm(tokenizer, layers=3, seed=0) -> LoadedModel:
    model = make_tiny_model("llama", layers=layers, seed=seed, vocab_size=len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return LoadedModel(model, tokenizer, "tiny", "cpu", "float32")


def zeros_by_matrix(model) -> dict:
    return {(i, name): (lin.weight == 0).clone() for i, block in enumerate(decoder_layers(model))
            for name, lin in linear_layers(block).items()}


# ---- masks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("sparsity", [0.5, 0.3, 0.75])
def test_unstructured_masks_reach_the_requested_sparsity_exactly(sparsity):
    torch.manual_seed(0)
    w, x = torch.randn(24, 256), torch.randn(64, 256)
    pattern = Pattern(sparsity=sparsity)
    assert int((~magnitude_mask(w, pattern)).sum()) == round(sparsity * w.numel())
    wanda = wanda_mask(w, x.norm(dim=0), pattern)
    assert ((~wanda).sum(dim=1) == round(sparsity * 256)).all()  # Wanda: within every output row
    new, keep = sparsegpt_prune(w, x.T @ x / 64, pattern, block_columns=128)
    for start in (0, 128):  # SparseGPT: within every block of columns
        assert int((~keep[:, start:start + 128]).sum()) == round(sparsity * 24 * 128)
    assert torch.equal(new == 0, ~keep)


@pytest.mark.parametrize("nm", ["2:4", "4:8", "1:4"])
def test_nm_masks_respect_every_group(nm):
    torch.manual_seed(1)
    pattern = parse_nm(nm)
    w, x = torch.randn(16, 64), torch.randn(40, 64)
    masks = [magnitude_mask(w, pattern), wanda_mask(w, x.norm(dim=0), pattern),
             sparsegpt_prune(w, x.T @ x / 40, pattern, block_columns=32)[1]]
    for keep in masks:
        groups = keep.reshape(16, 64 // pattern.m, pattern.m).sum(dim=-1)
        assert (groups == pattern.n).all()
        assert math.isclose(float((~keep).float().mean()), 1 - pattern.n / pattern.m)


def test_wanda_scores_on_a_hand_made_layer():
    w = torch.tensor([[1.0, -2.0], [10.0, 20.0]])
    x = torch.tensor([[3.0, 0.0], [4.0, 1.0]])  # column norms: 5 and 1
    assert torch.allclose(wanda_scores(w, x.norm(dim=0)), torch.tensor([[5.0, 2.0], [50.0, 20.0]]))
    keep = wanda_mask(w, x.norm(dim=0), Pattern(sparsity=0.5))
    # compared within each row: row 0 drops its second weight (2 < 5), row 1 too (20 < 50),
    # although a whole-matrix threshold would have dropped both of row 0
    assert keep.tolist() == [[True, False], [True, False]]
    assert magnitude_mask(w, Pattern(sparsity=0.5)).tolist() == [[False, False], [True, True]]


def test_wanda_in_the_process_uses_each_layer_input_norms(tokenizer):
    model = tiny_lm(tokenizer, layers=1).model
    kwargs = layer_kwargs(model, 12)
    x = embed(model, torch.randint(0, 1000, (3, 12)).tolist())
    block = decoder_layers(model)[0]
    seen = {}
    handle = block.mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0].detach()))
    _, grams, _ = process_module._collect_inputs(block, x, kwargs, 0, 8, want_grams=True, keep_inputs=False)
    handle.remove()
    norms = seen["x"].reshape(-1, seen["x"].shape[-1]).norm(dim=0)  # L2 norm of each input feature over tokens
    expected = wanda_mask(block.mlp.down_proj.weight, norms, Pattern(sparsity=0.5))
    masks = process_module.prune_block(block, grams, 36, SparseConfig(method="wanda"))
    assert torch.equal(masks["mlp.down_proj"], expected)
    assert torch.equal(block.mlp.down_proj.weight == 0, ~expected)


def test_sparsegpt_update_lowers_the_output_error_versus_plain_masking():
    torch.manual_seed(2)
    x = torch.randn(512, 8) @ torch.randn(8, 32) + 0.1 * torch.randn(512, 32)  # correlated input features
    w = torch.randn(16, 32)
    new, keep = sparsegpt_prune(w, x.T @ x / 512, Pattern(sparsity=0.5), block_columns=32)
    updated = ((x @ (new - w).T) ** 2).sum()
    masked_only = ((x @ (w * keep - w).T) ** 2).sum()  # the same mask without the OBS update
    assert updated < 0.2 * masked_only
    best = torch.zeros_like(w)  # the least-squares optimum for this mask bounds it from below
    for row in range(16):
        best[row, keep[row]] = torch.linalg.lstsq(x[:, keep[row]], x @ w[row]).solution
    assert updated >= ((x @ (best - w).T) ** 2).sum() * 0.999
    assert torch.equal(new == 0, ~keep)


def test_parse_nm_and_bad_patterns():
    assert parse_nm("2:4") == Pattern(n=2, m=4)
    for bad in ("4:4", "5:4", "0:4", "2-4", "a:b"):
        with pytest.raises(MemstepError):
            parse_nm(bad)
    for sparsity in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(MemstepError, match="between 0 and 1"):
            Pattern(sparsity=sparsity).validate()


# ---- reconstruction ------------------------------------------------------------------------

def test_br_lowers_a_block_error_and_keeps_zeros(tokenizer):
    lm = tiny_lm(tokenizer)
    model = lm.model
    windows = torch.randint(0, 1000, (6, 24)).tolist()
    kwargs = layer_kwargs(model, 24)
    x = embed(model, windows)
    block = decoder_layers(model)[0]
    target = run_block([block], x, kwargs, 0)
    masks = {name: magnitude_mask(lin.weight, Pattern(sparsity=0.5)) for name, lin in linear_layers(block).items()}
    with torch.no_grad():
        for name, lin in linear_layers(block).items():
            lin.weight.mul_(masks[name])
    zeros_before = {name: (lin.weight == 0).clone() for name, lin in linear_layers(block).items()}
    before = normalized_error(run_block([block], x, kwargs, 0), target)
    losses = train_blocks([block], 0, kwargs, [masks], x, target, TrainOptions(lr=3e-3, steps=15, batch_size=3))
    after = normalized_error(run_block([block], x, kwargs, 0), target)
    assert after < 0.7 * before and losses[-1] < losses[0]
    for name, lin in linear_layers(block).items():
        assert torch.equal(lin.weight == 0, zeros_before[name])  # zeros stay zeros, nothing else becomes 0
        assert not lin.weight.requires_grad


def test_lr_fits_a_layer_to_the_dense_output_and_keeps_zeros():
    torch.manual_seed(3)
    lin = torch.nn.Linear(32, 8, bias=False)
    dense = lin.weight.detach().clone()
    x = torch.randn(10, 20, 4) @ torch.randn(4, 32) + 0.1 * torch.randn(10, 20, 32)  # correlated features
    keep = magnitude_mask(dense, Pattern(sparsity=0.5))
    with torch.no_grad():
        lin.weight.mul_(keep)
    err = lambda: float(((x @ (lin.weight.detach() - dense).T) ** 2).sum() / ((x @ dense.T) ** 2).sum())  # noqa: E731
    before = err()
    losses = train_layer(lin, dense, x, keep, TrainOptions(lr=1e-2, steps=40, batch_size=10))
    assert err() < 0.8 * before and math.isclose(losses[0], before, rel_tol=1e-4)  # full batch: the same error
    assert torch.equal(lin.weight == 0, ~keep) and not lin.weight.requires_grad


def test_gp_inputs_come_from_the_pruned_model_and_targets_from_the_dense_one(tokenizer, monkeypatch):
    dense_model = make_tiny_model("llama", layers=3, seed=0, vocab_size=len(tokenizer))  # tiny_lm's weights
    calls = []
    real = process_module.train_blocks

    def spy(blocks, first, kwargs, masks, x, target, options):
        calls.append((first, len(blocks), x.clone(), target.clone()))
        return real(blocks, first, kwargs, masks, x, target, options)

    monkeypatch.setattr(process_module, "train_blocks", spy)
    for reconstruct in ("br+gp", "br"):
        calls.clear()
        lm = tiny_lm(tokenizer)
        run = SparsePruning(lm, SparseConfig(method="magnitude", reconstruct=reconstruct, **FAST))
        records = iter(run)
        next(records)  # block 0 pruned and reconstructed
        pruned_block0 = decoder_layers(lm.model)[0]
        next(records)  # block 1
        first, count, x, target = calls[1]
        assert (first, count) == (1, 1)
        from memstep.compress.sparse.calibration import calibration_windows

        windows = calibration_windows(lm.model, tokenizer, "text", FAST["samples"], FAST["seq_len"])
        kwargs = layer_kwargs(dense_model, FAST["seq_len"])
        emb = embed(dense_model, windows)
        pruned_in = run_block([pruned_block0], emb, kwargs, 0)
        assert torch.allclose(x, pruned_in, atol=1e-5)  # inputs: the pruned model's
        dense_layers = decoder_layers(dense_model)
        if reconstruct == "br+gp":  # targets: the dense model's own hidden states after block 1
            expected = run_block(dense_layers[:2], emb, kwargs, 0)
        else:  # BR: the dense block 1 on the pruned model's inputs
            expected = run_block([dense_layers[1]], pruned_in, kwargs, 1)
        assert torch.allclose(target, expected, atol=1e-5)
    assert not torch.allclose(run_block(dense_layers[:2], emb, kwargs, 0),
                              run_block([dense_layers[1]], pruned_in, kwargs, 1), atol=1e-4)


def test_cr_trains_overlapping_windows_of_two_blocks(tokenizer, monkeypatch):
    calls = []
    real = process_module.train_blocks

    def spy(blocks, first, kwargs, masks, x, target, options):
        calls.append((first, len(blocks)))
        return real(blocks, first, kwargs, masks, x, target, options)

    monkeypatch.setattr(process_module, "train_blocks", spy)
    run = SparsePruning(tiny_lm(tokenizer), SparseConfig(method="wanda", reconstruct="br+gp+cr", **FAST))
    records = list(run)
    # as the reference's rounds -1 .. blocks-1: block 0 alone, the overlapping windows, the last block alone
    assert calls == [(0, 1), (0, 2), (1, 2), (2, 1)] and len(calls) == len(records) + 1
    assert [r.window for r in records] == [[0], [0, 1], [1, 2]]
    assert [r.steps for r in records] == [[[0]], [[0, 1]], [[1, 2], [2]]]


def test_cr_last_step_trains_the_last_block_on_the_final_inputs(tokenizer, monkeypatch):
    """The last block alone: inputs from block 1 as the window (1, 2) left it, target the dense
    model's hidden state after block 2."""
    dense = make_tiny_model("llama", layers=3, seed=0, vocab_size=len(tokenizer))
    seen = []
    real = process_module.train_blocks

    def spy(blocks, first, kwargs, masks, x, target, options):
        losses = real(blocks, first, kwargs, masks, x, target, options)
        seen.append((first, len(blocks), x.clone(), target.clone(), [copy.deepcopy(b) for b in blocks]))
        return losses

    monkeypatch.setattr(process_module, "train_blocks", spy)
    lm = tiny_lm(tokenizer)
    run = SparsePruning(lm, SparseConfig(method="magnitude", reconstruct="br+gp+cr", **FAST))
    list(run)
    first, count, x, target, _ = seen[-1]
    assert (first, count) == (2, 1)
    window_input, block1_after_window = seen[-2][2], seen[-2][4][0]
    kwargs = layer_kwargs(dense, FAST["seq_len"])
    torch.testing.assert_close(x, run_block([block1_after_window], window_input, kwargs, 1))
    emb = embed(dense, run.calibration.windows)
    torch.testing.assert_close(target, run_block(decoder_layers(dense)[:3], emb, kwargs, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("train", ["norms", "linear"])
def test_train_norms_changes_the_rmsnorm_gains(tokenizer, train):
    lm = tiny_lm(tokenizer, layers=2)
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters() if "layernorm" in n}
    assert len(before) == 4
    list(SparsePruning(lm, SparseConfig(method="wanda", reconstruct="br+gp", train_params=train, **FAST)))
    after = dict(lm.model.named_parameters())
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed == (list(before) if train == "norms" else [])
    assert lm.model.model.norm.weight.eq(1).all()  # the final norm is no block's: never trained


# ---- the whole process -----------------------------------------------------------------------

@pytest.mark.parametrize("reconstruct", ["none", "lr", "br+gp+cr"])
def test_every_block_is_pruned(tokenizer, reconstruct):
    lm = tiny_lm(tokenizer, layers=3)
    run = SparsePruning(lm, SparseConfig(method="sparsegpt", nm="2:4", reconstruct=reconstruct, **FAST))
    records = list(run)
    assert [r.block for r in records] == [0, 1, 2]
    for i, block in enumerate(decoder_layers(lm.model)):
        for name, lin in linear_layers(block).items():
            groups = (lin.weight != 0).reshape(lin.weight.shape[0], -1, 4).sum(-1)
            assert (groups <= 2).all() and float((lin.weight == 0).float().mean()) >= 0.5, (i, name)
    assert run.result.sparsity >= 0.5 and len(run.result.matrices) == 3 * 7
    for key in ("calibration", "held_out"):
        assert all(math.isfinite(v) for v in run.result.perplexity[key].values())
    assert lm.model.model.embed_tokens.weight.ne(0).all() and lm.model.lm_head.weight.ne(0).all()


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_other_families_run_block_by_block(tokenizer, family):
    model = make_tiny_model(family, layers=2, vocab_size=len(tokenizer))
    run = SparsePruning(LoadedModel(model, tokenizer, family, "cpu", "float32"),
                        SparseConfig(method="wanda", reconstruct="br+gp", **FAST))
    records = list(run)
    assert len(records) == 2 and run.result.sparsity == 0.5
    assert all(math.isfinite(r.error_calibration) and r.error_calibration < r.error_calibration_masked
               for r in records[:1])


def test_reconstruction_lowers_the_error_against_no_reconstruction(tokenizer):
    finals = {}
    for reconstruct in ("none", "br", "br+gp"):
        run = SparsePruning(tiny_lm(tokenizer), SparseConfig(method="magnitude", reconstruct=reconstruct, **FAST))
        records = list(run)
        finals[reconstruct] = records[-1].error_calibration
        if reconstruct == "none":
            assert all(r.error_calibration == r.error_calibration_masked for r in records)
        else:  # block 0 has the same inputs and mask in every run: reconstruction alone lowers its error
            assert records[0].error_calibration < records[0].error_calibration_masked
    assert finals["br"] < finals["none"] and finals["br+gp"] < finals["none"]


def test_self_generated_calibration_comes_from_the_model(tokenizer):
    lm = tiny_lm(tokenizer, layers=1)
    model = lm.model
    with torch.no_grad():  # rig the model: after any token it can only say 7 or 8
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[7, 0], model.lm_head.weight[8, 0] = 1e4, -1e4
    # a pool of 5 texts of 48 tokens (one per window); each text's first token is a random start
    texts = self_generated_texts(model, tokenizer, 5, length=48, seed=3, batch_size=2)
    assert len(texts) == 5 and all(len(t) == 48 for t in texts)
    pool = set(first_token_pool(tokenizer, model.config.vocab_size).tolist())
    assert all(t[0] in pool for t in texts) and len({t[0] for t in texts}) > 1  # random first tokens
    # the rigged model's own words (sampling at temperature 1 lets a rare other token through where
    # the hidden state's first coordinate is near 0)
    assert all(sum(token in (7, 8) for token in t[1:]) >= 0.9 * 47 for t in texts)
    windows = self_generated_windows(model, tokenizer, samples=5, seq_len=12, seed=3, length=48, batch_size=2)
    assert windows == draw_windows(texts, 5, 12, seed=3)  # the same seed: the same pool, the same draws


def test_both_calibration_mixes_text_and_self_generated(tokenizer):
    from memstep.compress.sparse.calibration import calibration_windows, text_windows

    lm = tiny_lm(tokenizer, layers=1)
    windows = calibration_windows(lm.model, tokenizer, "both", samples=5, seq_len=16)
    assert len(windows) == 5 and all(len(w) == 16 for w in windows)
    assert windows[:2] == text_windows(tokenizer, 2, 16)


def test_saving_and_reloading_keeps_the_zeros(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from memstep.models import load_model

    lm = tiny_lm(tokenizer)
    out = tmp_path / "pruned"
    run = SparsePruning(lm, SparseConfig(method="wanda", reconstruct="br+gp", **FAST), output=str(out))
    list(run)
    assert run.result.verified and (out / "memstep_compress.json").is_file()
    zeros = zeros_by_matrix(lm.model)
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for key, mask in zeros_by_matrix(reloaded).items():
        assert torch.equal(mask, zeros[key]), key
    assert load_model(str(out), device="cpu").name == str(out)  # memstep run --model FOLDER loads it


@pytest.mark.parametrize("kwargs, words", [
    (dict(sparsity=1.0), "between 0 and 1"), (dict(sparsity=0.0), "between 0 and 1"),
    (dict(nm="4:4"), "0 < N < M"), (dict(method="random"), "unknown pruning method"),
    (dict(reconstruct="gp"), "unknown reconstruction"), (dict(calibration="web"), "unknown calibration"),
    (dict(steps=0), "--steps"), (dict(lr=-1.0), "--lr"), (dict(optimizer="lion"), "unknown optimizer"),
    (dict(seq_len=1), "--seq-len")])
def test_bad_parameters_are_clear_errors(kwargs, words):
    with pytest.raises(MemstepError, match=words.replace("+", r"\+")):
        SparseConfig(**kwargs).validate()


@pytest.mark.parametrize("argv, words", [
    (["--sparsity", "1.5"], "between 0 and 1"), (["--nm", "4:2"], "0 < N < M"),
    (["--method", "random"], "unknown pruning method"), (["--samples", "0"], "--samples")])
def test_cli_bad_parameters_exit_2_with_one_line(capsys, argv, words):
    from memstep.cli import main

    code = main(["compress", "sparse", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("memstep: error:") and words in err[0]


def test_cli_prunes_saves_and_reports(capsys, tokenizer, tmp_path):
    import json

    from memstep.cli import main

    src = tmp_path / "tiny"
    lm = tiny_lm(tokenizer, layers=2)
    lm.model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    out = tmp_path / "pruned"
    code = main(["compress", "sparse", "--model", str(src), "--method", "magnitude", "--nm", "2:4",
                 "--reconstruct", "lr", "--samples", "2", "--seq-len", "16", "--held-out-samples", "1",
                 "--steps", "2", "--output", str(out), "--json", "--quiet"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["verified"] and payload["output"] == str(out)
    assert math.isclose(payload["sparsity"], 0.5) and len(payload["records"]) == 2
    assert set(payload["perplexity"]) == {"calibration", "held_out"}


@pytest.mark.slow
def test_embedded_model_every_block_pruned(embedded):
    import copy

    lm = LoadedModel(copy.deepcopy(embedded.model), embedded.tokenizer, embedded.name, "cpu", "float32")
    run = SparsePruning(lm, SparseConfig(method="wanda", reconstruct="none", samples=2, seq_len=16,
                                         held_out_samples=1))
    records = list(run)
    assert len(records) == 30 and all(math.isclose(r.sparsity, 0.5) for r in records)
    assert run.result.perplexity["held_out"]["pruned"] > run.result.perplexity["held_out"]["dense"]


# ---- the app section's figures and table (no browser) ------------------------------------------

def _records(errors_cal, errors_held):
    from memstep.compress.sparse.records import BlockRecord

    return [BlockRecord(block=i, blocks=len(errors_cal), window=[i], error_calibration_masked=c,
                        error_calibration=c, error_held_out_masked=h, error_held_out=h, sparsity=0.5, matrices={})
            for i, (c, h) in enumerate(zip(errors_cal, errors_held))]


def _result(records, ppl_cal, ppl_held):
    from memstep.compress.sparse.records import SparseResult

    return SparseResult(model="m", settings={}, records=records,
                        perplexity={"calibration": {"dense": 10.0, "pruned": ppl_cal},
                                    "held_out": {"dense": 20.0, "pruned": ppl_held}},
                        sparsity=0.5, matrices={}, calibration_tokens=0, held_out_tokens=0, calibration_preview=[],
                        seconds=12.0, real_windows=4, generated_windows=4, epochs=5, steps=10)


def test_error_figure_has_one_curve_per_technique_and_split():
    from ui.tabs.compress.sparse import TECHNIQUE_COLORS, error_figure

    runs = [{"technique": "none", "records": _records([0.1, 0.2], [0.1, 0.3]), "result": None},
            {"technique": "br+gp", "records": _records([0.01], [0.05]), "result": None}]  # still running
    fig = error_figure(runs, blocks=2)
    assert [t.name for t in fig.data] == ["none, calibration", "none, held-out", "BR+GP, calibration",
                                          "BR+GP, held-out"]
    assert [t.line.dash for t in fig.data] == ["solid", "dash"] * 2
    assert fig.data[2].line.color == TECHNIQUE_COLORS["br+gp"] and list(fig.data[3].y) == [0.05]
    assert fig.layout.yaxis.type == "log" and len(error_figure([]).data) == 0


def test_table_rows_give_perplexities_and_cuts_against_none():
    from ui.tabs.compress.sparse import table_rows

    none = _records([0.1, 0.2], [0.1, 0.4])
    br = _records([0.01, 0.05], [0.05, 0.3])
    rows = table_rows([{"technique": "none", "records": none, "result": _result(none, 11.0, 25.0)},
                       {"technique": "br+gp", "records": br, "result": _result(br, 10.5, 30.0)},
                       {"technique": "br+gp+cr", "records": br[:1], "result": None}])
    assert rows[0][:5] == ["none", "4 + 4", "5 = 10", "10.00 → 11.00", "20.00 → 25.00"] and rows[0][7] == "—"
    assert rows[1][7] == "+75% / +25%"  # 1 - 0.05/0.2 on calibration, 1 - 0.3/0.4 held-out
    assert rows[2][0] == "BR+GP+CR (block 1/2)" and rows[2][1] == rows[2][2] == rows[2][3] == "…"


def test_app_caps_and_settings():
    import gradio as gr

    from ui.tabs.compress.sparse import MAX_EPOCHS, MAX_SAMPLES, MAX_STEPS, load_into_run, make_config

    config = make_config("sparsegpt", "2:4", 0.5, "self", 8, 64, 5, 1e-3, "br+gp+cr")
    assert (config.nm, config.method, config.calibration, config.reconstruct) == ("2:4", "sparsegpt", "self", "br+gp+cr")
    assert (config.epochs, config.steps, config.training_steps) == (5, None, 10)  # 5 passes over 8 windows by 4
    added = make_config("wanda", "unstructured", 0.5, "add", MAX_SAMPLES, 64, 5, 1e-3, "br")
    assert added.recon_windows == 2 * MAX_SAMPLES and added.training_steps == MAX_STEPS  # the cap is reachable
    with pytest.raises(MemstepError, match=f"make {2 * MAX_STEPS} steps per block: the app runs at most {MAX_STEPS}"):
        make_config("wanda", "unstructured", 0.5, "add", MAX_SAMPLES, 64, 10, 1e-3, "br")
    assert make_config("wanda", "unstructured", 0.5, "add", MAX_SAMPLES, 64, 10, 1e-3, "none")  # nothing trains
    for bad in [dict(samples=MAX_SAMPLES + 1), dict(seq_len=4096), dict(epochs=0), dict(epochs=MAX_EPOCHS + 1),
                dict(pattern="3:9x"), dict(lr=5.0)]:
        args = dict(method="wanda", pattern="unstructured", sparsity=0.5, calibration="text", samples=8, seq_len=64,
                    epochs=5, lr=1e-3, technique="br")
        args.update(bad)
        with pytest.raises(MemstepError):
            make_config(**args)
    with pytest.raises(gr.Error):
        load_into_run(None)
    update, tabs = load_into_run("/x/sparse-br")
    assert update["value"] == "/x/sparse-br"


def test_app_handler_streams_records_and_saves(tokenizer, tmp_path, monkeypatch):
    from memstep.compress.sparse import calibration as calibration_module
    from ui.tabs.compress.sparse import prune

    src = tmp_path / "tiny"
    lm = tiny_lm(tokenizer, layers=2)
    lm.model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    monkeypatch.setenv("MEMSTEP_COMPRESSED", str(tmp_path / "compressed"))
    writes, calls = calibration_module.self_generated_windows, []  # 48-token texts, not the app's 512

    def write(model, tokenizer, count, seq_len, seed, length, **kw):
        calls.append(count)
        return writes(model, tokenizer, count, seq_len, seed, 48, **kw)

    monkeypatch.setattr(calibration_module, "self_generated_windows", write)
    updates = list(prune(str(src), "magnitude", "2:4", 0.5, ["br", "none"], "self", 2, 16, 2, 1e-3))
    assert calls == [2]  # two techniques, one calibration set: the model writes its texts once
    statuses = [u[0] for u in updates]
    assert any("block 2/2" in s for s in statuses) and statuses[-1].startswith("**Done.**")
    assert "self-generated calibration sample" in statuses[-1]
    figure, rows, dropdown = updates[-1][1:]
    assert [t.name for t in figure.data][::2] == ["none, calibration", "BR, calibration"]  # in the listed order
    assert [r[0] for r in rows] == ["none", "BR"]
    assert dropdown["value"].endswith("sparse-br") and (tmp_path / "compressed" / "sparse-none").is_dir()


def test_the_cli_parser_stays_free_of_torch():
    """`memstep plan` and `memstep schedule` answer instantly: registering `compress sparse` must
    not import torch."""
    import subprocess
    import sys

    from conftest import ROOT

    code = "import sys; from memstep.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- self-generated calibration as the reference writes it; masks from real text ---------------

def test_self_generation_greedy_english_starts_top_k_and_long_texts_cut_into_windows(tokenizer, monkeypatch):
    from memstep.compress.sparse import calibration as calibration_module

    lm = tiny_lm(tokenizer, layers=1, seed=5)
    model = lm.model
    calls = []
    real_generate = model.generate

    def spy(**kwargs):
        out = real_generate(**kwargs)
        calls.append((kwargs, out.clone()))
        return out

    monkeypatch.setattr(model, "generate", spy)
    # the language filter: only starts whose first token is odd "read as English"
    decoded_first = {}

    def english(text):
        return decoded_first.get(text, 0) % 2 == 1

    real_decode = tokenizer.decode

    def decode(ids, **kwargs):
        text = real_decode(ids, **kwargs)
        decoded_first[text] = ids[0]
        return text

    monkeypatch.setattr(calibration_module, "is_language", english)
    monkeypatch.setattr(tokenizer, "decode", decode)
    windows = calibration_module.self_generated_windows(model, tokenizer, samples=5, seq_len=12, seed=1, length=48,
                                                        batch_size=4, pool=2)
    greedy = [c for c in calls if not c[0]["do_sample"]]
    sampled = [c for c in calls if c[0]["do_sample"]]
    assert greedy and all(c[0]["max_new_tokens"] == 4 for c in greedy)  # 5-token greedy starts
    assert len(sampled) == 1 and sampled[0][0]["top_k"] == 50 and sampled[0][0]["temperature"] == 1.0
    texts = sampled[0][1].tolist()
    assert len(texts) == 2 and all(len(t) == 48 for t in texts)  # the pool: 2 texts of 48 tokens
    starts = [ids for c in greedy for ids in c[1].tolist()]
    for text in texts:
        assert text[:5] in starts and text[0] % 2 == 1  # a kept greedy start: English by the filter
    # each window: a text at random, then a random offset in it (the reference's loader), seeded
    rng = random.Random(1)
    expected = []
    for _ in range(5):
        text = texts[rng.randrange(2)]
        offset = rng.randint(0, 48 - 12)
        expected.append(text[offset:offset + 12])
    assert windows == expected and len({tuple(w) for w in windows}) == 5


def test_windows_are_drawn_from_the_whole_pool_at_random_offsets():
    texts = [[t * 1000 + i for i in range(100)] for t in range(8)]  # each token says its text and offset
    windows = draw_windows(texts, 400, 16, seed=5)
    assert all(len(w) == 16 and w == list(range(w[0], w[0] + 16)) for w in windows)  # contiguous, in one text
    assert {w[0] // 1000 for w in windows} == set(range(8))  # every text of the pool is drawn from
    offsets = {w[0] % 1000 for w in windows}
    assert min(offsets) == 0 and max(offsets) == 100 - 16 and len(offsets) > 40  # all offsets, not a fixed grid
    assert windows == draw_windows(texts, 400, 16, seed=5) != draw_windows(texts, 400, 16, seed=6)
    assert all(len(w) == 16 for w in draw_windows([[1] * 10, list(range(40))], 20, 16))  # too short: never drawn
    with pytest.raises(MemstepError, match="no self-generated text holds a window of 16 tokens"):
        draw_windows([[1] * 10], 1, 16)


def test_language_filter_reads_english():
    from memstep.compress.sparse.calibration import is_language

    assert is_language("The weather was fine and the children played in the garden")
    assert not is_language("Das Wetter war schön und die Kinder spielten im Garten")
    assert not is_language("1234 ... !!")


@pytest.mark.parametrize("source, mask_data, stats_from", [
    ("both", "real", "real half"), ("both", "all", "all"), ("self", "real", "extra real"), ("text", "real", "all")])
def test_masks_come_from_real_text_only_unless_asked(tokenizer, monkeypatch, source, mask_data, stats_from):
    from memstep.compress.sparse import calibration as calibration_module

    generated = [[7] * FAST["seq_len"]] * FAST["samples"]  # stand-in for the model's own text
    monkeypatch.setattr(calibration_module, "self_generated_windows", lambda m, t, count, *a, **k: generated[:count])
    lm = tiny_lm(tokenizer, layers=1)
    config = SparseConfig(method="wanda", reconstruct="none", calibration=source, mask_data=mask_data, **FAST)
    run = SparsePruning(lm, config)
    dense_block = copy.deepcopy(decoder_layers(lm.model)[0])
    list(run)
    cal = run.calibration
    real = calibration_module.text_windows(tokenizer, FAST["samples"], FAST["seq_len"])
    expected = {"real half": real[:2], "all": cal.windows[:cal.recon], "extra real": real}[stats_from]
    assert cal.windows[cal.stats[0]:cal.stats[1]] == expected
    if source == "self":
        assert cal.windows[:cal.recon] == generated and run.result.calibration_tokens == 4 * FAST["seq_len"]
    # block 0's masks are Wanda's on exactly those windows' inputs
    x = embed(lm.model, expected)
    seen = {}
    handle = dense_block.mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0].detach()))
    run_block([dense_block], x, layer_kwargs(lm.model, FAST["seq_len"]), 0)
    handle.remove()
    norms = seen["x"].reshape(-1, seen["x"].shape[-1]).norm(dim=0)
    keep = wanda_mask(dense_block.mlp.down_proj.weight, norms, Pattern(sparsity=0.5))
    assert torch.equal(decoder_layers(lm.model)[0].mlp.down_proj.weight != 0, keep)


# ---- the user's own calibration text ------------------------------------------------------------

def _tiny_folder(tokenizer, tmp_path):
    src = tmp_path / "tiny"
    lm = tiny_lm(tokenizer, layers=2)
    lm.model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    return src


def test_cli_calibrates_on_the_users_text(capsys, tokenizer, tmp_path):
    import json

    from memstep.cli import main

    mine = tmp_path / "my.txt"
    mine.write_text("Zebrafish quantum harmonica. " * 200)
    code = main(["compress", "sparse", "--model", str(_tiny_folder(tokenizer, tmp_path)), "--method", "wanda",
                 "--reconstruct", "br", "--calibration", str(mine), "--samples", "2", "--seq-len", "16",
                 "--held-out-samples", "1", "--steps", "1", "--json", "--quiet"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["settings"]["calibration_file"] == "my.txt"
    assert all("Zebrafish quantum harmonica" in text for text in payload["calibration_preview"])


BAD_FILES = {
    "binary": (lambda p: p.write_bytes(bytes(range(256)) * 40), "binary"),
    "empty": (lambda p: p.write_text("  \n\n "), "contains no text"),
    "too short": (lambda p: p.write_text("A short note about the sea and the ships."), "too short"),
    "over the size limit": (lambda p: p.open("wb").truncate(21 * 1024 * 1024), "over the 21.0 MB limit"),
}


@pytest.mark.parametrize("command", ["sparse", "laco"])
@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_bad_calibration_files_are_one_line_exit_2_before_any_model_loads(capsys, tmp_path, monkeypatch, command,
                                                                           kind):
    from memstep import models
    from memstep.cli import main

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the calibration file was checked")

    monkeypatch.setattr(models, "load_model", no_model)
    path = tmp_path / "calibration.txt"
    make, words = BAD_FILES[kind]
    make(path)
    code = main(["compress", command, "--calibration", str(path), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("memstep: error:") and words in err[0], err


def test_cli_unknown_calibration_keyword(capsys):
    from memstep.cli import main

    code = main(["compress", "sparse", "--calibration", "web"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown calibration 'web'" in err[0]


def test_cli_reconstruct_cr_ends_with_the_last_block_alone(capsys, tokenizer, tmp_path):
    import json

    from memstep.cli import main

    code = main(["compress", "sparse", "--model", str(_tiny_folder(tokenizer, tmp_path)), "--method", "magnitude",
                 "--reconstruct", "cr", "--samples", "2", "--seq-len", "16", "--held-out-samples", "1",
                 "--steps", "1", "--json", "--quiet"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["settings"]["reconstruct"] == "br+gp+cr"
    assert [r["steps"] for r in payload["records"]] == [[[0]], [[0, 1], [1]]]  # 3 trainings for 2 blocks


# ---- "add": generated windows added to the real ones (the reference's gen_add) -------------------
def test_add_calibration_keeps_every_real_window_and_adds_the_generated_ones(tokenizer, monkeypatch):
    from memstep.compress.sparse import calibration as calibration_module

    generated = [[7 + i] * FAST["seq_len"] for i in range(3)]  # stand-in for the model's own text
    monkeypatch.setattr(calibration_module, "self_generated_windows", lambda m, t, count, *a, **k: generated[:count])
    lm = tiny_lm(tokenizer, layers=1)
    config = SparseConfig(method="wanda", reconstruct="br", calibration="add", self_samples=3, **FAST)
    run = SparsePruning(lm, config)
    list(run)
    cal, real = run.calibration, calibration_module.text_windows(tokenizer, FAST["samples"], FAST["seq_len"])
    assert cal.windows == real + generated and cal.recon == 7  # added, not substituted: 4 real + 3 generated
    assert cal.windows[cal.stats[0]:cal.stats[1]] == real  # masks from the real windows, as the reference
    result = run.result.to_dict()
    assert (result["real_windows"], result["generated_windows"]) == (4, 3)
    assert result["calibration_tokens"] == 7 * FAST["seq_len"]
    assert SparseConfig(calibration="add", samples=5).generated_samples == 5  # default: as many as the real ones
    with pytest.raises(MemstepError, match="--self-samples"):
        SparseConfig(calibration="add", self_samples=0).validate()


def test_cli_add_reports_real_and_generated_counts(capsys, tokenizer, tmp_path, monkeypatch):
    import json

    from memstep.cli import main
    from memstep.compress.sparse import calibration as calibration_module

    monkeypatch.setattr(calibration_module, "self_generated_windows",
                        lambda m, t, count, samples_len=None, *a, **k: [[9] * 16] * count)
    folder = _tiny_folder(tokenizer, tmp_path)
    argv = ["compress", "sparse", "--model", str(folder), "--reconstruct", "none", "--calibration", "add",
            "--samples", "2", "--self-samples", "3", "--seq-len", "16", "--held-out-samples", "1", "--quiet"]
    assert main(argv) == 0
    assert "calibration add (2 real + 3 self-generated windows of 16 tokens" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["real_windows"], payload["generated_windows"]) == (2, 3)


# ---- training as the reference trains: epochs over every window ---------------------------------
def test_each_epoch_sees_every_window_once_and_steps_can_stop_mid_epoch():
    from memstep.compress.sparse.reconstruct import epoch_batches

    gen = torch.Generator().manual_seed(0)
    batches = list(epoch_batches(10, 4, 9, gen))  # 3 epochs of 3 batches (4, 4, 2)
    assert [len(b) for b in batches] == [4, 4, 2] * 3
    for epoch in range(3):
        assert sorted(i for b in batches[3 * epoch:3 * epoch + 3] for i in b) == list(range(10))
    assert batches[:3] != batches[3:6]  # a fresh order each epoch
    assert [len(b) for b in epoch_batches(10, 4, 4, torch.Generator().manual_seed(0))] == [4, 4, 2, 4]  # --steps
    config = SparseConfig(calibration="add", samples=10, self_samples=6, batch_size=4, epochs=3)
    assert (config.recon_windows, config.steps_per_epoch, config.training_steps) == (16, 4, 12)
    assert SparseConfig(samples=10, batch_size=4, epochs=3).training_steps == 9  # ceil(10 / 4) = 3 per epoch
    assert SparseConfig(samples=10, batch_size=4, epochs=3, steps=7).training_steps == 7  # the override
    assert SparseConfig().training_steps == 20  # the defaults: 5 epochs over 16 windows by 4, as before
    for bad, words in ((dict(epochs=0), "--epochs"), (dict(steps=0), "--steps"), (dict(self_texts=0), "--self-texts")):
        with pytest.raises(MemstepError, match=words):
            SparseConfig(calibration="add", **bad).validate()


def test_cli_add_reports_windows_epochs_and_steps_and_the_steps_double_with_the_windows(capsys, tokenizer, tmp_path,
                                                                                       monkeypatch):
    """--calibration add trains the same epochs over real and generated windows: twice the
    windows, twice the steps (and each block's training really ran that many)."""
    import json

    from memstep.cli import main
    from memstep.compress.sparse import calibration as calibration_module

    monkeypatch.setattr(calibration_module, "self_generated_texts",
                        lambda m, t, count, *a, **k: [[9 + i] * 40 for i in range(count)])
    folder = _tiny_folder(tokenizer, tmp_path)
    base = ["compress", "sparse", "--model", str(folder), "--reconstruct", "br", "--samples", "2", "--seq-len", "16",
            "--held-out-samples", "2", "--batch-size", "2", "--epochs", "3", "--json", "--quiet"]
    runs = {}
    for label, extra in (("text", []), ("add 2", ["--calibration", "add"]),
                         ("add 6", ["--calibration", "add", "--self-samples", "6"])):
        assert main(base + extra) == 0
        runs[label] = json.loads(capsys.readouterr().out)
    counts = {k: (r["real_windows"], r["generated_windows"], r["epochs"], r["steps_per_epoch"], r["steps"])
              for k, r in runs.items()}
    assert counts == {"text": (2, 0, 3, 1, 3), "add 2": (2, 2, 3, 2, 6), "add 6": (2, 6, 3, 4, 12)}
    assert runs["add 6"]["generated_texts"] == 6 and runs["text"]["generated_texts"] == 0
    for run in runs.values():  # every block trained exactly the reported steps
        assert all(len(record["losses"]) == run["steps"] for record in run["records"])
    assert main(base + ["--calibration", "add", "--steps", "5"]) == 0
    override = json.loads(capsys.readouterr().out)
    assert (override["epochs"], override["steps"]) == (None, 5)
    assert main([a for a in base if a != "--json"] + ["--calibration", "add"]) == 0
    out = capsys.readouterr().out
    assert "calibration add (2 real + 2 self-generated windows of 16 tokens from 2 generated texts" in out
    assert "reconstruction: 3 epochs over 4 windows in batches of 2 = 6 steps per block" in out
    assert re.search(r"held-out [\d.]+ -> [\d.]+ \(95% interval [\d.]+-[\d.]+ over 2 windows of 16 tokens\)", out)
