"""CPU seconds of a question-aware FM prefill with span-preserving selection, with each
question pool and with each kind of RoPE positions, as a ratio to the token top-k at the first pool, measured in one process (one
torch thread, best of ``--repeat``) on one 2k case of the evaluation. Writes JSON
(results/spans/span_cost.json) and prints a table.

    OMP_NUM_THREADS=1 python benchmarks/span_cost.py --pools max:15,follow:15,follow:15+carry --spans fixed20-mean-layer
    OMP_NUM_THREADS=1 python benchmarks/span_cost.py --budget 128 --spans '' --ropes compact,shared

On a GPU (``--device cuda``) the clock is wall time (synchronized), and each row adds the peak
bytes allocated above the loaded model (torch.cuda.max_memory_allocated, reset per run).
``--model`` takes a folder, e.g. one of benchmarks/random_model.py (same shapes, random weights:
time and bytes follow the shapes).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def measure(lm, case, span, budget: int, pool: str, rope: str = "compact") -> tuple[float, int | None]:
    """Seconds of one prefill (CPU time on CPU, synchronized wall time on CUDA) and, on CUDA, the
    peak bytes allocated above what was allocated before it (the model)."""
    import torch

    from memstep.runner import DocumentRun

    cuda = torch.device(lm.device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    began = time.perf_counter() if cuda else time.process_time()  # the span table counts too
    run = DocumentRun(lm, case.document_ids, schedule="fm", chunk=512, memory=budget, question=case.question,
                      max_new_tokens=1, question_aware=True, span=span, question_pool=pool, rope=rope)
    for _ in run:
        pass
    if not cuda:
        return time.process_time() - began, None
    torch.cuda.synchronize()
    return time.perf_counter() - began, int(torch.cuda.max_memory_allocated() - before)


def main(argv=None) -> int:
    import torch

    from memstep.evaluation.suite import make_cases
    from memstep.models import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spans", default="fixed20-mean-layer,sentence-max-head")
    p.add_argument("--pools", default="max:15", help="question pools, each with the token top-k (spans: the first)")
    p.add_argument("--ropes", default="compact", help="RoPE positions, each at the first pool (the first: every row)")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--output", type=Path, default=ROOT / "results" / "spans" / "span_cost.json")
    p.add_argument("--block", default=None, help="write the table into this block of docs/spans-and-niah.md")
    p.add_argument("--render", action="store_true", help="only render --output's saved measurements")
    p.add_argument("--model", default="embedded")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args(argv)
    if not args.render:
        torch.set_num_threads(1)
        lm = load_model(args.model, device=args.device, dtype=args.dtype)
        case = make_cases(lm.tokenizer, [2048], [0.5], [0], kinds=("word",))[0]
        pools = args.pools.split(",")
        ropes = args.ropes.split(",")
        settings = [(pool, None, ropes[0]) for pool in pools] + \
            [(pools[0], span, ropes[0]) for span in args.spans.split(",") if span] + \
            [(pools[0], None, rope) for rope in ropes[1:]]
        best = {setting: float("inf") for setting in settings}
        peak = {setting: None for setting in settings}
        for _ in range(args.repeat):  # interleaved: the machine's load moves every setting alike
            for setting in settings:
                pool, span, rope = setting
                seconds, above = measure(lm, case, span, args.budget, pool, rope)
                best[setting] = min(best[setting], seconds)
                peak[setting] = above if peak[setting] is None else max(peak[setting], above)
        base = best[settings[0]]
        clock = "cpu_seconds" if torch.device(lm.device).type == "cpu" else "seconds"
        rows = [{"pool": pool, "span": str(span), "rope": rope, clock: round(v, 3), "ratio": round(v / base, 3),
                 **({} if peak[pool, span, rope] is None else {"peak_above_model_bytes": peak[pool, span, rope]})}
                for (pool, span, rope), v in best.items()]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"budget": args.budget, "length": 2048, "repeat": args.repeat,
                                           "model": lm.name, "device": lm.device, "dtype": lm.dtype,
                                           "case": case.cell, "rows": rows}, indent=1))
    saved = json.loads(args.output.read_text())
    print("\n".join(lines := table(saved)))
    if args.block:
        from docs_block import write_block

        write_block(args.block, "\n".join(lines), "OMP_NUM_THREADS=1 python benchmarks/span_cost.py " +
                    shlex.join(argv if argv is not None else sys.argv[1:]), doc=ROOT / "docs" / "spans-and-niah.md")
    return 0


def table(saved: dict) -> list[str]:
    """The saved run as Markdown: CPU seconds on CPU; wall seconds and peak bytes above the model on a GPU."""
    from memstep.memory import format_bytes

    rows = saved["rows"]
    gpu = "seconds" in rows[0]
    ropes = any(r.get("rope", "compact") != "compact" for r in rows)  # older runs: compact only, no column
    where = (f"{saved.get('model', 'embedded')} on {saved.get('device')} ({saved.get('dtype')}); wall seconds "
             "(synchronized) and peak bytes allocated above the model" if gpu else
             "one torch thread; CPU seconds")
    lines = [f"Question-aware FM, M = {saved['budget']}, one 2,048-token case, {where} of the prefill "
             f"(the span table included), best of {saved['repeat']}, settings interleaved in one process.", "",
             "| question pool | span | " + ("RoPE positions | " if ropes else "") +
             ("s | peak above the model" if gpu else "CPU s") + " | ratio to the first row |",
             "|---|---|" + ("---|" if ropes else "") + "---:|" + ("---:|" if gpu else "") + "---:|"]
    for r in rows:
        cells = (f"{r['seconds']:.3f} | {format_bytes(r['peak_above_model_bytes'])}" if gpu else
                 f"{r['cpu_seconds']:.2f}")
        lines.append(f"| {r.get('pool', 'max:15')} | {'none (token top-k)' if r['span'] == 'None' else r['span']} | "
                     + (f"{r.get('rope', 'compact')} | " if ropes else "") + f"{cells} | {r['ratio']:.3f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
