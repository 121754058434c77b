"""CPU seconds of a question-aware FM prefill: memstep's default against the tuned recipe it replaced
(--question-pool tuned), on the same dev document (2,048 tokens of the bundled Pride and Prejudice, a
passkey question), at M = 128, 256 and 512, c = 512, one torch thread. CPU time of this process, not wall
time: the machine may run other work. Each setting runs ``--repeats`` times interleaved; the median counts.

    .venv/bin/python benchmarks/question_cpu.py                     # print the table, write JSON
    .venv/bin/python benchmarks/question_cpu.py --docs              # and docs/question-aware.md's block
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.docs_block import write_block  # noqa: E402

DOC = ROOT / "docs" / "question-aware.md"
OUTPUT = ROOT / "results" / "question-cpu.json"
QUESTION = "What is the magic number for the vault?"
POOLS = {"the default": None, "the tuned recipe": "tuned"}


def measure(repeats: int, budgets: tuple[int, ...]) -> dict:
    import torch

    from memstep.models import load_model
    from memstep.runner import DocumentRun

    torch.set_num_threads(1)
    lm = load_model(None, "cpu", "float32")
    text = (ROOT / "assets" / "pride_and_prejudice_ch1-12.txt").read_text(encoding="utf-8")
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:2048]
    seconds: dict = {name: {m: [] for m in budgets} for name in POOLS}
    for _ in range(repeats):
        for budget in budgets:
            for name, pool in POOLS.items():
                run = DocumentRun(lm, ids, schedule="fm", chunk=512, memory=budget, question=QUESTION,
                                  question_aware=True, question_pool=pool, rope="auto", max_new_tokens=1)
                start = time.process_time()
                for _step in run:
                    pass
                seconds[name][budget].append(time.process_time() - start)
    return {"model": lm.name, "tokens": len(ids), "chunk": 512, "repeats": repeats, "threads": 1,
            "cpu_seconds": {name: {str(m): values for m, values in by.items()} for name, by in seconds.items()}}


def table(found: dict) -> str:
    lines = ["| M | the default, CPU s (median) | the tuned recipe, CPU s (median) | default / tuned |",
             "|---:|---:|---:|---:|"]
    mine, theirs = found["cpu_seconds"]["the default"], found["cpu_seconds"]["the tuned recipe"]
    for budget in mine:
        a, b = statistics.median(mine[budget]), statistics.median(theirs[budget])
        lines.append(f"| {budget} | {a:.2f} | {b:.2f} | {a / b:.2f} |")
    return "\n".join(lines) + (f"\n\n{found['tokens']:,} tokens, c = {found['chunk']}, {found['threads']} torch thread, "
                               f"{found['repeats']} interleaved runs each; the prefill only (no answer).")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--docs", action="store_true")
    args = parser.parse_args(argv)
    found = measure(args.repeats, (128, 256, 512))
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(json.dumps(found, indent=1))
    text = table(found)
    print(text)
    if args.docs:
        write_block("question-cpu", text, "python benchmarks/question_cpu.py --docs", doc=DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
