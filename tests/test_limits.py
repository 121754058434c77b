"""Bounded work and readable refusals: the step cap, the size bounds, and the CLI's exit-2
contract for inputs that used to end in a traceback (issue 12)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from memstep import planner
from memstep.cli import main
from memstep.errors import MemstepError
from memstep.schedules import (MAX_SIZE_TOKENS, MAX_STEPS, check_run_settings, check_steps, custom_schedule,
                               make_schedule)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *words):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memstep: error:"), (code, err)
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---- the step cap: one constant, used by the schedule math, the CLI and the planner -----------
def test_step_cap_is_exact():
    make_schedule("fm", MAX_STEPS * 7, 7, 7)  # exactly at the cap: allowed
    with pytest.raises(MemstepError, match=f"{MAX_STEPS + 1:,} steps.*chunk of at least 8"):
        make_schedule("fm", MAX_STEPS * 7 + 1, 7, 7)
    with pytest.raises(MemstepError, match="over the limit"):
        check_steps(10**7, 1)
    check_steps(10**7, -(-10**7 // MAX_STEPS))  # the suggested chunk is accepted
    with pytest.raises(MemstepError, match="at most"):
        custom_schedule(MAX_STEPS + 1, [1] * (MAX_STEPS + 1), [0] * (MAX_STEPS + 1))
    assert make_schedule("full", 10**8).steps == 1  # full is one step whatever its length
    assert planner.LONGEST_CAP_STEPS == MAX_STEPS


def test_over_cap_is_refused_fast(capsys, no_schedule_work):
    one_line_error(*run_cli(capsys, "schedule", "--tokens", 10**7, "--chunk", 1)[::2], "16,384", "at least 611")
    one_line_error(*run_cli(capsys, "plan", "--tokens", 10**6, "--chunk", 1)[::2], "over the limit")
    with pytest.raises(MemstepError, match="over the limit"):
        planner.plan("llama-3.1-8b", "h100-80gb", schedule="fm", tokens=10**6, chunk=1, memory=1)
    # refused before any schedule is built: no_schedule_work fails the test otherwise


@pytest.mark.parametrize("sizes,words", [
    (dict(tokens=0, chunk=1, memory=4, sinks=4), ["at least 1"]),
    (dict(tokens=-1, chunk=1, memory=4, sinks=4), ["at least 1"]),
    (dict(tokens=1.5, chunk=1, memory=4, sinks=4), ["whole number"]),
    (dict(tokens=100, chunk=10, memory=4, sinks=-50), ["sinks must be 0 or more"]),
    (dict(tokens=10**60, chunk=10, memory=4, sinks=4), ["too large"]),
    (dict(tokens=100, chunk=True, memory=4, sinks=4), ["whole number"]),
    (dict(tokens=100, chunk=101, memory=4, sinks=4), ["at most 100"]),
])
def test_run_settings_refuse_bad_sizes(sizes, words):
    with pytest.raises(MemstepError) as err:
        check_run_settings("imdc", **sizes)
    for word in words:
        assert word in str(err.value)
    assert "at most -1" not in str(err.value)  # the old message for tokens -1


# ---- CLI: exit 2 with one line instead of a traceback -----------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["schedule", "--tokens", 10**12], ["too large"]),
    (["schedule", "--tokens", "9" * 60], ["too large"]),
    (["schedule", "--tokens", 100, "--sinks", -50], ["sinks"]),
    (["schedule", "--tokens", 100, "--chunk", 500], ["at most 100"]),  # the app's rule
    (["plan", "--tokens", 10**12], ["too large"]),
    (["plan", "--tokens", 10**12, "--schedule", "full"], ["too large"]),
    (["plan", "--tokens", "9" * 60], ["too large"]),
    (["plan", "--tokens", 4096, "--gpu", "custom", "--tflops", 1e308, "--bandwidth", 1, "--gpu-memory", 1],
     ["beyond any GPU"]),
    (["plan", "--tokens", 4096, "--gpu-memory", 1e308], ["beyond any GPU"]),
    (["plan", "--tokens", 4096, "--gpu-memory", "nan"], ["positive number"]),
])
def test_cli_bad_sizes_exit_2(capsys, argv, words):
    one_line_error(*run_cli(capsys, *argv)[::2], *words)


def test_plan_full_far_beyond_fm_cap_still_plans(capsys):
    code, out, _ = run_cli(capsys, "plan", "--tokens", 10**9, "--schedule", "full", "--json")
    report = json.loads(out)
    assert code == 0 and report["vs_fm"] is None and report["vs_full"]["peak_bytes"] == 1.0


GOOD = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=128)


@pytest.mark.parametrize("config,words", [
    ({**GOOD, "head_dim": "16"}, ["head_dim"]),
    ({**GOOD, "hidden_size": "64"}, ["hidden_size"]),
    ({**GOOD, "intermediate_size": float("nan")}, ["intermediate_size"]),
    ({"text_config": {**GOOD, "num_hidden_layers": 0}}, ["num_hidden_layers"]),
    ({**GOOD, "num_key_value_heads": -2}, ["num_key_value_heads"]),
    ({**GOOD, "vocab_size": 10**30}, ["vocab"]),
    ({**GOOD, "num_key_value_heads": 8}, ["more KV heads"]),
    ({**GOOD, "max_position_embeddings": "long"}, ["max_position_embeddings"]),
])
def test_plan_bad_config_exit_2(capsys, tmp_path, config, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    one_line_error(*run_cli(capsys, "plan", "--model", path, "--tokens", 4096)[::2], *words)


def test_plan_deeply_nested_config_exit_2(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 5000 + "]" * 5000)
    one_line_error(*run_cli(capsys, "plan", "--model", path, "--tokens", 4096)[::2], "nested too deeply")
    nested = GOOD
    for _ in range(3000):
        nested = {"text_config": nested}
    path.write_text(json.dumps({"text_config": {"text_config": GOOD}}))
    assert run_cli(capsys, "plan", "--model", path, "--tokens", 4096)[0] == 0  # shallow nesting is fine
    with pytest.raises(MemstepError, match="nested too deeply"):
        planner.resolve_model(nested)


def test_run_output_into_missing_folder_fails_before_the_run(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", ROOT / "assets" / "persuasion_excerpt.txt", "--output",
                           tmp_path / "missing" / "run.json", "--model", tmp_path / "no-model")
    one_line_error(code, err, "does not exist")  # the output's folder, not the missing model: checked first


def test_broken_pipe_exits_without_traceback():
    proc = subprocess.run(f"{sys.executable} -m memstep schedule --tokens 1000000 --chunk 64 | head -1",
                          shell=True, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          executable="/bin/bash")
    assert proc.stdout.startswith("step")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 1


# ---- the Plan tab when the weights alone do not fit ----------------------------------------------
def test_plan_chart_never_draws_a_negative_limit_when_the_weights_do_not_fit():
    from ui.tabs.plan import headline, plan_memory_figure

    plans = planner.compare("llama-3.1-70b", "h100-80gb", schedules=("fm", "imdc"), tokens=32768, chunk=1024,
                            memory=1024)
    assert not plans["fm"].weights_fit and plans["fm"].gpus_needed == 2  # 131 GiB of bf16 weights, 79 GiB usable
    fig = plan_memory_figure(plans)
    assert not [s for s in fig.layout.shapes if s.y0 is not None and s.y0 < 0]  # no limit line below zero
    note = " ".join(a.text for a in fig.layout.annotations)
    assert "weights alone" in note and "2 GPUs" in note and "-" not in note.split("GiB usable")[0]
    assert "needs at least 2" in headline(plans)
    fits = planner.compare("llama-3.1-8b", "h100-80gb", schedules=("fm",), tokens=32768, chunk=1024, memory=1024)
    assert fits["fm"].gpus_needed == 1 and "weights alone" not in " ".join(
        a.text for a in plan_memory_figure(fits).layout.annotations)
