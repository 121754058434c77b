"""Property tests of `memstep schedule` and `memstep plan` over 1,000 generated settings: each call
ends with exit 0 and valid JSON (chunks positive and summing to the tokens, budgets never
above M, no NaN) or exit 2 with one line. In-process through memstep.cli.main. The suite
runs a fifth of the examples; MEMSTEP_FULL_SCANS=1 (benchmarks/bench_tests.py --scans) all 1,000."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout

import pytest
from conftest import scan_size
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstep import planner
from memstep.cli import main
from memstep.schedules import GROWTHS, MAX_STEPS

pytestmark = pytest.mark.scan  # sampled here; whole with MEMSTEP_FULL_SCANS=1

# Sizes from the edges (0, negative, 1) through ordinary ones to far beyond every bound.
SIZES = st.one_of(st.integers(-3, 3), st.integers(1, 5000), st.integers(1, 10**7),
                  st.sampled_from([2**30, 2**30 + 1, 10**12, 10**60]))
SCHEDULE = st.sampled_from(["full", "fm", "im", "imdc"])
GROWTH = st.sampled_from(GROWTHS)
# Plans: chunks from the edges and from realistic sizes (a plan near the step cap takes seconds).
PLAN_CHUNKS = st.one_of(st.integers(-3, 3), st.integers(64, 10**6), st.sampled_from([2**30, 2**30 + 1, 10**60]))
# No deadline: a test asserts no time (a loaded machine would fail it without any bug).
RUNS = settings(max_examples=scan_size(750, 150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A plan of a layer-wise growth near the step cap takes seconds (per-layer budgets): fewer examples.
PLANS = settings(max_examples=scan_size(250, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def call(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def check_refusal(code, err):
    lines = [line for line in err.strip().splitlines() if not line.startswith("memstep: warning:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memstep: error:"), (code, err)


def no_nan(value):
    if isinstance(value, float):
        assert math.isfinite(value)
    elif isinstance(value, dict):
        for item in value.values():
            no_nan(item)
    elif isinstance(value, list):
        for item in value:
            no_nan(item)


@RUNS
@given(tokens=SIZES, chunk=SIZES, memory=SIZES, sinks=st.integers(-5, 600), schedule=SCHEDULE, growth=GROWTH)
def test_schedule_property(tokens, chunk, memory, sinks, schedule, growth):
    code, out, err = call(["schedule", "--tokens", tokens, "--chunk", chunk, "--memory", memory,
                           "--sinks", sinks, "--schedule", schedule, "--growth", growth, "--json"])
    if code != 0:
        check_refusal(code, err)
        return
    data = json.loads(out)
    chunks, budgets = data["chunk_sizes"], data["memory_sizes"]
    assert all(c >= 1 for c in chunks) and sum(chunks) == tokens and len(chunks) <= MAX_STEPS
    if schedule != "full":
        assert all(0 <= m <= memory for m in budgets) and budgets[-1] == memory


@PLANS
@given(tokens=SIZES, chunk=PLAN_CHUNKS, memory=SIZES, sinks=st.integers(-5, 600), schedule=SCHEDULE, growth=GROWTH,
       model=st.sampled_from(list(planner.MODEL_PRESETS)), gpu=st.sampled_from(list(planner.GPU_PRESETS)),
       attention=st.sampled_from(["sdpa", "eager", "padded"]), dtype=st.sampled_from(["bf16", "fp16", "fp32"]))
def test_plan_property(tokens, chunk, memory, sinks, schedule, growth, model, gpu, attention, dtype):
    code, out, err = call(["plan", "--tokens", tokens, "--chunk", chunk, "--memory", memory, "--sinks", sinks,
                           "--schedule", schedule, "--growth", growth, "--model", model, "--gpu", gpu,
                           "--attention", attention, "--dtype", dtype, "--json"])
    if code != 0:
        check_refusal(code, err)
        return
    report = json.loads(out)
    no_nan(report)
    steps = report["steps"]
    assert sum(s["chunk_size"] for s in steps) == tokens and all(s["chunk_size"] >= 1 for s in steps)
    assert report["peak_bytes"] == max(s["peak_bytes"] for s in steps) > 0
    assert report["fits"] == (report["peak_bytes"] <= report["usable_bytes"])
    if schedule != "full":
        assert all(s["memory_after"] <= memory + max(sinks, 0) for s in steps)
