"""The guard and block influence: the verdict rule on hand-set rows, the guard firing on a
constructed model where LaCo's merge is worse than dropping the same layers (nothing saved
unless kept by name, with measurements, with the check alone, and from the command line with
--no-eval) and staying silent where it is not, the guard's limit (1, its minimum, included)
refusing a save, the block-influence ranking against one computed by hand and its tie rule,
and `memstep compress drop` end to end. Tiny random-init models."""

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


def test_past_the_limit_only_and_the_limit_one_is_accepted():
    dense = row("dense", 10.0, 30)
    assert guard.past_limit(row("LaCo", 25.0, 28), dense, None) is None
    assert guard.past_limit(row("LaCo", 20.0, 28), dense, 2) is None  # x2.00 is at the limit, not past it
    message = guard.past_limit(row("LaCo", 25.0, 28), dense, 2)
    assert "x2.50" in message and "x2" in message and "25.00 against 10.00" in message
    for bad in (0.5, 0.999, float("nan"), float("inf"), -1):
        with pytest.raises(MemstepError, match="perplexity ratio"):
            guard.check_limit(bad)
    # 1, the documented minimum: accepted, and it refuses anything worse than dense, nothing else
    assert guard.check_limit(1) == 1.0 and guard.check_limit(1.0) == 1.0
    assert guard.past_limit(row("LaCo", 10.0, 28), dense, 1) is None
    assert "x1.00" in guard.past_limit(row("LaCo", 10.01, 28), dense, 1)


def test_refusal_and_kept_anyway_name_both_perplexities_and_the_flag():
    dense = row("dense", 24.46, 30)
    laco = row("LaCo", 1579.96, 28)
    verdict = guard.compare(laco, row("block influence", 30.02, 28), dense)
    found = guard.findings(laco, dense, verdict, None)
    line = guard.refusal(found, keep_worse=False)
    assert line.startswith("not saved: LaCo is worse than block influence") and "\n" not in line
    assert "1,579.96 against 30.02" in line and line.endswith("--keep-worse saves it anyway")
    assert guard.refusal(found, keep_worse=True) is None
    kept = guard.kept_anyway(found)
    assert kept.startswith("saved although the check finds it worse (--keep-worse)") and "1,579.96" in kept
    both = guard.findings(laco, dense, verdict, 2)  # worse than the baseline and past the limit: one line, both
    assert len(both) == 2 and "\n" not in guard.refusal(both, False) and "x64.59" in guard.refusal(both, False)
    fine = guard.compare(row("LaCo", 29.0, 28), row("block influence", 30.02, 28), dense)
    assert guard.findings(row("LaCo", 29.0, 28), dense, fine, 2) == [] and guard.refusal([], False) is None
    assert guard.kept_anyway([]) is None


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


def collapse(model, monkeypatch, probe_kind="full", **kwargs):
    from memstep.compress import laco
    from memstep.compress.collapse_run import CollapseRun

    monkeypatch.setattr(laco, "mean_similarity", lambda reference, candidate: 1.0)  # accept the first window
    model.generation_config.eos_token_id = 1
    lm = LoadedModel(model, Tokenizer(), "tiny", "cpu", "float32")
    run = CollapseRun(lm, CALIBRATION, probe=probe() if probe_kind == "full" else None, baselines=False, C=3, L=0,
                      H=3, I=1, T=0.5, **kwargs)
    events = list(run)
    assert run.report["searches"]["paper"]["removed"] == [1, 2]
    # identity layers (block influence 0; ties go to the lower layer)
    assert run.report["models"]["block-influence"]["removed"] == ([1, 2] if destructive(model) else [0, 1])
    return run, events


def destructive(model) -> bool:
    return bool(model.model.layers[0].mlp.down_proj.weight.abs().sum() > 0)


def test_guard_fires_where_the_merge_is_worse_than_dropping_and_nothing_is_saved(monkeypatch, tmp_path):
    """The default guard (no limit): worse than block influence is enough to refuse the save."""
    run, events = collapse(copying_model(destructive=True), monkeypatch, output=tmp_path / "bad")
    models, verdict = run.report["models"], run.report["guard"]
    # dropping exact identities leaves the dense model; the merge does not
    assert models["block-influence"]["perplexity"] == pytest.approx(models["dense"]["perplexity"], rel=1e-5)
    assert models["laco-paper"]["perplexity"] > 2 * models["dense"]["perplexity"]
    assert verdict["worse"] and "worse than block influence (ShortGPT)" in verdict["message"]
    kinds = [e["event"] for e in events]
    assert kinds.index("guard") < kinds.index("refused") < kinds.index("done") and "saved" not in kinds
    refused = run.report["refused"]
    assert refused.startswith("not saved: LaCo (paper formula) is worse than block influence (ShortGPT)")
    assert f"{models['laco-paper']['perplexity']:,.2f}" in refused and refused.endswith("--keep-worse saves it anyway")
    assert run.report["saved"] is None and not (tmp_path / "bad").exists()


