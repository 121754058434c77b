"""Where the public needle is lost: step by step in question-aware FM, and whether the kept
set or the chunked KV is to blame. Writes JSON (results/niah/needle_trace.json) and a table.

For each needle depth (``memstep eval --benchmark niah``'s cases) four runs of the embedded
model, M and chunk as given, the question voting at every step with the first of
``--question-pools`` (max:15, the engine's default before the needle test):
- FM: the share of (layer, KV head, answer token) entries held after each step, and the answer;
- FM with the answer pinned (an oracle: the answer's tokens outrank everything in every cut);
- one cut after the whole document (``once``): exact KV, one global ranking;
- one cut that keeps exactly FM's final set: exact KV, FM's choice of entries.
If the last run answers as FM does, the chunked KV is not what loses the needle: the choice is.
Then FM alone with each other pool (e.g. follow:15), on the same cases.

    python benchmarks/needle_trace.py --depths 10,20,30,40,50,60,70,80,90 --block needle-trace
    python benchmarks/needle_trace.py --length 4096 --question-pools follow:15 \
        --output results/niah/needle_trace_4096.json --block needle-trace-4096
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from memstep.question_pool import QUESTION_POOL  # noqa: E402

PIN = 1e30  # a score nothing real reaches: a pinned entry wins every cut
engine_layers = [0]  # the model's layer count, set once it is loaded


@contextmanager
def pinned(choose):
    """Run the engine's cuts with ``choose(layer, positions) -> bool mask`` pinned: the cut
    functions are wrapped where the engine looks them up; the n-th cut of a step is layer n
    (the model has no sliding layers, so every layer cuts, in order)."""
    import memstep.engine as engine

    originals = engine.select_kept, engine.select_spans
    calls = {"n": 0}

    def boost(scores, positions):
        layer = calls["n"] % engine_layers[0]
        calls["n"] += 1
        mask = choose(layer, positions)
        return scores.float().masked_fill(mask, PIN) if mask is not None else scores

    def kept(scores, positions, *args, **kwargs):
        return originals[0](boost(scores, positions), positions, *args, **kwargs)

    def spans(scores, positions, *args, **kwargs):
        return originals[1](boost(scores, positions), positions, *args, **kwargs)

    engine.select_kept, engine.select_spans = kept, spans
    try:
        yield
    finally:
        engine.select_kept, engine.select_spans = originals


def run_case(lm, case, schedule: str, chunk: int, memory: int, span: str | None, pool: str):
    from memstep.runner import DocumentRun

    if schedule == "once":
        schedule, chunk = "fm", len(case.head_ids) + len(case.document_ids)
    run = DocumentRun(lm, case.document_ids, schedule=schedule, chunk=chunk, memory=memory, question=case.question,
                      max_new_tokens=40, question_aware=True, span=span, question_pool=pool)
    answer_at = range(len(run.head) + case.passkey_tokens[0], len(run.head) + case.passkey_tokens[1])
    trace = []
    for step in run:
        held = np.isin(step.kept_positions, np.asarray(answer_at)).sum(axis=2)  # (layers, heads)
        trace.append({"chunk_start": step.chunk_start, "retention": round(float(held.mean() / len(answer_at)), 3),
                      "whole": round(float((held == len(answer_at)).mean()), 3)})
    return run.result, trace, answer_at


def measure(lm, case, chunk: int, memory: int, span: str | None, pools: list[str]) -> dict:
    """The four runs at the first pool (the one diagnosed); FM alone at each other pool."""
    import torch

    from memstep.evaluation.niah import niah_recall

    right = lambda result: niah_recall(result.answer, "niah") == 1.0  # noqa: E731
    pool = pools[0]
    fm, trace, answer_at = run_case(lm, case, "fm", chunk, memory, span, pool)
    lo, hi = answer_at.start, answer_at.stop
    with pinned(lambda layer, positions: (positions >= lo) & (positions < hi)):
        oracle, _, _ = run_case(lm, case, "fm", chunk, memory, span, pool)
    once, once_trace, _ = run_case(lm, case, "once", chunk, memory, span, pool)
    final = torch.as_tensor(fm.steps[-1].kept_positions)  # (layers, heads, entries), -1 padded

    def fm_set(layer, positions):
        wanted = final[layer].to(positions.device)
        return (positions[:, :, None] == wanted[:, None, :]).any(-1)

    with pinned(fm_set):
        same_set, _, _ = run_case(lm, case, "once", chunk, memory, span, pool)
    agree = bool((np.sort(same_set.steps[-1].kept_positions, -1) == np.sort(fm.steps[-1].kept_positions, -1)).all())
    others = {}
    for other in pools[1:]:
        result, other_trace, _ = run_case(lm, case, "fm", chunk, memory, span, other)
        others[other] = {"right": right(result), "answer": result.answer, "trace": other_trace}
    return {"depth": case.depth, "fm": {"right": right(fm), "answer": fm.answer, "trace": trace},
            "fm_pinned": {"right": right(oracle), "answer": oracle.answer},
            "once": {"right": right(once), "answer": once.answer, "trace": once_trace},
            "once_fm_set": {"right": right(same_set), "answer": same_set.answer, "set_equal": agree},
            "pools": others}


def table(saved: dict) -> str:
    rows, pools = saved["rows"], saved["question_pools"]
    mark = lambda ok: "yes" if ok else "no"  # noqa: E731

    def kept(trace):  # the best step (the one that read the needle) and the last
        return f"{max(s['retention'] for s in trace):.2f} / {trace[-1]['retention']:.2f}"

    first, others = pools[0], pools[1:]
    lines = [f"{saved['length']} tokens, M = {saved['memory']}, chunk {saved['chunk']}, question-aware, span "
             f"{saved['span'] or 'none (token top-k)'}. Answer retention: the share of (layer, KV head, answer "
             "token) entries held, at FM's best step (the one that read the needle) / after its last step. "
             f"The question pooled {first}: FM, FM with the answer's entries pinned in every cut, one cut after "
             "the whole document, and one cut keeping exactly FM's final entries (with the KV of a full prefill)"
             + (f"; then FM with the question pooled {', '.join(others)}." if others else "."), "",
             f"| depth | {first}: FM retention | FM right | answer pinned | one cut | one cut, FM's set |"
             + "".join(f" {o}: FM retention | FM right |" for o in others),
             "|---:|---|---|---|---|---|" + "---|---|" * len(others)]
    for row in rows:
        cells = [f"{row['depth'] * 100:.0f}%", kept(row["fm"]["trace"]), mark(row["fm"]["right"]),
                 mark(row["fm_pinned"]["right"]), mark(row["once"]["right"]),
                 mark(row["once_fm_set"]["right"]) + ("" if row["once_fm_set"]["set_equal"] else " (set differs)")]
        for other in others:
            cells += [kept(row["pools"][other]["trace"]), mark(row["pools"][other]["right"])]
        lines.append("| " + " | ".join(cells) + " |")
    count = lambda key: sum(r[key]["right"] for r in rows)  # noqa: E731
    same = sum(r["once_fm_set"]["right"] == r["fm"]["right"] for r in rows)
    n = len(rows)
    lines += ["", f"Answered, question pooled {first}: FM {count('fm')}/{n}, FM with the answer pinned "
              f"{count('fm_pinned')}/{n}, one cut {count('once')}/{n}, one cut keeping FM's set "
              f"{count('once_fm_set')}/{n} (the same verdict as FM on {same}/{n})"
              + "".join(f"; FM pooled {o}: {sum(r['pools'][o]['right'] for r in rows)}/{n}" for o in others) + "."]
    return "\n".join(lines)


def measure_all(args) -> dict:
    """measure() at every depth of ``args``, with what the table names beside the rows."""
    import torch

    from memstep.engine import model_shape
    from memstep.evaluation.niah import make_niah_cases, percents
    from memstep.models import load_model
    from memstep.question_pool import parse_question_pool

    pools = [p.strip() for p in args.question_pools.split(",") if p.strip()]
    for pool in pools:
        parse_question_pool(pool)  # a bad one fails before the model loads
    torch.set_num_threads(args.threads)
    lm = load_model("embedded", device="cpu", dtype="float32")
    if model_shape(lm.model).kinds.hybrid:
        raise SystemExit("needle_trace pins cuts by layer order: a model with sliding layers is not supported")
    engine_layers[0] = lm.model.config.num_hidden_layers
    rows = []
    for case in make_niah_cases(lm.tokenizer, [args.length], percents(args.depths)):
        rows.append(measure(lm, case, args.chunk, args.memory, args.span, pools))
        print(json.dumps({k: v if k == "depth" else {p: o["right"] for p, o in v.items()} if k == "pools"
                          else v["right"] for k, v in rows[-1].items()}), flush=True)
    return {"length": args.length, "memory": args.memory, "chunk": args.chunk, "span": args.span,
            "question_pools": pools, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--depths", default="10,20,30,40,50,60,70,80,90", help="needle depths, percent")
    p.add_argument("--memory", type=int, default=256)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--span", default=None, help="a span setting (memstep run --span), default the token top-k")
    p.add_argument("--question-pools", default=f"max:15,{QUESTION_POOL}",
                   help="the question's pools: the first diagnosed (four runs), FM alone at the others")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=ROOT / "results" / "niah" / "needle_trace.json")
    p.add_argument("--block", default=None, help="write the table into this block of docs/spans-and-niah.md")
    p.add_argument("--render", action="store_true", help="only render --output's saved measurements")
    args = p.parse_args(argv)
    from docs_block import save_or_render

    save_or_render(args, measure_all, table, "needle_trace.py", argv, doc=ROOT / "docs" / "spans-and-niah.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
