"""What loses the password words at a tight budget on the Austen texts: the RoPE positions, the
chunked KV, or the kept set. Writes JSON (results/spans-128/word_trace.json) and a table.

The cases are ``memstep eval``'s own (both bundled texts, the word needle "The password of the
{thing} is {word}.", the depths and seeds given), counted where memstep's full cache answers. Each
runs question-aware FM at the engine's default pool, M and chunk as given, three ways, each with the
compact positions the evaluation runs by default and with the document's own positions:
- FM as the evaluation runs it;
- FM with the needle sentence pinned in every cut (an oracle: every layer and KV head keeps it whole,
  in slots taken from the rest of the memory);
- one cut after the whole document (``once``: the exact KV, memstep's ranking).
Reading the table: where pinning the sentence answers far more than FM, the kept set loses the words;
where a row answers more with document positions than with compact ones, the positions do.

    python benchmarks/word_trace.py --block word-trace
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from docs_block import save_or_render  # noqa: E402
from needle_trace import engine_layers, pinned  # noqa: E402

RUNS = ("fm", "fm, sentence pinned", "once")  # how each case runs, with each kind of positions
ROPES = ("compact", "document")


def run_case(lm, case, settings: dict, how: str, rope: str, memory: int, chunk: int) -> dict:
    """One run of ``case``: ``how`` one of RUNS or "full"; the answer, whether it is right, and the share
    of (layer, KV head, token) entries held of the answer and of the needle sentence after the last step."""
    from memstep.evaluation.needles import answer_matches
    from memstep.evaluation.worker import document_run

    config = {"schedule": "full"} if how == "full" else {
        "schedule": "once" if how == "once" else "fm", "budget": memory, "rope": rope, "question_aware": True,
        "scorer": "chunk-attention", "chunk": chunk}
    run = document_run(lm, config, settings, case.to_dict(), case.question, case.continuation_ids)
    offset = len(run.head)
    answer = range(offset + case.passkey_tokens[0], offset + case.passkey_tokens[1])
    sentence = range(offset + case.needle_tokens[0], offset + case.needle_tokens[1])
    if how == "fm, sentence pinned":
        with pinned(lambda layer, positions: (positions >= sentence.start) & (positions < sentence.stop)):
            result = run.run()
    else:
        result = run.run()
    kept = result.steps[-1].kept_positions

    def held(span: range) -> float:
        return round(float(np.isin(kept, np.asarray(span)).sum(axis=2).mean() / len(span)), 3)

    return {"right": answer_matches(result.answer, case.passkey), "answer": result.answer,
            "answer_kept": held(answer), "sentence_kept": held(sentence)}


def measure(args) -> dict:
    import torch

    from memstep.engine import model_shape
    from memstep.evaluation.runner import EvalSettings
    from memstep.evaluation.suite import make_cases
    from memstep.models import load_model
    from memstep.question_pool import QUESTION_POOL

    torch.set_num_threads(args.threads)
    lm = load_model("embedded", device="cpu", dtype="float32")
    if model_shape(lm.model).kinds.hybrid:
        raise SystemExit("word_trace pins cuts by layer order: a model with sliding layers is not supported")
    engine_layers[0] = lm.model.config.num_hidden_layers
    defaults = EvalSettings()
    settings = {"sinks": defaults.sinks, "window": defaults.window, "max_new_tokens": defaults.max_new_tokens}
    depths = [float(d) for d in args.depths.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for case in make_cases(lm.tokenizer, [args.length], depths, seeds, kinds=("word",)):
        row = {"haystack": case.haystack, "depth": case.depth, "seed": case.seed, "word": case.passkey,
               "full": run_case(lm, case, settings, "full", "compact", args.memory, args.chunk)}
        if row["full"]["right"]:  # only the cases the full cache answers count
            row["runs"] = {f"{rope}: {how}": run_case(lm, case, settings, how, rope, args.memory, args.chunk)
                           for rope in ROPES for how in RUNS}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("full", "runs")}
                         | {k: v["right"] for k, v in row.get("runs", {}).items()}), flush=True)
    return {"length": args.length, "memory": args.memory, "chunk": args.chunk, "question_pool": QUESTION_POOL,
            "rows": rows}


def table(saved: dict) -> str:
    from memstep.evaluation.stats import wilson_interval

    counted = [r for r in saved["rows"] if r["full"]["right"]]
    n = len(counted)
    lines = [f"{saved['length']} tokens, M = {saved['memory']}, chunk {saved['chunk']}, question-aware at "
             f"{saved['question_pool']}; {n} of {len(saved['rows'])} word cases counted (the full cache answers "
             "them). Kept: the share of (layer, KV head, token) entries held after the last step, of the answer "
             "word and of the needle sentence.", "",
             "| positions | run | answered (95% CI) | answer kept | sentence kept |", "|---|---|---:|---:|---:|"]
    for rope in ROPES:
        for how in RUNS:
            found = [r["runs"][f"{rope}: {how}"] for r in counted]
            right = sum(f["right"] for f in found)
            low, high = wilson_interval(right, n) if n else (0.0, 0.0)
            mean = lambda key: sum(f[key] for f in found) / n if n else 0.0  # noqa: E731
            lines.append(f"| {rope} | {how} | {right}/{n} ({low:.0%}-{high:.0%}) | {mean('answer_kept'):.2f} | "
                         f"{mean('sentence_kept'):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--depths", default="0.167,0.5,0.833", help="needle depths, 0..1 (memstep eval's)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--memory", type=int, default=128)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=ROOT / "results" / "spans-128" / "word_trace.json")
    p.add_argument("--block", default=None, help="write the table into this block of docs/spans-and-niah.md")
    p.add_argument("--render", action="store_true", help="only render --output's saved measurements")
    args = p.parse_args(argv)
    save_or_render(args, measure, table, "word_trace.py", argv, doc=ROOT / "docs" / "spans-and-niah.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
