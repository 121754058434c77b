"""Cancellation that cancels: the compress loops stop at their checkpoints once the job's flag is
set, a job closed by the app ends its thread, and (slow) a LaCo or pruning run started through
the served app's queue ends its job after Stop, a cancelled request and the visitor leaving.
All by state (the job's thread has ended, the model lock is free, no step ran after the flag),
never by a time or a CPU share."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import torch
from conftest import make_tiny_model

from memstep.cancel import CancelFlag, Cancelled, cancel_scope, checkpoint, current_flag, stop_on_cancel
from ui import jobs

ENDS_WITHIN = 120  # seconds: a bound for a job that never ends (a hang), not a measurement


def wait_until(predicate, limit: float = ENDS_WITHIN) -> bool:
    """Poll ``predicate`` until it holds or ``limit`` seconds pass; whether it held."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def job_ended() -> bool:
    return jobs.running_jobs() == 0 and not jobs.MODEL_LOCK.locked()


class FlagAfter(CancelFlag):
    """Cancelled from its ``after``-th check on: stops a job at a chosen point."""

    def __init__(self, after: int):
        super().__init__()
        self.checks, self.after = 0, after

    @property
    def cancelled(self) -> bool:
        self.checks += 1
        if self.checks >= self.after:
            self.cancel("test")
        return super().cancelled


def test_checkpoint_is_a_no_op_outside_a_job_and_raises_inside_one():
    checkpoint()  # the command line and the tests: never raises
    flag = CancelFlag()
    with cancel_scope(flag):
        checkpoint()
        flag.cancel("stop")
        with pytest.raises(Cancelled, match="stop"):
            checkpoint()
    checkpoint()  # the scope ended: no flag any more


def test_a_closed_stream_ends_its_busy_thread_after_at_most_the_step_in_flight():
    steps = []  # per step the work finished: whether its job's flag was set by then

    def busy():
        flag = current_flag()
        while True:  # a CPU-bound loop with checkpoints, like a pruning step
            checkpoint()
            sum(i * i for i in range(20_000))
            steps.append(flag.cancelled)
            yield "tick"

    stream = jobs.stream(busy, session="s1", heartbeat=0.2)
    assert next(stream) in ("tick", jobs.HEARTBEAT)
    assert wait_until(lambda: len(steps) >= 3) and jobs.running_jobs() == 1  # it really runs
    stream.close()  # what Gradio does after Stop, a cancel or a lost client
    assert wait_until(job_ended), "the job's thread still runs"
    assert steps.count(True) <= 1 and True not in steps[:-1]  # only the step in flight finished after the flag
    assert "s1" not in jobs._flags


def test_stop_sets_the_running_jobs_flag_and_the_stream_reports_it():
    def slow():
        for _ in range(1000):
            time.sleep(0.05)
            checkpoint()
            yield "step"

    stream = jobs.stream(slow, session="s2", heartbeat=0.2)
    next(stream)
    assert jobs.stop("s2") and not jobs.stop("nobody")
    with pytest.raises(Cancelled):
        for _ in stream:
            pass
    time.sleep(0.3)
    assert jobs.running_jobs() == 0 and "s2" not in jobs._flags


def test_heartbeats_come_while_the_work_is_silent():
    def silent():
        time.sleep(0.7)
        yield "late"

    items = list(jobs.stream(silent, heartbeat=0.2))
    assert items.count(jobs.HEARTBEAT) >= 2 and items[-1] == "late"


def test_errors_of_the_work_reach_the_event():
    def broken():
        yield 1
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        list(jobs.stream(broken, heartbeat=0.2))
    assert not jobs.MODEL_LOCK.locked()


def test_laco_stops_between_candidates():
    from memstep.compress.laco import LayerCollapse
    from test_compress_laco import CALIBRATION, ByteTokenizer

    search = LayerCollapse(make_tiny_model(layers=6), ByteTokenizer(), CALIBRATION, C=2, L=0, T=0.99)
    flag, done = CancelFlag(), []
    with cancel_scope(flag), pytest.raises(Cancelled):
        for record in search:
            done.append(record)
            flag.cancel("stop")
    assert len(done) == 1  # the second candidate never started


def test_pruning_stops_within_a_reconstruction_and_generation_stops_early():
    from memstep.compress.sparse.blocks import decoder_layers, embed, layer_kwargs, linear_layers
    from memstep.compress.sparse.config import TrainOptions
    from memstep.compress.sparse.reconstruct import train_blocks

    model = make_tiny_model(layers=1)
    kwargs = layer_kwargs(model, 12)
    x = embed(model, torch.randint(0, 128, (4, 12)).tolist())
    block = decoder_layers(model)[0]
    masks = [{name: torch.ones_like(lin.weight) for name, lin in linear_layers(block).items()}]
    flag = FlagAfter(after=3)
    with cancel_scope(flag), pytest.raises(Cancelled):
        train_blocks([block], 0, kwargs, masks, x, torch.randn_like(x), TrainOptions(steps=50, batch_size=2))
    assert flag.checks == 3  # stopped at the third step's checkpoint, not after 50 steps

    flag = CancelFlag()
    flag.cancel("stop")
    with cancel_scope(flag):
        out = model.generate(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                             max_new_tokens=40, do_sample=False, stopping_criteria=stop_on_cancel(), pad_token_id=0)
    assert out.shape[1] == 4  # one token, then the cancelled job's criterion ended it
    out = model.generate(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                         max_new_tokens=40, do_sample=False, stopping_criteria=stop_on_cancel(), pad_token_id=0)
    assert out.shape[1] > 4  # outside a job the criterion never stops it (eos aside)


