"""Honest time on a shared machine: CPU seconds beside wall seconds, the machine's load, the
planner's modeled FLOPs, and estimates of what is left.

Wall seconds of runs taken at different moments on a shared CPU are not comparable (another
job's burst can make one configuration ten times slower); the CPU seconds this process spends
on a run barely move with the load, and the FLOPs the planner counts do not move at all.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Iterator

from memstep.memory import ModelShape
from memstep.planner import GPU_PRESETS, plan_schedule
from memstep.schedules import Schedule

try:  # on ZeroGPU the prefill runs in a forked worker: this process's CPU time says nothing there
    import spaces
except ImportError:
    spaces = None


def cpu_time_measured(device: str) -> bool:
    """Whether this process's CPU time is the run's own work: a CPU run in this process."""
    return spaces is None and str(device).startswith("cpu")


def timed(stream: Iterable[tuple]) -> Iterator[tuple]:
    """(kind, item, cpu_seconds) for each (kind, item) of ``stream``: the process CPU time spent
    producing it (all of torch's threads; one prefill runs at a time in the app)."""
    items = iter(stream)
    while True:
        began = time.process_time()
        try:
            kind, item = next(items)
        except StopIteration:
            return
        yield kind, item, time.process_time() - began


def machine_load() -> tuple[float, int] | None:
    """(load average over the last minute, cores), or None where the system does not say."""
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (OSError, AttributeError):
        return None


def shared_note(load: tuple[float, int] | None = None) -> str | None:
    """A note when the machine runs more work than it has cores (wall seconds then follow the
    other jobs), else None."""
    load = machine_load() if load is None else load
    if load is None or load[0] <= load[1]:
        return None
    return (f"shared machine: load {load[0]:.1f} on {load[1]} core{'s' * (load[1] != 1)}, so wall seconds "
            "follow the other jobs")


def modeled_flops(config, schedule: Schedule, sinks: int, question_tokens: int = 0) -> int | None:
    """The planner's FLOP count of a run of ``schedule`` on a model with this config (the same
    count for any device): the work, independent of the machine's load."""
    try:
        shape = ModelShape.from_config(config)
        return plan_schedule(shape, GPU_PRESETS["a100-80gb"], schedule, dtype="fp32", sinks=sinks,
                             question_tokens=question_tokens, device="cpu").flops
    except Exception:  # noqa: BLE001 - an unusual config: the column says "—", the run goes on
        return None


def seconds_left(done_seconds: float, done_tokens: int, total_tokens: int) -> float | None:
    """Seconds still to go at the speed so far (tokens per second), or None before any token."""
    if done_tokens <= 0 or done_seconds <= 0:
        return None
    return done_seconds / done_tokens * max(0, total_tokens - done_tokens)


def about(seconds: float | None) -> str:
    """'about 12 s' / 'about 2 min' / '' for an estimate."""
    if seconds is None:
        return ""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    return f"about {seconds / 60:.0f} min"


def planned_seconds(config, schedule: Schedule, sinks: int, question_tokens: int = 0,
                    device: str = "cpu") -> float | None:
    """The planner's prediction of a run's prefill seconds on this machine: its FLOP count at this
    machine's measured matmul rate times the fraction of it whole runs reach here (ui/estimates.py).
    None off the CPU (the rate measured is the CPU's) or for a config the planner cannot read."""
    if not str(device).startswith("cpu"):
        return None
    flops = modeled_flops(config, schedule, sinks, question_tokens)
    if not flops:
        return None
    from ui.estimates import EFFICIENCY, matmul_flops_per_second

    return flops / (matmul_flops_per_second() * EFFICIENCY)


def preview_config(spec: str | None):
    """The config of ``spec`` for an estimate before a run: the loaded model's, else the embedded
    model's (read from its folder, no weights); None for another model not loaded yet."""
    from ui.models import cached_model, normalize_spec

    try:
        lm = cached_model(spec)
        if lm is not None:
            return lm.model.config
        return _embedded_config() if normalize_spec(spec) == "embedded" else None
    except Exception:  # noqa: BLE001 - no estimate is better than no preview
        return None


@functools.lru_cache(maxsize=1)
def _embedded_config():
    from transformers import AutoConfig

    from memstep.models import embedded_model_folder

    return AutoConfig.from_pretrained(str(embedded_model_folder()))


@functools.lru_cache(maxsize=1)
def resolved_device() -> str:
    """Where a run of this app goes ("cpu", "cuda", ...): the estimate before a run needs it."""
    from memstep.models import resolve_device

    return str(resolve_device("auto"))
