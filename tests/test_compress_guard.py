"""The guard and block influence: the verdict rule on hand-set rows, the guard firing on a
constructed model where LaCo's merge is worse than dropping the same layers and staying silent
where it is not, the guard's limit refusing a save, the block-influence ranking against one
computed by hand, and `memstep compress drop` end to end. Tiny random-init models."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_model

from memstep.cli import main
from memstep.compress import guard
from memstep.compress.drop import BlockInfluenceDrop, DropRun, ranking
from memstep.compress.layers import LayerInputs
from memstep.compress.quality import Probe
from memstep.errors import MemstepError
from memstep.models import LoadedModel

CALIBRATION = ["It was a truth universally acknowledged, that a single man in possession of a good fortune. " * 2] * 2


def row(label, perplexity, layers):
    return {"label": label, "perplexity": perplexity, "layers": layers}


# ---- the rule ---------------------------------------------------------------------------------
def test_compare_says_worse_only_when_the_method_has_the_higher_perplexity():
    dense = row("dense", 24.46, 30)
    worse = guard.compare(row("LaCo", 1579.96, 28), row("block influence", 30.02, 28), dense)
    assert worse["worse"] and worse["removed_layers"] == 2
    assert "1,579.96" in worse["message"] and "30.02" in worse["message"] and "28 of 30 layers" in worse["message"]
    for laco in (30.02, 29.0):  # as good as the baseline, or better: silent
        verdict = guard.compare(row("LaCo", laco, 28), row("block influence", 30.02, 28), dense)
        assert not verdict["worse"] and verdict["message"] is None


def test_refusal_past_the_limit_only():
    dense = row("dense", 10.0, 30)
    assert guard.refusal(row("LaCo", 25.0, 28), dense, None) is None
    assert guard.refusal(row("LaCo", 20.0, 28), dense, 2) is None  # x2.00 is at the limit, not past it
    message = guard.refusal(row("LaCo", 25.0, 28), dense, 2)
    assert message.startswith("not saved") and "x2.50" in message and "x2" in message
    for bad in (0.5, float("nan"), float("inf"), -1):
        with pytest.raises(MemstepError, match="perplexity ratio"):
            guard.check_limit(bad)


# ---- a constructed model: a copying LM whose merge can be made destructive ----------------------
def copying_model(destructive: bool):
    """4 layers over tied, enlarged embeddings, so the dense model predicts 'the same token
    again' (low perplexity on a constant window). Layers 1 and 2 are exact identities (their
    output projections are zero: block influence 0, so dropping them changes nothing). With
    ``destructive``, their gate/up weights are large and layer 0's down projection too, so
    RDSC's merge of layers 0-2 (theta_1 + theta_2 - theta_0) writes a huge update into the
    residual stream; without it layer 0 is an identity as well and the merge is one too."""
    model = make_tiny_model(layers=4, seed=3, tie_word_embeddings=True)
    layers = model.model.layers
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(10)
        for i in (1, 2):
            layers[i].self_attn.o_proj.weight.zero_()
            layers[i].mlp.down_proj.weight.zero_()
            if destructive:
                layers[i].mlp.gate_proj.weight.mul_(30)
                layers[i].mlp.up_proj.weight.mul_(30)
        if destructive:
            layers[0].mlp.down_proj.weight.mul_(5)
        else:
            layers[0].self_attn.o_proj.weight.zero_()
            layers[0].mlp.down_proj.weight.zero_()
    return model


class Tokenizer:
    """Enough tokenizer for the probe's measurements (one id per character; no chat template)."""

    pad_token_id = 0
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(ch) % 128 for ch in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids)

    def save_pretrained(self, folder):
        (folder / "tokenizer.txt").write_text("one id per character")


def probe() -> Probe:
    return Probe(windows=[[t] * 24 for t in (5, 40, 77)], passkeys=[], prefill_ids=list(range(2, 34)))


def collapse(model, monkeypatch, **kwargs):
    from memstep.compress import laco
    from memstep.compress.collapse_run import CollapseRun

    monkeypatch.setattr(laco, "mean_similarity", lambda reference, candidate: 1.0)  # accept the first window
    model.generation_config.eos_token_id = 1
    lm = LoadedModel(model, Tokenizer(), "tiny", "cpu", "float32")
    run = CollapseRun(lm, CALIBRATION, probe=probe(), baselines=False, C=3, L=0, H=3, I=1, T=0.5, **kwargs)
    events = list(run)
    assert run.report["searches"]["paper"]["removed"] == [1, 2]
    # identity layers (block influence 0; ties go to the lower layer)
    assert run.report["models"]["block-influence"]["removed"] == ([1, 2] if destructive(model) else [0, 1])
    return run, events


def destructive(model) -> bool:
    return bool(model.model.layers[0].mlp.down_proj.weight.abs().sum() > 0)