# ---- the served app (slow): the process goes idle after Stop, /cancel and a lost client ---------
def _event(demo, fn) -> int:
    return next(index for index, block_fn in demo.fns.items() if block_fn.fn is fn)


class QueueClient:
    """Joins the served app's queue as the page does (any event, private ones included)."""

    def __init__(self, url: str):
        import httpx

        self.url, self.session = url.rstrip("/") + "/gradio_api", uuid.uuid4().hex[:11]
        self.http = httpx.Client(timeout=30)
        self.messages: list[dict] = []
        self.stream = None

    def join(self, fn_index: int, data: list) -> str:
        reply = self.http.post(f"{self.url}/queue/join", json={"data": data, "fn_index": fn_index,
                                                                "session_hash": self.session, "event_data": None})
        reply.raise_for_status()
        event_id = reply.json()["event_id"]
        if self.stream is None or not self.stream.is_alive():  # the server closes the stream when idle
            self.stream = threading.Thread(target=self._listen, daemon=True)
            self.stream.start()
        return event_id

    def _listen(self):
        import httpx

        self.sse = httpx.Client(timeout=None)
        try:
            with self.sse.stream("GET", f"{self.url}/queue/data", params={"session_hash": self.session}) as reply:
                for line in reply.iter_lines():
                    if line.startswith("data:"):
                        self.messages.append(json.loads(line[5:]))
        except Exception:  # noqa: BLE001 - closed by the test (the visitor leaves)
            pass

    def leave(self):
        self.sse.close()

    def wait_for(self, predicate, timeout: float) -> dict:
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            for message in list(self.messages):
                if predicate(message):
                    return message
                if message.get("msg") == "process_completed" and not message.get("success"):
                    raise AssertionError(f"the event failed: {message.get('output')}")
            time.sleep(0.2)
        raise AssertionError(f"no such message within {timeout} s; last: {self.messages[-3:]}")


def _generating(message) -> bool:
    return message.get("msg") == "process_generating"


@pytest.fixture(scope="module")
def served(app_server, tmp_path_factory):
    """The session's app (tests/conftest.py), saving compressed models into a folder of this
    module's own."""
    from ui.models import get_model

    mp = pytest.MonkeyPatch()
    mp.setenv("MEMSTEP_COMPRESSED", str(tmp_path_factory.mktemp("compressed")))  # read at each save
    get_model(None)
    yield app_server
    mp.undo()


LACO = ["embedded", 2, 1, 0, 1, 0.8, "paper", "dense", 6, 128, True, "chained", False]
SPARSE = ["embedded", "wanda", "unstructured", 0.5, ["br+gp"], "text", 16, 128, 5, 1e-3, "norms"]  # 5 epochs: 20 steps


@pytest.mark.slow
@pytest.mark.parametrize("section, how", [("laco", "stop"), ("laco", "cancel"), ("sparse", "leave"),
                                          ("sparse", "stop")])
def test_stopping_a_compression_in_the_app_ends_its_job(served, section, how, monkeypatch):
    from ui.tabs.compress import laco, sparse

    demo, url = served
    produced = []  # per item the job's work produced: whether its flag was set by then
    started = threading.Event()
    stream = jobs.stream

    def watched_stream(work, session="", heartbeat=jobs.HEARTBEAT_SECONDS):
        def watched():
            flag = current_flag()
            started.set()
            for item in work():
                produced.append(flag.cancelled)
                yield item
        return stream(watched, session, heartbeat)

    monkeypatch.setattr(jobs, "stream", watched_stream)
    run_fn, stop_fn, data = ((laco.run_laco, laco.stop_laco, LACO) if section == "laco"
                             else (sparse.prune, sparse.stop_pruning, SPARSE))
    client = QueueClient(url)
    event_id = client.join(_event(demo, run_fn), data)
    client.wait_for(_generating, 120)  # the job started and streams
    assert started.wait(ENDS_WITHIN), "the work never started"
    assert jobs.running_jobs() == 1 and jobs.MODEL_LOCK.locked(), client.messages[-2:]
    if how == "stop":
        client.join(_event(demo, stop_fn), [])
    elif how == "cancel":
        client.http.post(f"{client.url}/cancel", json={"session_hash": client.session, "event_id": event_id,
                                                       "fn_index": _event(demo, run_fn)})
    else:
        client.leave()
    assert wait_until(job_ended), f"the {section} job still runs after {how}"
    # the work stopped at its next checkpoint: at most the item in flight came after the flag
    assert produced.count(True) <= 1 and True not in produced[:-1], produced
    # no flag of a finished job stays behind (the event's generator drops it as it closes, just after
    # the job's thread has ended: a state to wait for, not to catch at once)
    assert wait_until(lambda: not jobs._flags), jobs._flags
