"""Shared fixtures: a tiny random-init Llama for fast tests, the embedded model where real
behaviour matters (session-scoped: loaded once, a few seconds after the first conversion)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets"
ARTIFACTS = ROOT / "test-artifacts"

# One torch thread per pytest-xdist worker (`make test` runs two): two threads each would
# oversubscribe the cores; a run without workers keeps two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))

# Exhaustive scans (rounding grids, fuzzing, property tests) take a sample in the suite and run
# whole with MEMSTEP_FULL_SCANS=1 (benchmarks/bench_tests.py --scans), so the suite stays fast.
FULL_SCANS = os.environ.get("MEMSTEP_FULL_SCANS") == "1"


def scan_size(whole: int, suite: int) -> int:
    """How many cases a scan runs: ``whole`` with MEMSTEP_FULL_SCANS=1, else ``suite``."""
    return whole if FULL_SCANS else min(whole, suite)


def make_tiny_model(model_type: str = "llama", layers: int = 2, seed: int = 0, **overrides):
    """A random-init causal LM of the given family: 4 query heads, 2 KV heads (GQA)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    settings = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=4096, tie_word_embeddings=False)
    settings.update(overrides)
    config = AutoConfig.for_model(model_type, **settings)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval()


SESSION_APP_FIXTURES = {"app_server", "served_app", "app_url", "browser"}


def pytest_collection_modifyitems(config, items):
    """For pytest-xdist's --dist loadgroup: a test file runs on one worker (its module fixtures
    are made once), and every test of the session's app server and browser on the same worker
    (one server and one browser in all)."""
    for item in items:
        group = "app" if SESSION_APP_FIXTURES & set(item.fixturenames) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def no_schedule_work(monkeypatch):
    """Refusals "before any work", by state: building any schedule (its chunks, its budgets, the
    Schedule itself) fails the test."""
    from memstep import schedules

    def built(*args, **kwargs):
        raise AssertionError("a schedule was built before the refusal")

    for name in ("Schedule", "_fixed_chunks", "_imdc_chunks", "growth_budget", "layer_growth_budgets"):
        monkeypatch.setattr(schedules, name, built)


@pytest.fixture(scope="session")
def tiny_model():
    return make_tiny_model()


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct as a LoadedModel (memstep.models.load_model)."""
    from memstep.models import load_model

    return load_model("embedded", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def artifacts_dir():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# ---- the app and headless Chromium: one server and one browser per test session ----------------
@pytest.fixture(scope="session")
def app_server():
    """The app as `make demo` serves it (default model, no environment set), shared by every test
    that needs no server of its own: (the Gradio Blocks, its URL)."""
    from ui.browser import serve
    from ui.layout import build_app

    demo = build_app()
    with serve(demo) as url:
        yield demo, url


@pytest.fixture(scope="session")
def served_app(app_server):
    return app_server[1]


def _need_chromium():
    from ui.browser import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make chromium)")


@pytest.fixture(scope="session")
def app_url(served_app):
    _need_chromium()
    return served_app


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session. While it runs, ui.browser.chromium() (and so
    chromium_page()) hands out this browser instead of starting another Playwright, which could
    not run beside it in this thread; the contexts a test opened through it are closed after."""
    _need_chromium()
    from ui import browser as ui_browser

    started = ui_browser.chromium

    @contextlib.contextmanager
    def shared():
        before = set(browser.contexts)
        try:
            yield browser
        finally:
            for context in browser.contexts:
                if context not in before:
                    context.close()

    with started() as browser:
        ui_browser.chromium = shared
        try:
            yield browser
        finally:
            ui_browser.chromium = started
