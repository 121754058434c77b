"""Write docs/evaluation.md and the README's evaluation block from the committed results.

    .venv/bin/python benchmarks/eval_docs.py --results results/eval --docs docs/evaluation.md --readme README.md

Every table below is produced here from ``results/eval/cells.jsonl`` (`make bench-eval`) and,
for the earlier position and scorer grid, from ``results/summary.json``; nothing is typed in
by hand. Rerun after a new evaluation (`make eval-docs`).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memstep.evaluation import report  # noqa: E402
from memstep.evaluation.metrics import REFERENCE, case_of, summarize  # noqa: E402
from memstep.evaluation.stats import wilson_interval  # noqa: E402
from memstep.evaluation.store import ResultStore, load_summary  # noqa: E402

README_START = "<!-- eval-summary:start -->"
README_END = "<!-- eval-summary:end -->"


def is_ablation(config: dict) -> bool:
    return bool(config.get("question_pool")) or config.get("question_weight") is not None \
        or config.get("schedule") == "once"


def headline(row: dict) -> bool:
    return not is_ablation(row["config"]) and row["config"]["kind"] != "hf"


def ablation_rows(summary: dict, length: int = 2048):
    """The anchor (memstep's question-aware FM at the engine's defaults) and the ablations."""
    return lambda r: r["length"] == length and r["config"]["kind"] == "memstep" and (
        is_ablation(r["config"]) or (r["config"]["schedule"] == "fm" and r["config"].get("question_aware")))


def kinds_table(cells: list[dict]) -> str:
    """What the full cache answers per needle kind and length: how much each kind can resolve."""
    counts: dict[tuple, list[bool]] = defaultdict(list)
    for cell in cells:
        if cell["label"] == REFERENCE:
            counts[(cell["length"], cell.get("kind", "passkey"))].append(bool(cell["correct"]))
    lines = ["| length | needle kind | the full cache answers (95% CI) |", "|---:|---|---:|"]
    for (length, kind), found in sorted(counts.items()):
        k, n = sum(found), len(found)
        low, high = wilson_interval(k, n)
        lines.append(f"| {length} | {kind} | {k}/{n} ({100 * k / n:.0f}%, {100 * low:.0f}-{100 * high:.0f}%) |")
    return "\n".join(lines)


def cases_text(cells: list[dict]) -> str:
    per_length = defaultdict(set)
    for cell in cells:
        per_length[cell["length"]].add(case_of(cell))
    return ", ".join(f"{len(v)} cases at {k}" for k, v in sorted(per_length.items()))


def docs(summary: dict, cells: list[dict], earlier: dict | None) -> str:
    ablation = ablation_rows(summary)
    anchor_paired = lambda p: not is_ablation(_config_of(summary, p))  # noqa: E731
    parts = [
        "# Evaluation: the measurements",
        "",
        "Produced by `benchmarks/eval_docs.py` from `results/eval/` (`make bench-eval`, then `make eval-docs`); "
        "the README's Evaluation section is the short version. The embedded SmolLM2-135M-Instruct, fp32, CPU; "
        "memory budget M = 512 (+ 4 sinks), chunk c = 512; each kvpress press keeps the same number of document "
        "entries (ChunkKV and Finch: to within their rounding, see *entries kept*).",
        "",
        f"Cases: {cases_text(cells)}. A case is one of two Austen texts (each case reads its own window of its "
        "text) x a needle kind x a depth (1/6, 1/2, 5/6) x a seed. Needle kinds: `passkey` (\"The magic number "
        "for the vault is 51537.\"), `code` (\"The door of the garden opens with the code 4821.\"), `word` (\"The "
        "password of the museum is juniper.\"), `name` (\"The keeper of the harbour was a man named Tobias.\"), "
        "each asked back by the thing it is about.",
        "",
        f"Not every row has the cases `make bench-eval` asks for (24 per headline row, 16 per ablation): "
        f"{short_rows(summary)}. The run was cut to fit a shared 2-core machine; `make bench-eval` fills "
        "the rest (finished cells are kept), and every interval below is computed on the cases a row has.",
        "",
        "## How to read the numbers",
        "",
        "- **KL from the full cache**: over the 32 held-out tokens of prose that follow the document, the mean "
        "KL divergence (nats per token) of the compressed memory's next-token distribution from the full "
        "cache's, averaged over cases, with a 95% t interval. It measures the memory, not the model's skill: it "
        "needs no right answer. **Top-1 agreement**: how often both pick the same next token.",
        "- **Answered, of the cases the full cache answers**: accuracy counted only on the cases memstep's "
        "full cache answers (its count is the denominator), with the Wilson 95% interval. The model fails "
        "some needles with the whole document in view; those cases say nothing about a memory.",
        "- **Answer kept whole**: the share of (layer, KV head) slots that keep every token of the answer after "
        "the last step (for kvpress, read from the indices each press kept).",
        "- **Paired differences**: each configuration minus memstep's question-aware FM at the engine's "
        "defaults, on the same cases: accuracy with Newcombe's paired interval (method 10), KL and top-1 with "
        "t intervals of the per-case differences.",
        "",
        "## Headline",
        "",
        report.recommendation(summary),
        "",
        report.fair_table(summary, headline),
        "",
        "![answers on the cases the full cache answers, and KL, with 95% intervals](../results/eval/intervals.png)",
        "",
        "What the full cache answers, per needle kind (how much each kind can resolve):",
        "",
        kinds_table(cells),
        "",
        "### Paired differences (same cases)",
        "",
        report.paired_table(summary, lambda p: anchor_paired(p)),
        "",
        "What these cases cannot tell apart:",
        "",
        "\n".join(report.unsupported(summary, lambda p: anchor_paired(p))) or "- nothing: every interval "
        "excludes zero",
        "",
        "## Ablations (2048 tokens): where memstep's question-aware gains come from",
        "",
        "Question pooling (how the question's attention spreads over neighbouring keys: max over 15, mean over "
        "5, none), question weight (the question's share of the score), and one compression at the end (one "
        "step reads the whole document, then cuts to M) against chunked question-awareness (c = 512). The first "
        "row of each is the engine's default (max:15, weight 0.75, chunked), run in the headline grid.",
        "",
        report.fair_table(summary, ablation),
        "",
        report.paired_table(summary, lambda p: p["length"] == 2048 and is_ablation(_config_of(summary, p))),
        "",
        "What these cases cannot tell apart:",
        "",
        "\n".join(report.unsupported(summary, lambda p: p["length"] == 2048 and is_ablation(_config_of(summary, p))))
        or "- nothing: every interval excludes zero",
    ]
    if earlier:
        notes = (Path(__file__).parent / "eval_docs_earlier.md").read_text(encoding="utf-8").split("-->", 1)[1]
        setup, reading = notes.split("<!-- table -->")
        parts += ["", "## The earlier grid: RoPE positions and scorers (question-agnostic, passkey template)", "",
                  "From `results/summary.json` (`memstep eval` with `--ropes compact,document --scorers "
                  "chunk-attention,conv,snapkv`, kvpress SnapKV with its default window of 64 tokens and "
                  "StreamingLLM, and with the question ending the context but the window still 64): accuracy "
                  "over all cases, before needle kinds, KL and counted accuracy existed. Its kvpress rows are "
                  "not the presses as their authors set them (see the headline above for that).", "",
                  setup.strip(), "", report.results_table(earlier), "", report.contrasts_text(earlier), "",
                  "Reading it (written when that grid ran):", "", reading.strip()]
    return "\n".join(parts) + "\n"


def short_rows(summary: dict) -> str:
    """The rows with fewer cases than the grid asks for, with their counts."""
    short = [f"{r['label']} {r['cells']}" for r in summary["rows"]
             if r["cells"] < (16 if is_ablation(r["config"]) else 24)]
    return ", ".join(short) if short else "none"


def _config_of(summary: dict, paired: dict) -> dict:
    return next(r["config"] for r in summary["rows"] if r["label"] == paired["label"])


def readme_block(summary: dict) -> str:
    keep = lambda r: headline(r) and (r["config"]["kind"] != "memstep" or r["config"]["schedule"] != "imdc" # noqa: E731
                                     or r["config"].get("question_aware"))
    same = report.unsupported(summary, lambda p: not is_ablation(_config_of(summary, p)))
    return "\n".join([report.recommendation(summary), ""] + report.fair_takeaway(summary)
                     + ["", report.fair_table(summary, keep), "",
                        f"Rows have different numbers of cases (the *cases* column: {short_rows(summary)} are short "
                        "of the grid's, cut for time on a 2-core machine). What the intervals do not support:", "",
                        *(same or ["- nothing: every paired interval excludes zero"]), "",
                                                       "All rows, the paired intervals and the ablations: "
                                                       "[docs/evaluation.md](docs/evaluation.md)."])


def replace_block(path: Path, block: str) -> None:
    text = path.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{path} has no {README_START} ... {README_END} block")
    before, rest = text.split(README_START, 1)
    path.write_text(f"{before}{README_START}\n{block}\n{README_END}{rest.split(README_END, 1)[1]}", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results/eval")
    parser.add_argument("--earlier", default="results", help="the earlier grid's folder (its summary.json)")
    parser.add_argument("--docs", default="docs/evaluation.md")
    parser.add_argument("--readme", default=None)
    args = parser.parse_args(argv)
    cells = ResultStore(args.results).cells()
    if not cells:
        raise SystemExit(f"no cells in {args.results}: run `make bench-eval` first")
    summary = summarize(cells)
    Path(args.docs).write_text(docs(summary, cells, load_summary(args.earlier)), encoding="utf-8")
    if args.readme:
        replace_block(Path(args.readme), readme_block(summary))
    print(f"wrote {args.docs}" + (f" and the block of {args.readme}" if args.readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