def test_keep_worse_saves_the_worse_model_and_says_so(monkeypatch, tmp_path):
    run, events = collapse(copying_model(destructive=True), monkeypatch, output=tmp_path / "kept", guard=2,
                           keep_worse=True)
    saved = [e for e in events if e["event"] == "saved"]
    assert len(saved) == 1 and run.report["refused"] is None and (tmp_path / "kept" / "config.json").is_file()
    kept = run.report["kept_worse"]
    assert kept == saved[0]["kept_worse"] and kept.startswith("saved although the check finds it worse (--keep-worse)")
    assert "worse than block influence" in kept and "past the guard's limit x2" in kept  # both findings


def test_without_measurements_a_save_is_still_checked(monkeypatch, tmp_path):
    """No probe given (the measurements off): the check's probe is measured, the worse merge is
    refused; only the perplexity windows run (no passkey, prefill or uniform baseline). The
    check's windows are the constant ones this copying model is made for (on real text it
    repeats every token and the merge happens to help)."""
    from memstep.compress import collapse_run

    calls = []

    def check_probe(tokenizer):
        calls.append(tokenizer)
        return Probe(windows=probe().windows, passkeys=[], prefill_ids=[], check_only=True)

    monkeypatch.setattr(collapse_run, "make_check_probe", check_probe)
    run, events = collapse(copying_model(destructive=True), monkeypatch, probe_kind=None, output=tmp_path / "quiet")
    assert run.report["probe"]["check_only"] and run.report["probe"]["perplexity_windows"] >= 1
    assert set(run.report["models"]) == {"dense", "laco-paper", "block-influence"}
    assert run.report["models"]["laco-paper"]["prefill_seconds"] is None
    assert run.report["refused"].startswith("not saved") and not (tmp_path / "quiet").exists()
    assert "saved" not in [e["event"] for e in events] and len(calls) == 1


def test_guard_stays_silent_where_the_merge_is_not_worse_and_the_model_is_saved(monkeypatch, tmp_path):
    run, events = collapse(copying_model(destructive=False), monkeypatch, output=tmp_path / "good", guard=2)
    models = run.report["models"]
    assert models["laco-paper"]["perplexity"] == pytest.approx(models["block-influence"]["perplexity"], rel=1e-5)
    assert not run.report["guard"]["worse"] and run.report["guard"]["message"] is None
    assert run.report["refused"] is None and run.report["kept_worse"] is None
    assert (tmp_path / "good" / "config.json").is_file()
    kinds = [e["event"] for e in events]
    assert kinds.index("guard") < kinds.index("saved")  # told before the save
    saved = run.save_baseline(tmp_path / "baseline")
    assert json.loads((saved / "memstep_compress.json").read_text())["removed"] == [0, 1]


def test_guard_one_keeps_a_model_as_good_as_dense_and_refuses_a_worse_one(tmp_path):
    """--guard 1, the minimum: dropping an exact identity layer (ratio 1) is saved, a harmful
    drop is refused."""
    identity = copying_model(destructive=False)  # layers 0-2 are identities: block influence 0
    identity.generation_config.eos_token_id = 1
    run = DropRun(LoadedModel(identity, Tokenizer(), "tiny", "cpu", "float32"), CALIBRATION, remove=1, probe=probe(),
                  baselines=False, output=tmp_path / "same", guard=1)
    list(run)
    models = run.report["models"]
    assert run.report["search"]["removed"] == [0]  # a three-way tie at 0: the lowest layer
    assert models["block-influence"]["perplexity"] == pytest.approx(models["dense"]["perplexity"], rel=1e-6)
    assert run.report["refused"] is None and (tmp_path / "same" / "config.json").is_file()
    harmful = make_tiny_model(layers=4, seed=7)
    harmful.generation_config.eos_token_id = 1
    run = DropRun(LoadedModel(harmful, Tokenizer(), "tiny", "cpu", "float32"), CALIBRATION, remove=3, probe=probe(),
                  baselines=False, output=tmp_path / "worse", guard=1)
    list(run)
    ratio = run.report["models"]["block-influence"]["perplexity_ratio"]
    assert ratio > 1 and run.report["refused"].startswith("not saved") and "past the guard's limit x1" in \
        run.report["refused"] and not (tmp_path / "worse").exists()


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


def test_block_influence_ties_go_to_the_lower_layer_first():
    """Equal scores: the lower layer is ranked (and dropped) first, in the drop's order and in the
    LaCo guard's baseline alike, whatever the order of the ties in the list."""
    from memstep.compress.baselines import lowest_influence

    scores = [0.5, 0.1, 0.3, 0.1, 0.1, 0.3]
    assert ranking(scores) == [1, 3, 4, 2, 5, 0]
    assert lowest_influence(scores, 1) == [1] and lowest_influence(scores, 2) == [1, 3]
    assert lowest_influence(scores, 4) == [1, 2, 3, 4]  # 0.3 tie between 2 and 5: 2 goes first
    assert ranking([0.0] * 4) == [0, 1, 2, 3] and lowest_influence([0.2] * 5, 3) == [0, 1, 2]


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
                                         (["--guard", "0.99", "--no-eval"], "perplexity ratio")])
def test_cli_drop_bad_options_exit_2_with_one_line(capsys, argv, words):
    code = main(["compress", "drop", *argv])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0], err
