"""CPU seconds of a question-aware FM prefill with span-preserving selection and with each
question pool, as a ratio to the token top-k at the first pool, measured in one process (one
torch thread, best of ``--repeat``) on one 2k case of the evaluation. Writes JSON
(results/spans/span_cost.json) and prints a table.

    OMP_NUM_THREADS=1 python benchmarks/span_cost.py --pools max:15,follow:15,follow:15+carry --spans fixed20-mean-layer
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def cpu_seconds(lm, case, span, budget: int, pool: str) -> float:
    from memstep.runner import DocumentRun

    began = time.process_time()  # the span table (sentence breaks from the tokenizer) counts too
    run = DocumentRun(lm, case.document_ids, schedule="fm", chunk=512, memory=budget, question=case.question,
                      max_new_tokens=1, question_aware=True, span=span, question_pool=pool)
    for _ in run:
        pass
    return time.process_time() - began


def main(argv=None) -> int:
    import torch

    from memstep.evaluation.suite import make_cases
    from memstep.models import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spans", default="fixed20-mean-layer,sentence-max-head")
    p.add_argument("--pools", default="max:15", help="question pools, each with the token top-k (spans: the first)")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--output", type=Path, default=ROOT / "results" / "spans" / "span_cost.json")
    p.add_argument("--block", default=None, help="write the table into this block of docs/spans-and-niah.md")
    p.add_argument("--render", action="store_true", help="only render --output's saved measurements")
    args = p.parse_args(argv)
    if not args.render:
        torch.set_num_threads(1)
        lm = load_model("embedded", device="cpu", dtype="float32")
        case = make_cases(lm.tokenizer, [2048], [0.5], [0], kinds=("word",))[0]
        pools = args.pools.split(",")
        settings = [(pool, None) for pool in pools] + [(pools[0], span) for span in args.spans.split(",") if span]
        best = {setting: float("inf") for setting in settings}
        for _ in range(args.repeat):  # interleaved: the machine's load moves every setting alike
            for pool, span in settings:
                best[pool, span] = min(best[pool, span], cpu_seconds(lm, case, span, args.budget, pool))
        base = best[settings[0]]
        rows = [{"pool": pool, "span": str(span), "cpu_seconds": round(v, 3), "ratio": round(v / base, 3)}
                for (pool, span), v in best.items()]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"budget": args.budget, "length": 2048, "repeat": args.repeat,
                                           "case": case.cell, "rows": rows}, indent=1))
    saved = json.loads(args.output.read_text())
    rows, args.budget, args.repeat = saved["rows"], saved["budget"], saved["repeat"]
    lines = [f"Question-aware FM, M = {args.budget}, one 2,048-token case, one torch thread; CPU seconds of the "
             f"prefill (the span table included), best of {args.repeat}, settings interleaved in one process.", "",
             "| question pool | span | CPU s | ratio to the first row |", "|---|---|---:|---:|"]
    lines += [f"| {r.get('pool', 'max:15')} | {'none (token top-k)' if r['span'] == 'None' else r['span']} | "
              f"{r['cpu_seconds']:.2f} | {r['ratio']:.3f} |" for r in rows]
    print("\n".join(lines))
    if args.block:
        from docs_block import write_block

        write_block(args.block, "\n".join(lines), "OMP_NUM_THREADS=1 python benchmarks/span_cost.py " +
                    " ".join(argv if argv is not None else sys.argv[1:]), doc=ROOT / "docs" / "spans-and-niah.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