def test_guard_fires_where_the_merge_is_worse_than_dropping_and_its_limit_refuses_the_save(monkeypatch, tmp_path):
    run, events = collapse(copying_model(destructive=True), monkeypatch, output=tmp_path / "bad", guard=2)
    models, verdict = run.report["models"], run.report["guard"]
    # dropping exact identities leaves the dense model; the merge does not
    assert models["block-influence"]["perplexity"] == pytest.approx(models["dense"]["perplexity"], rel=1e-5)
    assert models["laco-paper"]["perplexity"] > 2 * models["dense"]["perplexity"]
    assert verdict["worse"] and "worse than block influence (ShortGPT)" in verdict["message"]
    kinds = [e["event"] for e in events]
    assert kinds.index("guard") < kinds.index("refused") < kinds.index("done")
    assert run.report["refused"].startswith("not saved") and run.report["saved"] is None
    assert not (tmp_path / "bad").exists()


def test_guard_stays_silent_where_the_merge_is_not_worse_and_the_model_is_saved(monkeypatch, tmp_path):
    run, events = collapse(copying_model(destructive=False), monkeypatch, output=tmp_path / "good", guard=2)
    models = run.report["models"]
    assert models["laco-paper"]["perplexity"] == pytest.approx(models["block-influence"]["perplexity"], rel=1e-5)
    assert not run.report["guard"]["worse"] and run.report["guard"]["message"] is None
    assert run.report["refused"] is None and (tmp_path / "good" / "config.json").is_file()
    kinds = [e["event"] for e in events]
    assert kinds.index("guard") < kinds.index("saved")  # told before the save
    saved = run.save_baseline(tmp_path / "baseline")
    assert json.loads((saved / "memstep_compress.json").read_text())["removed"] == [0, 1]


# ---- block influence --------------------------------------------------------------------------
def hidden_after(model, ids, k: int) -> torch.Tensor:
    """The residual stream after the first ``k`` layers (k = 0: the embeddings), by running the
    model truncated to k layers with its final norm taken out."""
    saved_norm, saved_depth = model.model.norm, model.config.num_hidden_layers
    model.model.norm, model.config.num_hidden_layers = torch.nn.Identity(), k
    try:
        with torch.inference_mode():
            return model.model(input_ids=ids, use_cache=False).last_hidden_state[0].float()
    finally:
        model.model.norm, model.config.num_hidden_layers = saved_norm, saved_depth


def test_block_influence_ranking_equals_a_hand_computed_one():
    model = make_tiny_model(layers=4, seed=5)
    with torch.no_grad():  # distinct layer strengths, so the ranking is not a coin toss
        for layer, scale in zip(model.model.layers, (1.0, 0.1, 3.0, 0.5)):
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 128, (1, n), generator=gen) for n in (11, 17)]
    hand = []
    for k in range(4):
        cos = torch.cat([torch.nn.functional.cosine_similarity(hidden_after(model, ids, k),
                                                               hidden_after(model, ids, k + 1), dim=-1)
                         for ids in batches])
        hand.append(1 - cos.mean().item())
    scores = LayerInputs(model, batches).block_influence()
    assert scores == pytest.approx(hand, abs=1e-5)
    expected = sorted(range(4), key=lambda i: hand[i])
    assert ranking(scores) == expected == [1, 3, 0, 2]


def test_drop_yields_each_layer_then_each_drop_and_builds_the_shallower_model():
    model = make_tiny_model(layers=6, seed=6)

    class Ids:
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [ord(ch) % 128 for ch in text]}

    search = BlockInfluenceDrop(model, Ids(), CALIBRATION, remove=2)
    events = list(search)
    kinds = [e["event"] for e in events]
    assert kinds == ["influence"] * 6 + ["drop"] * 2 + ["result"]
    scores = [e["influence"] for e in events[:6]]
    assert [e["layer"] for e in events[6:8]] == ranking(scores)[:2] == search.result.order
    built = search.build()
    assert built.config.num_hidden_layers == 4 == len(built.model.layers)
    assert len(model.model.layers) == 6  # the dense model is untouched
    for bad in (0, 6, True):
        with pytest.raises(MemstepError, match="between 1 and 5"):
            BlockInfluenceDrop(model, Ids(), CALIBRATION, remove=bad)


def test_drop_run_measures_and_saves(tmp_path):
    model = make_tiny_model(layers=4, seed=7)
    model.generation_config.eos_token_id = 1
    run = DropRun(LoadedModel(model, Tokenizer(), "tiny", "cpu", "float32"), CALIBRATION, remove=1, probe=probe(),
                  output=tmp_path / "dropped")
    kinds = [e["event"] for e in run]
    assert kinds[-2:] == ["saved", "done"] and set(run.report["models"]) == {"dense", "block-influence", "uniform"}
    assert run.report["models"]["block-influence"]["layers"] == 3
    assert json.loads((tmp_path / "dropped" / "memstep_compress.json").read_text())["method"] == "block-influence"


@pytest.mark.parametrize("argv, words", [(["--remove", "0"], "--remove must be at least 1"),
                                         (["--guard", "0.5"], "perplexity ratio"),
                                         (["--guard", "2", "--no-eval"], "--guard needs the measurements")])
def test_cli_drop_bad_options_exit_2_with_one_line(capsys, argv, words):
    code = main(["compress", "drop", *argv])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0], err
