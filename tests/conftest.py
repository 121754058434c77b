"""Shared fixtures: a tiny random-init Llama for fast tests, the embedded model where real
behaviour matters (session-scoped: loaded once, a few seconds after the first conversion)."""

from __future__ import annotations

import contextlib
import gc
import os
import time
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


def netherfield(folder: Path, chars: int) -> Path:
    """The opening of Pride and Prejudice, its first ``chars`` characters cut at a line's end, as
    ``folder``/netherfield.txt: the browser tests' short documents (about 230 tokens a 1,000 chars)."""
    text = (ASSETS / "pride_and_prejudice_ch1-12.txt").read_text()
    path = folder / "netherfield.txt"
    path.write_text(text[:chars].rsplit("\n", 1)[0])
    return path


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
# The tests of the session's app server and browser form two groups, one per worker (each worker
# starts its own server and Chromium): a browser test is a chain (server, page, Playwright) that
# keeps about one core busy, so one group for all of them would be the whole suite's long pole.
# These files make the second group, about half of the work (measured per file; docs/benchmarks.md,
# "The test suite").
APP_SECOND_GROUP = {"test_app_screens.py", "test_app_api.py", "test_long_browser.py",
                    "test_compress_sparse_browser.py", "test_reference_app.py", "test_cancel.py",
                    "test_app_identity.py"}
# Handed out first (longest first, so no long group starts last): the two app groups, then the
# files whose tests run the real models longest. The rest follow in collection order.
LONG_GROUPS = ["app-1", "app-2", "tests/test_eval_ray.py", "tests/test_eval_cli.py", "tests/test_eval_ray_resume.py",
               "tests/test_fidelity.py", "tests/test_compress_sparse.py", "tests/test_generate.py", "tests/test_gemma3.py",
               "tests/test_compress_laco.py", "tests/test_compress_laco_app.py", "tests/test_cli.py"]


def xdist_group_of(item) -> str:
    """The pytest-xdist group of a test: its app group, else its file."""
    path = item.nodeid.split("::")[0]
    if SESSION_APP_FIXTURES & set(item.fixturenames):
        return "app-2" if path.rsplit("/", 1)[-1] in APP_SECOND_GROUP else "app-1"
    return path


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the marks into node ids
def pytest_collection_modifyitems(config, items):
    """For pytest-xdist's --dist loadgroup (with --no-loadscope-reorder, `make test`): a test file
    runs on one worker (its module fixtures are made once), the tests of the session's app server
    and browser in two groups, and the long groups are handed out first.

    pytest-xdist tags each node id with its group; where it cannot (pytest 9 keeps node ids where
    pytest-xdist 3.8 does not look), every file would run on both workers, each building its own
    models, app server and browser: pytest_xdist_node_collection_finished stops the run instead."""
    groups = {}
    for item in items:
        groups[item] = xdist_group_of(item)
        item.add_marker(pytest.mark.xdist_group(groups[item]))
    rank = {name: i for i, name in enumerate(LONG_GROUPS)}
    items.sort(key=lambda item: rank.get(groups[item], len(rank)))  # stable: files keep their order


def pytest_collection_finish(session):
    """Everything imported by now (torch, transformers, gradio: millions of objects) lives as long
    as the run: frozen, Python's full collections stop scanning it (they took ~0.3 s each)."""
    gc.collect()
    gc.freeze()


def pytest_xdist_node_collection_finished(node, ids):
    """In pytest-xdist's controller: every test collected by a worker under --dist loadgroup must
    carry its group (see above), else the run stops here, saying why."""
    if node.config.getvalue("dist") == "loadgroup" and ids and "@" not in ids[0]:
        pytest.exit("pytest-xdist did not tag the tests with their groups (--dist loadgroup): each file would "
                    "run on both workers. Install the pytest and pytest-xdist of requirements-dev.txt", returncode=3)


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


@pytest.fixture
def hold_for_stop(monkeypatch):
    """``hold_for_stop(steps)`` arms a hold on the next run the session's app streams: after
    ``steps`` steps the run waits until Stop is pressed (at most 60 s) before it reads on. A test
    that presses Stop then always presses it while the run is running: on a loaded machine a short
    run could end before the click reached the server (seen: Stop reached it 16 s after the run
    began, by which time a 47-step run had ended). What is
    checked stays real: the Stop button, its event, the run ending on its own "stopped" update with
    no step after it. The app serves in this process, so the patch reaches its handlers."""
    from ui import handlers

    streamed = handlers.timed

    def arm(steps: int = 2) -> None:
        armed = [True]

        def held(stream):
            seen = 0
            for event in streamed(stream):
                yield event
                seen += event[0] == "step"
                if armed[0] and seen == steps:
                    armed[0] = False
                    deadline = time.monotonic() + 60
                    while not handlers._STOP_REQUESTS and time.monotonic() < deadline:
                        time.sleep(0.02)

        monkeypatch.setattr(handlers, "timed", held)

    return arm


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


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Remember on the test that it failed (its setup or its call): a shared page it used is
    opened afresh for the next test."""
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


class SharedAppPage:
    """A page that a module's browser tests share. Opening the app costs Chromium some 4 CPU-s
    (Gradio's and Plotly's scripts) and the server a new session, a third of a short browser
    test: a test that works from whatever state the last one left goes on in the same page. The app
    is opened afresh for the first test, for a test marked ``fresh_page`` (it checks what a new
    visitor gets), and after a test that failed (the page's state is then unknown)."""

    def __init__(self, page, url: str):
        self.page, self.url, self.stale = page, url, True

    def open_for(self, request):
        from ui.browser import open_app

        if self.stale or request.node.get_closest_marker("fresh_page"):
            open_app(self.page, self.url)
            self.stale = False
        return self.page

    def close_for(self, request) -> None:
        if request.node.stash.get(FAILED, False):
            self.stale = True


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
