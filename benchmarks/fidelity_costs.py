"""What each difference from the reference code costs: kept-set agreement, NLL gap, answers.

On passkey documents of `memstep eval`'s suite (the two bundled Austen texts x needle depths
x seeds, each case its own window of the text) and the embedded model in float32, the same
schedule and scorer (``conv``, the reference's) run as:

- ``reference``: ``--preset reference``, the reference code exactly;
- ``reference-no-<switch>``: the reference with that one switch at its other value (memstep's,
  or for the two switches whose default is the reference's, memstep's former way);
- ``memstep``: memstep's defaults (one-pass attention, model grouping, the chunk's rows, the
  question after the memory), still with the conv scorer; ``memstep-no-sink-scoring``: the
  same with the sinks pooled with the other keys (memstep's former way), to choose its default.

Per case and configuration:

- kept sets: the share of (step, layer, KV head) sets identical to the reference's, on a
  prefill of the document alone; and the overlap (Jaccard, mean over layers and KV heads) of the
  final memory's document positions with the reference's, on the prefill the answer comes from
  (with the question inside the prompt where the configuration puts it there);
- NLL gap: the held-out continuation's mean NLL (nats/token) minus the reference's on the same
  case, after a prefill of the document alone (where the question goes does not enter it);
- answers: the passkey found (k/n, Wilson 95%), and the same answer text as the reference.

Runs whose computation is the reference's (a linear growth, where the two roundings agree;
dynamic NTK where no step passes the model's trained positions) are not repeated: the script
says so and reuses the reference's. Last, a seeded scan of random (tokens, c, M) settings counts
how often the two roundings give different square / sqrt budgets.

    flock /tmp/memstep-heavy.lock .venv/bin/python benchmarks/fidelity_costs.py --docs docs/reference-fidelity.md
    .venv/bin/python benchmarks/fidelity_costs.py --lengths 1024 --depths 0.5 --seeds 0   # a quick check
    .venv/bin/python benchmarks/fidelity_costs.py --render benchmarks/results/fidelity_costs.json   # tables only

Writes benchmarks/results/fidelity_costs.json and prints the Markdown tables (``--docs``
refreshes them between the file's ``fidelity-costs`` markers).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from memstep.evaluation.stats import mean_interval, wilson_interval
from memstep.evaluation.suite import make_cases
from memstep.models import load_model
from memstep.passkey import answer_contains_passkey
from memstep.presets import REFERENCE, SWITCHES, Fidelity, fidelity_variant, preset_settings
from memstep.runner import DocumentRun
from memstep.schedules import make_schedule

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MARKERS = ("<!-- fidelity-costs:start -->", "<!-- fidelity-costs:end -->")
CONFIGS = (["reference"] + [f"reference-no-{name.replace('_', '-')}" for name in SWITCHES]
           + ["memstep", "memstep-no-sink-scoring"])


def kept_sets(result) -> list[list[np.ndarray]]:
    return [[layer[:, :n] for layer, n in zip(r.kept_positions, r.layer_entries)] for r in result.steps]


def identical_share(ours, theirs) -> float:
    """Share of (step, layer, KV head) sets identical to the reference's (0 where steps differ)."""
    total = sum(len(layer) for step in theirs for layer in step)
    if len(ours) != len(theirs):
        return 0.0
    same = sum(len(a) == len(b) and np.array_equal(a, b) for step_a, step_b in zip(ours, theirs)
               for layer_a, layer_b in zip(step_a, step_b) for a, b in zip(layer_a, layer_b))
    return same / total


def final_overlap(ours, theirs, document_end: int) -> float:
    """Mean Jaccard of the final memory's document positions, per layer and KV head."""
    values = []
    for layer_a, layer_b in zip(ours[-1], theirs[-1]):
        for a, b in zip(layer_a, layer_b):
            a, b = set(a[a < document_end].tolist()), set(b[b < document_end].tolist())
            values.append(len(a & b) / max(len(a | b), 1))
    return float(np.mean(values))


