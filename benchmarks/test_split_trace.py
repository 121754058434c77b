"""Where memstep's default question-aware FM loses test-split answers: step by step, what each memory keeps
of the answer and of the words around it, and what the model reads from it. Writes JSON
(results/test-split/test_split_trace.json) and a table into docs/test-split.md's block ``test-split-trace``.

The cases: those of ``--length`` where the full cache answers, memstep's default FM at M = ``--memory``
does not, and kvpress ChunkKV at the same M does (the losses the issue is about), the first ``--cases``
of them in the split's order. For each, the default FM runs again with its kept positions recorded:
after every step, the share of (layer, KV head) slots holding the answer's tokens and the seven tokens on
each side of them; the step whose cut drops the answer's share most; and the one cut after a full
prefill (``once``, exact KV, one ranking) from the results folder: if that answers, chunking loses it.

    .venv/bin/python benchmarks/test_split_trace.py --cases 4 --docs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.docs_block import write_block  # noqa: E402
from memstep.evaluation.metrics import case_of  # noqa: E402
from memstep.evaluation.report import _at_defaults  # noqa: E402
from memstep.evaluation.store import ResultStore  # noqa: E402

FOLDER = ROOT / "results" / "test-split"
NEIGHBOURS = 7  # the default's max-pool reach on each side


def _is_default_fm(config: dict, memory: int, schedule: str = "fm") -> bool:
    return config["kind"] == "memstep" and config["schedule"] == schedule and config.get("question_aware") and \
        config.get("budget") == memory and _at_defaults(config)


def losses(cells: list[dict], length: int, memory: int) -> list[tuple]:
    """The cases (case_of) the full cache and ChunkKV answer at ``memory`` and the default FM does not."""
    by = {}
    for c in cells:
        if c["length"] != length:
            continue
        conf = c["config"]
        if conf["kind"] == "memstep" and conf["schedule"] == "full":
            by.setdefault(case_of(c), {})["full"] = c
        elif _is_default_fm(conf, memory):
            by.setdefault(case_of(c), {})["fm"] = c
        elif _is_default_fm(conf, memory, "once"):
            by.setdefault(case_of(c), {})["once"] = c
        elif conf["kind"] == "kvpress" and conf["scorer"] == "chunkkv" and conf.get("budget") == memory:
            by.setdefault(case_of(c), {})["chunkkv"] = c
    return [(key, found) for key, found in by.items()
            if {"full", "fm", "chunkkv"} <= set(found) and found["full"]["correct"] and found["chunkkv"]["correct"]
            and not found["fm"]["correct"]]


def held_share(kept: np.ndarray, span: range) -> float:
    """The share of (layer, KV head, token) slots of ``span`` that ``kept`` (layers, heads, entries) holds."""
    if not len(span):
        return 0.0
    slots = kept.shape[0] * kept.shape[1]
    return float(sum(np.isin(np.asarray(list(span)), kept[layer, head]).sum()
                     for layer in range(kept.shape[0]) for head in range(kept.shape[1])) / (slots * len(span)))


def trace(lm, case, memory: int, chunk: int) -> dict:
    from memstep.evaluation.runner import EvalSettings
    from memstep.evaluation.worker import document_run

    config = {"kind": "memstep", "schedule": "fm", "budget": memory, "chunk": chunk, "rope": "shared",
              "question_aware": True, "scorer": "chunk-attention"}
    run = document_run(lm, config, EvalSettings(chunk=chunk).key_fields(), case.to_dict(), case.question, [])
    head = len(run.head)
    first, last = case.passkey_tokens
    answer = range(head + first, head + last)
    around = range(max(head, head + first - NEIGHBOURS), head + first)
    after = range(head + last, min(head + len(case.document_ids), head + last + NEIGHBOURS))
    rows = []
    for step in run:
        read_to = step.chunk_start + step.chunk_size
        if read_to <= answer.start:
            continue
        rows.append({"step": step.step, "answer": held_share(step.kept_positions, answer),
                     "before": held_share(step.kept_positions, around), "after": held_share(step.kept_positions, after)})
    result = run.result
    drops = [(rows[i - 1]["answer"] - rows[i]["answer"], rows[i]["step"]) for i in range(1, len(rows))]
    return {"kind": case.kind, "depth": case.depth, "haystack": case.haystack, "expected": case.passkey,
            "question": case.question, "steps": rows, "answered": result.answer,
            "worst_cut": max(drops)[1] if drops and max(drops)[0] > 0 else None}


def table(traced: list[dict]) -> str:
    lines = ["| needle (depth) | expected | memstep's answer | answer's slots kept, read step → end | the 7 before / after, end | worst cut | one cut after a full prefill |",
             "|---|---|---|---:|---:|---:|---|"]
    for t in traced:
        s = t["steps"]
        once = {True: "answers", False: "misses", None: "-"}[t.get("once")]
        lines.append(f"| {t['kind']} ({100 * t['depth']:.0f}%) | {t['expected']} | {t['answered'].strip()[:60]!r} | "
                     f"{s[0]['answer']:.2f} → {s[-1]['answer']:.2f} | {s[-1]['before']:.2f} / {s[-1]['after']:.2f} | "
                     f"{t['worst_cut'] or '-'} of {s[-1]['step']} | {once} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--memory", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--cases", type=int, default=4)
    parser.add_argument("--docs", action="store_true")
    args = parser.parse_args(argv)
    import torch

    from memstep.evaluation.splits import test_cases
    from memstep.models import load_model

    torch.set_num_threads(1)
    found = losses(ResultStore(FOLDER).cells(), args.length, args.memory)
    lm = load_model(None, "cpu", "float32")
    cases = {case_of({**c.cell, "kind": c.kind}): c for c in test_cases(lm.tokenizer, [args.length])}
    traced = []
    for key, cells in found[:args.cases]:
        t = trace(lm, cases[key], args.memory, args.chunk)
        t["once"] = cells["once"]["correct"] if "once" in cells else None
        t["stored_answer"] = cells["fm"].get("answer")
        traced.append(t)
    (FOLDER / "test_split_trace.json").write_text(json.dumps({"length": args.length, "memory": args.memory, "losses": len(found),
                                                   "cases": traced}, indent=1))
    once = [cells["once"]["correct"] for _, cells in found if "once" in cells]
    text = (f"{len(found)} cases at {args.length:,} tokens, M = {args.memory}: the full cache and ChunkKV answer, "
            "memstep's default FM does not"
            + (f"; memstep's rule in one cut after a full prefill answers {sum(once)} of the {len(once)} of them it ran"
               if once else "")
            + f". The first {len(traced)}:\n\n" + table(traced))
    print(text)
    if args.docs:
        write_block("test-split-trace", text, "python benchmarks/test_split_trace.py --docs", doc=ROOT / "docs" / "test-split.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
