"""Share and keep a run: a link whose query string reopens the same settings, and the run's
files (its JSON, as `memstep run --json` writes it, and the step table as CSV).

Query strings arrive from anyone: every value is checked like a control's, and one that does
not pass is dropped with a note (the page opens with the rest).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from memstep.errors import MemstepError
from memstep.presets import AUTO, ROPE_CHOICES
from memstep.records import RunResult
from memstep.schedules import GROWTHS
from memstep.scorers import SCORERS

from ui.documents import EXAMPLES
from ui.inputs import choice, whole_number
from ui.runs import MAX_SINKS, MAX_TOKENS_LIMIT

SCHEDULES = ("full", "fm", "im", "imdc")
# control -> query key, in the order a link lists them
KEYS = ("example", "schedule", "growth", "chunk", "memory", "sinks", "max_tokens", "scorer", "rope",
        "question_aware", "question", "model")
MAX_QUESTION_CHARS = 500  # in a link
DOWNLOADS = Path(tempfile.gettempdir()) / "memstep-downloads"
KEEP_SECONDS = 3600  # a run's files are kept an hour (enough to click; the folder stays small)


def example_slug(name: str) -> str:
    """'Passkey in Persuasion (1.5k tokens)' -> 'passkey-in-persuasion'."""
    return re.sub(r"[^a-z0-9]+", "-", name.split(" (")[0].lower()).strip("-")


SLUGS = {example_slug(name): name for name in EXAMPLES}


def example_from(value: str) -> str:
    """An example's full name from its name or its slug (MemstepError otherwise)."""
    if value in EXAMPLES:
        return value
    slug = example_slug(value)
    if slug in SLUGS:
        return SLUGS[slug]
    raise MemstepError(f"unknown example '{value[:60]}': use one of {', '.join(SLUGS)}")


def _flag(value: str) -> bool:
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise MemstepError(f"question_aware must be true or false (got {value[:20]!r})")


def parse_query(params, models: list[str]) -> tuple[dict, list[str]]:
    """The settings a link asks for ({control key: value}) and a note per value refused."""
    checks = {
        "example": example_from,
        "schedule": lambda v: choice(v, "schedule", SCHEDULES, "imdc"),
        "growth": lambda v: choice(v, "growth", list(GROWTHS), "linear"),
        "chunk": lambda v: whole_number(v, "chunk", 16, 8192),
        "memory": lambda v: whole_number(v, "memory", 0, 8192),
        "sinks": lambda v: whole_number(v, "sinks", 0, MAX_SINKS),
        "max_tokens": lambda v: whole_number(v, "max tokens", 1, MAX_TOKENS_LIMIT),
        "scorer": lambda v: choice(v, "scorer", list(SCORERS), "chunk-attention"),
        "rope": lambda v: choice(v, "RoPE positions", ROPE_CHOICES, AUTO),
        "question_aware": _flag,
        "question": lambda v: v[:MAX_QUESTION_CHARS],
        "model": lambda v: v if v in models else _refuse(f"model '{v[:60]}' is not offered here"),
    }
    chosen, refused = {}, []
    for key in KEYS:
        value = params.get(key) if hasattr(params, "get") else None
        if value is None:
            continue
        try:
            chosen[key] = checks[key](str(value))
        except MemstepError as err:
            refused.append(str(err))
    return chosen, refused


def _refuse(message: str):
    raise MemstepError(message)


def settings_query(example: str | None, schedule, growth, chunk, memory, sinks, max_tokens, scorer, rope,
                   question_aware, question, model, default_question: str = "", default_model: str = "") -> str:
    """'?example=...&schedule=fm&...' for these settings (the question and the model only when
    they are not the document's and the app's own)."""
    values = {"example": example_slug(example) if example in EXAMPLES else None, "schedule": schedule,
              "growth": growth if schedule in ("im", "imdc") else None, "chunk": chunk, "memory": memory,
              "sinks": sinks, "max_tokens": max_tokens, "scorer": scorer, "rope": rope,
              "question_aware": "true" if question_aware else None,
              "question": question if question and question != default_question else None,
              "model": model if model and model != default_model else None}
    pairs = [(k, _plain(v)) for k, v in values.items() if v not in (None, "")]
    return "?" + urlencode(pairs)


def _plain(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def link_html(query: str, uploaded: bool) -> str:
    """The link to these settings (relative: it keeps the page's own address)."""
    note = (" (an uploaded document is not in the link: the link opens the settings on the default example)"
            if uploaded else "")
    return (f'<span class="memstep-share"><a href="{query}" id="memstep-link">Link to these settings</a>'
            f'{note}</span>')


# ---- the run's files ------------------------------------------------------------------
STEP_COLUMNS = ("step", "chunk_start", "chunk_size", "memory_before", "memory_budget", "memory_after", "seconds",
                "cpu_seconds", "bytes_modeled", "bytes_measured", "kv_bytes_actual", "evicted", "first_position",
                "question_tokens")


def run_json(result: RunResult) -> str:
    """The run as `memstep run --json` prints it (RunResult.to_dict)."""
    return json.dumps(result.to_dict())


def steps_csv(result: RunResult, cpu_seconds: list[float] | None = None) -> str:
    """One row per step: sizes, wall and CPU seconds, bytes modeled (and by part) and measured.
    Steps are counted from 1, as the page counts them."""
    parts = sorted({p for s in result.steps for p in s.bytes_modeled_parts})
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(list(STEP_COLUMNS) + [f"bytes_modeled_{p}" for p in parts])
    for i, step in enumerate(result.steps):
        row = step.to_dict()
        row["step"] = step.step + 1
        row["cpu_seconds"] = round(cpu_seconds[i], 6) if cpu_seconds and i < len(cpu_seconds) else ""
        writer.writerow([("" if row.get(c) is None else row.get(c)) for c in STEP_COLUMNS]
                        + [step.bytes_modeled_parts.get(p, 0) for p in parts])
    return out.getvalue()


def write_files(result: RunResult, label: str, cpu_seconds: list[float] | None = None) -> tuple[str, str]:
    """The run's JSON and CSV as files to download (older ones are removed)."""
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in DOWNLOADS.iterdir():
        try:
            if now - old.stat().st_mtime > KEEP_SECONDS:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        except OSError:
            pass
    stem = re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower() or "run"
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=DOWNLOADS))
    json_path, csv_path = folder / f"memstep-{stem}.json", folder / f"memstep-{stem}-steps.csv"
    json_path.write_text(run_json(result), encoding="utf-8")
    csv_path.write_text(steps_csv(result, cpu_seconds), encoding="utf-8")
    return str(json_path), str(csv_path)