class Runner:
    """The runs of one case, each computed once (a configuration whose run is the reference's
    reuses it)."""

    def __init__(self, lm, case, args):
        self.lm, self.case, self.args = lm, case, args
        self.cache: dict = {}
        self.seconds = 0.0

    def settings(self, name: str) -> tuple[Fidelity, str]:
        fidelity = fidelity_variant(name)
        attention = "sdpa" if name.startswith("memstep") else preset_settings("reference")["attention"]
        return fidelity, attention

    def _key(self, fidelity: Fidelity, attention: str, question: bool, tokens: int):
        """What decides a run: the switches that change its computation at these settings."""
        schedule = make_schedule(self.args.schedule, tokens, self.args.chunk, self.args.memory, self.args.growth,
                                 layers=self.lm.model.config.num_hidden_layers, rounding=fidelity.growth_rounding)
        ways = dict(asdict(fidelity), growth_rounding=None)  # the schedule's sizes stand for it
        limit = self.lm.model.config.max_position_embeddings
        if max(b + c for (b, _), c in zip(schedule.cache_lengths(4), schedule.chunk_sizes)) <= limit:
            ways["ntk"] = None  # no step passes the trained positions: dynamic NTK never acts
        return (tuple(sorted(ways.items())), attention, schedule.chunk_sizes, schedule.memory_sizes, question)

    def run(self, name: str, question: bool):
        """A prefill of the document alone (``question`` False: with the continuation held out, the
        question asked after the memory if the configuration asks it there) or with the question
        inside the prompt."""
        fidelity, attention = self.settings(name)
        case, args = self.case, self.args
        held_out = [] if question else case.continuation_ids
        extra = len(case.question_ids) if question else 0
        key = self._key(fidelity, attention, question, len(case.head_ids) + len(case.document_ids) + extra)
        if key not in self.cache:
            began = time.process_time()
            run = DocumentRun(self.lm, case.document_ids + held_out, schedule=args.schedule, chunk=args.chunk,
                              memory=args.memory, growth=args.growth, scorer="conv", sinks=4, kernel=5,
                              rope="compact", attention=attention,
                              question=case.question if question or fidelity.question_place == "after" else None,
                              max_new_tokens=args.max_new_tokens, continuation_tokens=len(held_out),
                              fidelity=fidelity if question else fidelity.with_memstep("question_place"))
            result = run.run()
            self.seconds += time.process_time() - began
            self.cache[key] = result
        return self.cache[key]


def run_case(lm, case, args) -> dict:
    runner = Runner(lm, case, args)
    document_end = len(case.head_ids) + len(case.document_ids)
    reference_doc = runner.run("reference", question=False)
    reference_answered = runner.run("reference", question=True)
    rows = {}
    for name in CONFIGS:
        fidelity, _ = runner.settings(name)
        doc = runner.run(name, question=False)
        answered = runner.run(name, question=True) if fidelity.question_place == "prompt" else doc
        rows[name] = {
            "identical_sets": identical_share(kept_sets(doc), kept_sets(reference_doc)),
            "final_overlap": final_overlap(kept_sets(answered), kept_sets(reference_answered), document_end),
            "nll": doc.continuation_nll,
            "nll_gap": doc.continuation_nll - reference_doc.continuation_nll,
            "answer": answered.answer,
            "correct": answer_contains_passkey(answered.answer or "", case.passkey),
            "same_answer": (answered.answer or "") == (reference_answered.answer or ""),
            "reused_reference": doc is reference_doc and answered is reference_answered,
        }
    return {"case": case.cell, "passkey": case.passkey, "cpu_seconds": runner.seconds, "configs": rows}


def summarize(cases: list[dict]) -> dict:
    out = {}
    for name in CONFIGS:
        rows = [c["configs"][name] for c in cases]
        correct = sum(r["correct"] for r in rows)
        low, high = wilson_interval(correct, len(rows))
        out[name] = {
            "identical_sets": mean_interval([r["identical_sets"] for r in rows]),
            "final_overlap": mean_interval([r["final_overlap"] for r in rows]),
            "nll": mean_interval([r["nll"] for r in rows]),
            "nll_gap": mean_interval([r["nll_gap"] for r in rows]),
            "correct": correct, "cases": len(rows), "correct_interval": [low, high],
            "same_answer": sum(r["same_answer"] for r in rows),
            "reused_reference": all(r["reused_reference"] for r in rows),
        }
    return out


def rounding_scan(settings: int, seed: int = 2024) -> dict:
    """How often the two orders of the growth formulas differ (any step's budget), per growth."""
    rng = random.Random(seed)
    out = {}
    for growth in ("square", "sqrt"):
        differ = 0
        for _ in range(settings):
            chunk = rng.randint(1, 4096)
            tokens = rng.randint(chunk, chunk * rng.randint(2, 64))
            memory = rng.randint(0, 8192)
            a = make_schedule("im", tokens, chunk, memory, growth).memory_sizes
            b = make_schedule("im", tokens, chunk, memory, growth, rounding="multiply-first").memory_sizes
            assert max(abs(x - y) for x, y in zip(a, b)) <= 1
            differ += a != b
        low, high = wilson_interval(differ, settings)
        out[growth] = {"settings": settings, "differ": differ, "interval": [low, high]}
    return out


def _interval(stat: dict | None, digits: int = 3, percent: bool = False) -> str:
    if stat is None:
        return "-"
    scale, unit = (100, "%") if percent else (1, "")
    text = f"{stat['mean'] * scale:.{0 if percent else digits}f}{unit}"
    if stat["low"] is None:
        return text
    return text + f" ({stat['low'] * scale:.{0 if percent else digits}f}-{stat['high'] * scale:.{0 if percent else digits}f}{unit})"


