"""Quality beyond the trained window: what compact positions buy at 16k and 32k tokens.

SmolLM2 was trained on 8,192 positions. A compressed prefill (IMDC, c = M = 1024) of a
16k or 32k document can give its keys

- compact positions (memstep's default and the reference code's): contiguous, never past
  sinks + M + c, so always inside the trained window;
- document positions: each token's true position, up to 32k, far past the window;
- document positions with dynamic NTK scaling: transformers' own RoPE scaling
  (``rope_type: dynamic``, factor 2: at 16k and 32k the same base as the reference code's rule),
  set in the model's config when this script loads it.

Two measurements per mode, on real prose (Pride and Prejudice, different stretches per case):

- needle retrieval: a needle ("The magic number for the vault is 73915.") in each document, at
  a depth that moves with the case (25%, 75%, 50%, 10%, 90%); agnostic (the question asked after
  the prefill) and question-aware (the question voting in every step). One needle per document:
  with several of the same phrasing the 135M model mixes them up even with the full cache
  (tried: it answered the lighthouse's question with the vault's number). Accuracy with Wilson
  95% intervals, per length and pooled over the lengths.
- continuation: the document's last T tokens held out and scored after the compressed memory:
  NLL per token, and where the full cache fits (--full-max) the KL divergence from the full
  cache's next-token distributions (document positions, the model's own way), with 95%
  intervals from a bootstrap over blocks of 32 tokens (pooled over the documents).

    OMP_NUM_THREADS=2 flock /tmp/memstep-heavy.lock .venv/bin/python benchmarks/bench_long_quality.py --docs

Rows already in the JSON (same settings) are kept: an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NOVEL = ROOT / "assets" / "pride_and_prejudice.txt"
MODES = ("compact", "document", "document-ntk")
NTK_FACTOR = 2.0
DEPTHS = (0.25, 0.75, 0.5, 0.1, 0.9)
BLOCK = 32  # tokens per bootstrap block (neighbouring tokens' losses are not independent)


def load(ntk: bool):
    """The embedded model; with ``ntk`` its config asks transformers for dynamic NTK RoPE."""
    from memstep.models import load_model

    lm = load_model(None, "cpu", "auto")
    if ntk:
        config = lm.model.config
        parameters = dict(config.rope_parameters or {})
        parameters.update(rope_type="dynamic", factor=NTK_FACTOR)
        config.rope_parameters = parameters
        decoder = lm.model.model
        decoder.rotary_emb = type(decoder.rotary_emb)(config=config)
    return lm


def make_document(novel: str, tokenizer, tokens: int, case: int, needles: int) -> dict:
    """``tokens`` tokens of the novel from a stretch chosen by ``case``, with ``needles`` needles at
    spread depths (each a different thing and passkey)."""
    from memstep.passkey import make_haystack, random_passkey

    from memstep.passkey import THINGS

    start = (case * 97_003) % max(1, len(novel) - 6 * tokens)
    text = novel[start:]
    text = text[text.find("\n\n") + 2:] if "\n\n" in text[:5000] else text
    # one needle: its depth moves with the case; several: spread evenly
    depths = [DEPTHS[case % len(DEPTHS)]] if needles == 1 else [(i + 0.5) / needles * 0.9 for i in range(needles)]
    placed = []
    for i, depth in enumerate(reversed(depths)):  # deepest first: later inserts shift it little
        thing = THINGS[(case * 3 + i) % len(THINGS)]
        passkey = random_passkey(f"{case}-{i}")
        doc = make_haystack(text, tokenizer, tokens, depth, passkey, thing=thing)
        text = doc.text
        placed.append({"thing": thing, "passkey": str(passkey), "depth": depth, "question": doc.question})
    for needle in placed:  # every needle survived the later cuts
        assert f"the {needle['thing']} is {needle['passkey']}." in text, needle
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][:tokens]
    return {"ids": ids, "needles": placed}


def continuation_logprobs(run, held_out: list[int]) -> torch.Tensor:
    """Log-probabilities (T, vocab) of each held-out token's position after the prefilled memory
    (teacher forcing); the memory is left as the prefill made it."""
    from memstep.generate import _extend, crop_memory, memory_mark

    engine = run.engine
    mark = memory_mark(engine)
    try:
        with torch.inference_mode():
            first = engine.model.get_output_embeddings()(engine.last_hidden).float()
            rest = _extend(engine, held_out[:-1])
        return torch.log_softmax(torch.cat([first, rest]), dim=-1)
    finally:
        crop_memory(engine, mark)


def one_run(lm, ids, mode: str, args, question: str | None = None, aware: bool = False):
    from memstep.runner import DocumentRun

    rope = "compact" if mode == "compact" else "document"
    schedule = "full" if mode.startswith("full") else "imdc"
    sized = {} if schedule == "full" else {"chunk": args.size, "memory": args.size}
    run = DocumentRun(lm, ids, schedule=schedule, rope=rope, question=question, question_aware=aware,
                      max_new_tokens=24, **sized)
    for _ in run:
        pass
    return run


def measure_case(lms, novel, tokenizer, tokens: int, case: int, args) -> list[dict]:
    from memstep.passkey import answer_contains_passkey

    doc = make_document(novel, tokenizer, tokens, case, args.needles)
    ids, held_out = doc["ids"][: -args.continuation], doc["ids"][-args.continuation:]
    rows, reference = [], None
    modes = list(MODES) + (["full"] if tokens <= args.full_max and case < args.full_cases else [])
    for mode in ["full"] * ("full" in modes) + list(MODES):  # the full cache first: the others' KL needs it
        lm = lms["ntk" if mode == "document-ntk" else "plain"]
        began = time.process_time()
        run = one_run(lm, ids, mode, args)
        logprobs = continuation_logprobs(run, held_out)
        target = torch.tensor(held_out)
        nll = (-logprobs.gather(1, target[:, None])[:, 0]).tolist()
        if mode == "full":
            reference = logprobs
        kl = None
        if reference is not None and mode != "full":
            kl = (reference.exp() * (reference - logprobs)).sum(-1).clamp_min(0).tolist()
        answers = [run.ask(n["question"]) for n in doc["needles"]]
        row = {"tokens": tokens, "case": case, "mode": mode, "aware": False, "nll": nll, "kl": kl,
               "needles": [{**n, "answer": a, "correct": answer_contains_passkey(a, n["passkey"])}
                           for n, a in zip(doc["needles"], answers)],
               "cpu_seconds": time.process_time() - began}
        rows.append(row)
        print(f"[{tokens} case {case}] {mode}: {sum(n['correct'] for n in row['needles'])}/{len(answers)} needles, "
              f"NLL {np.mean(nll):.3f}" + (f", KL {np.mean(kl):.4f}" if kl else "")
              + f", {row['cpu_seconds']:.0f} CPU s", file=sys.stderr)
        del run
        if mode == "full":
            continue
        for n in doc["needles"][: args.aware_needles]:  # question-aware: one prefill per question
            began = time.process_time()
            run = one_run(lm, ids, mode, args, question=n["question"], aware=True)
            a = run.result.answer or ""
            rows.append({"tokens": tokens, "case": case, "mode": mode, "aware": True,
                         "needles": [{**n, "answer": a, "correct": answer_contains_passkey(a, n["passkey"])}],
                         "cpu_seconds": time.process_time() - began})
            print(f"[{tokens} case {case}] {mode} question-aware {n['thing']}: {a!r}", file=sys.stderr)
    return rows


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def block_bootstrap(values: list[np.ndarray], draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean and 95% interval, resampling blocks of BLOCK neighbouring tokens (of every document)."""
    blocks = [v[i:i + BLOCK] for v in values for i in range(0, len(v), BLOCK)]
    if not blocks:
        return (math.nan, math.nan, math.nan)
    sums = np.array([b.sum() for b in blocks])
    sizes = np.array([len(b) for b in blocks])
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(blocks), size=(draws, len(blocks)))
    means = sums[pick].sum(1) / sizes[pick].sum(1)
    return float(sums.sum() / sizes.sum()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summarize(rows: list[dict]) -> list[dict]:
    """Per length, mode and question-awareness; then the needles pooled over every length (tokens 0)."""
    out = []
    keys = sorted({(r["tokens"], r["mode"], r["aware"]) for r in rows},
                  key=lambda k: (k[0], k[2], (["full"] + list(MODES)).index(k[1])))
    pooled = sorted({(0, r["mode"], r["aware"]) for r in rows if r["mode"] != "full"},
                    key=lambda k: (k[2], list(MODES).index(k[1])))
    for tokens, mode, aware in keys + (pooled if len({r["tokens"] for r in rows}) > 1 else []):
        mine = [r for r in rows if (tokens in (0, r["tokens"]), r["mode"], r["aware"]) == (True, mode, aware)]
        needles = [n for r in mine for n in r["needles"]]
        k = sum(n["correct"] for n in needles)
        row = {"tokens": tokens, "mode": mode, "aware": aware, "cases": len({(r["tokens"], r["case"]) for r in mine}),
               "needles": len(needles), "correct": k, "accuracy": k / len(needles) if needles else None,
               "accuracy_interval": wilson(k, len(needles))}
        if not aware and tokens:
            row["nll"] = block_bootstrap([np.array(r["nll"]) for r in mine])
            if all(r.get("kl") is not None for r in mine) and mode != "full":
                row["kl"] = block_bootstrap([np.array(r["kl"]) for r in mine])
            compact = {r["case"]: r for r in rows if (r["tokens"], r["mode"], r["aware"]) == (tokens, "compact", False)}
            if mode != "compact" and all(r["case"] in compact for r in mine):  # paired with compact, token by token
                row["nll_minus_compact"] = block_bootstrap([np.array(r["nll"]) - np.array(compact[r["case"]]["nll"])
                                                            for r in mine])
        out.append(row)
    return out


LABELS = {"compact": "IMDC, compact positions", "document": "IMDC, document positions",
          "document-ntk": "IMDC, document positions + dynamic NTK", "full": "full cache (document positions)"}


def _ci(t) -> str:
    return "-" if t is None else f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"SmolLM2-135M-Instruct ({report['trained_positions']:,} trained positions), IMDC c = M = {s['size']}, "
             f"chunk-attention scorer; {s['needles']} needle per document (depth 25/75/50/10/90% by document), "
             f"question-aware and agnostic; the full cache on the first {s['full_cases']} document(s) up to "
             f"{s['full_max']:,} tokens; the last {s['continuation']} tokens of each document held out. Intervals "
             "95%: Wilson for accuracy, a bootstrap over 32-token blocks for NLL and KL.", "",
             "| tokens | configuration | documents | needles (agnostic) | needles (question-aware) | "
             "continuation NLL | NLL − compact | KL from the full cache |",
             "|---:|---|---:|---|---|---|---|---|"]
    summary = report["summary"]
    for row in (r for r in summary if not r["aware"]):
        aware = next((r for r in summary if r["aware"] and (r["tokens"], r["mode"]) == (row["tokens"], row["mode"])),
                     None)
        acc = lambda r: "-" if r is None else (f"{r['correct']}/{r['needles']} = {r['accuracy']:.0%} "  # noqa: E731
                                               f"[{r['accuracy_interval'][0]:.0%}, {r['accuracy_interval'][1]:.0%}]")
        length = f"{row['tokens']:,}" if row["tokens"] else "all (pooled)"
        lines.append(f"| {length} | {LABELS[row['mode']]} | {row['cases']} | {acc(row)} | {acc(aware)} | "
                     f"{_ci(row.get('nll'))} | {_ci(row.get('nll_minus_compact'))} | {_ci(row.get('kl'))} |")
    lines += ["", f"{report['cpu_minutes']:.0f} CPU minutes in all."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16384,32768")
    parser.add_argument("--cases", type=int, default=3, help="documents per length")
    parser.add_argument("--needles", type=int, default=1, help="needles per document")
    parser.add_argument("--aware-needles", type=int, default=1, help="question-aware prefills per document and mode")
    parser.add_argument("--continuation", type=int, default=256, help="held-out tokens scored")
    parser.add_argument("--full-max", type=int, default=16384, help="longest document run with the full cache")
    parser.add_argument("--full-cases", type=int, default=1, help="documents per length run with the full cache")
    parser.add_argument("--size", type=int, default=1024, help="chunk = memory")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_long_quality.json")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--from-json", type=Path, default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.from_json:
        report = json.loads(args.from_json.read_text())
        print(markdown(report))
        if args.docs:
            from benchmarks.docs_block import committed_on, write_block

            write_block("bench-long-quality", markdown(report),
                        f"benchmarks/bench_long_quality.py --from-json {args.from_json} --docs",
                        measured=committed_on(args.from_json))
        return 0
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    settings = {k: getattr(args, k) for k in ("needles", "aware_needles", "continuation", "full_max", "full_cases",
                                              "size")}
    old = json.loads(args.output.read_text()) if args.output.exists() else None
    rows = old["rows"] if old and old.get("settings") == settings else []
    lms = {"plain": load(False), "ntk": load(True)}
    tokenizer = lms["plain"].tokenizer
    novel = NOVEL.read_text(encoding="utf-8")
    report = {"settings": settings, "threads": torch.get_num_threads(),
              "trained_positions": lms["plain"].model.config.max_position_embeddings, "ntk_factor": NTK_FACTOR,
              "rows": rows}
    for case in range(args.cases):  # every length's first case before any second one: an early stop stays balanced
        for tokens in lengths:
            if any(r["tokens"] == tokens and r["case"] == case for r in rows):
                continue
            rows.extend(measure_case(lms, novel, tokenizer, tokens, case, args))
            report["summary"] = summarize(rows)
            report["cpu_minutes"] = sum(r["cpu_seconds"] for r in rows) / 60
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=1))
    report["summary"] = summarize(rows)
    report["cpu_minutes"] = sum(r["cpu_seconds"] for r in rows) / 60
    args.output.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    if args.docs:
        from benchmarks.docs_block import write_block

        write_block("bench-long-quality", markdown(report),
                    "benchmarks/bench_long_quality.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