def markdown(report: dict) -> str:
    s = report["settings"]
    summary = report["summary"]
    lines = [
        f"Settings: {s['model']} ({s['dtype']}, CPU), {s['cases']} passkey cases of {', '.join(map(str, s['lengths']))} "
        f"tokens (texts {', '.join(s['haystacks'])}; depths {', '.join(map(str, s['depths']))}; seeds "
        f"{', '.join(map(str, s['seeds']))}), schedule {s['schedule']} ({s['growth']} growth), c = {s['chunk']}, "
        f"M = {s['memory']}, scorer conv (kernel 5), 4 sinks, compact positions, {s['continuation_tokens']} held-out "
        f"tokens, answers of up to {s['max_new_tokens']} tokens. Means with 95% t intervals over the cases; "
        "passkeys with Wilson 95% intervals.",
        "",
        "| configuration | sets identical to the reference | final memory overlap | NLL gap to the reference "
        "| passkey found | same answer as the reference |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in CONFIGS:
        row = summary[name]
        low, high = row["correct_interval"]
        found = f"{row['correct']}/{row['cases']} ({low * 100:.0f}-{high * 100:.0f}%)"
        note = " (its run is the reference's here)" if row["reused_reference"] and name != "reference" else ""
        gap = row["nll_gap"]
        gap_text = "0 (the same run)" if gap and gap["mean"] == 0 and gap["half"] in (0, None) else (
            f"{gap['mean']:+.3f} ± {gap['half']:.3f}" if gap and gap["half"] is not None else "-")
        lines.append(f"| {name}{note} | {_interval(row['identical_sets'], percent=True)} | "
                     f"{_interval(row['final_overlap'], percent=True)} | {gap_text} | {found} | "
                     f"{row['same_answer']}/{row['cases']} |")
    nll = summary["reference"]["nll"]
    lines += ["", f"The reference's own continuation NLL: {_interval(nll)} nats/token."]
    scan = report["rounding"]
    lines += ["", "| growth | settings whose budgets differ between the two orders (one token at some step) |",
              "|---|---:|"]
    for growth, row in scan.items():
        low, high = row["interval"]
        share = row["differ"] / row["settings"] * 100
        lines.append(f"| {growth} | {row['differ']:,} / {row['settings']:,} ({share:.2f}%; "
                     f"95% CI {low * 100:.2f}-{high * 100:.2f}%) |")
    lines += ["", f"Produced by `benchmarks/fidelity_costs.py` ({report['seconds']:.0f} s of CPU time for the runs)."]
    return "\n".join(lines)


def refresh(path: Path, block: str) -> None:
    text = path.read_text()
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    path.write_text(text[:start] + "\n" + block + "\n" + text[end:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048])
    parser.add_argument("--depths", type=float, nargs="+", default=[0.167, 0.5, 0.833])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--schedule", default="imdc")
    parser.add_argument("--growth", default="linear")
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--memory", type=int, default=256)
    parser.add_argument("--continuation-tokens", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--scan", type=int, default=20000, help="random settings per growth in the rounding scan")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU time, not load)")
    parser.add_argument("--output", default=str(RESULTS / "fidelity_costs.json"))
    parser.add_argument("--docs", default=None, help="refresh the tables in this Markdown file")
    parser.add_argument("--render", default=None, help="print (and --docs: refresh) the tables of this JSON; no runs")
    args = parser.parse_args(argv)
    if args.render:
        block = markdown(json.loads(Path(args.render).read_text()))
        if args.docs:
            refresh(Path(args.docs), block)
        print(block)
        return 0
    torch.set_num_threads(args.threads)
    lm = load_model("embedded", device="cpu", dtype="float32")
    cases = make_cases(lm.tokenizer, args.lengths, args.depths, args.seeds, None, args.continuation_tokens)
    began = time.process_time()
    rows = []
    for i, case in enumerate(cases):
        rows.append(run_case(lm, case, args))
        print(f"case {i + 1}/{len(cases)} {case.cell}: {rows[-1]['cpu_seconds']:.0f} s", file=sys.stderr)
    report = {
        "settings": {"model": lm.name, "dtype": lm.dtype, "lengths": args.lengths, "depths": args.depths,
                     "seeds": args.seeds, "haystacks": sorted({c.haystack for c in cases}), "cases": len(cases),
                     "schedule": args.schedule, "growth": args.growth, "chunk": args.chunk, "memory": args.memory,
                     "continuation_tokens": args.continuation_tokens, "max_new_tokens": args.max_new_tokens,
                     "reference": asdict(REFERENCE), "configs": CONFIGS},
        "summary": summarize(rows), "rounding": rounding_scan(args.scan), "cases": rows,
        "seconds": time.process_time() - began,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    block = markdown(report)
    if args.docs:
        refresh(Path(args.docs), block)
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
