"""Write docs/evaluation.md and the README's evaluation block from the committed results.

    .venv/bin/python benchmarks/eval_docs.py --results results/eval --docs docs/evaluation.md --readme README.md

Every table below is produced here from ``results/eval/cells.jsonl`` (`make bench-eval`), from
``results/eval-gemma3/`` for Gemma 3 (`make bench-gemma3`) and, for the earlier position and
scorer grid, from ``results/summary.json``; nothing is typed in by hand. Rerun after a new
evaluation (`make eval-docs`).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memstep.evaluation import report  # noqa: E402
from memstep.evaluation.niah_standing import (essay_tokens, fidelities, fidelity_headline, fidelity_table,  # noqa: E402
                                              needle_headline, standing_table, standings)
from memstep.evaluation.metrics import REFERENCE, case_of, summarize  # noqa: E402
from memstep.evaluation.stats import wilson_interval  # noqa: E402
from memstep.evaluation.store import ResultStore, load_summary  # noqa: E402
from memstep.question_pool import (EARLIER_WEIGHT, QUESTION_POOL, QUESTION_WEIGHT, TUNED, TUNED_POOL,  # noqa: E402
                                   TUNED_WEIGHT, pool_at)

# The headline rows, each checked against the cases the full cache answers (its "counted" cases)
HEADLINE = (
    ("memstep FM question-aware (the recommended setting)",
     lambda c: c["kind"] == "memstep" and c["schedule"] == "fm" and c.get("question_aware") and not is_ablation(c)),
    ("kvpress SnapKV, window = the question", lambda c: c["kind"] == "kvpress" and c["scorer"] == "snapkv"
     and c.get("question_aware")),
    ("kvpress ChunkKV (that SnapKV inside, chunks of 20)", lambda c: c["kind"] == "kvpress" and c["scorer"] == "chunkkv"
     and c.get("question_aware")),
    ("memstep full cache (the reference)", lambda c: c["kind"] == "memstep" and c["schedule"] == "full"),
)
COUNTED_TARGET = {2048: 24, 4096: 12, 8192: 12}  # counted cases each headline row should reach

README_START = "<!-- eval-summary:start -->"
README_END = "<!-- eval-summary:end -->"
NIAH_START, NIAH_END = "<!-- niah-standing:start -->", "<!-- niah-standing:end -->"
FIDELITY_START, FIDELITY_END = "<!-- niah-fidelity:start -->", "<!-- niah-fidelity:end -->"


def is_ablation(config: dict) -> bool:
    """An ablation row, not a headline one; the row the others are paired with (summarize marks it
    "anchor": at a length where the engine's default pool has not run, the earlier default's row) is
    the headline."""
    if config.get("anchor"):
        return False
    if config.get("kind") == "memstep" and config.get("schedule") == "fm" and config.get("question_aware"):
        return True  # question-aware FM that is not the anchor: a few cases of another recipe beside the grid's
    return bool(config.get("question_pool")) or config.get("question_weight") is not None \
        or config.get("schedule") == "once" or bool(config.get("span"))


def summarized(cells: list[dict]) -> dict:
    """``summarize``, with the row each length's others are paired with marked in its config
    (is_ablation reads configs)."""
    summary = summarize(cells)
    for row in summary["rows"]:
        if row.get("anchor"):
            row["config"] = {**row["config"], "anchor": True}
    return summary


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


def counts_table(summary: dict) -> str:
    """Per headline row and length: the cases run, the counted ones, and the target."""
    lines = ["| row | length | cases run | counted (the full cache answers them) | target | reached |",
             "|---|---:|---:|---:|---:|---|"]
    for name, test in HEADLINE:
        for length, target in sorted(COUNTED_TARGET.items()):
            row = next((r for r in summary["rows"] if r["length"] == length and test(r["config"])), None)
            run, counted = (row["cells"], row["counted"]) if row else (0, 0)
            lines.append(f"| {name} | {length} | {run} | {counted} | {target} | {'yes' if counted >= target else 'no'} |")
    return "\n".join(lines)


def kept_whole_section(summary: dict) -> list[str]:
    """Length by length, the headline rows' answers next to how often each kept the answer whole,
    and the paired difference of the latter to memstep: why the presses rank as they do."""
    lines = ["| length | configuration | answered, of the cases the full cache answers | answer kept whole, "
             "layer-head slots (95% CI) | kept whole, paired difference to memstep (95% CI) |",
             "|---:|---|---:|---:|---:|"]
    paired = {(p["length"], p["label"]): p for p in summary.get("paired") or []}
    for length in sorted(COUNTED_TARGET):
        for name, test in HEADLINE[:3]:
            row = next((r for r in summary["rows"] if r["length"] == length and test(r["config"])), None)
            if row is None:
                continue
            diff = report._difference(paired.get((length, row["label"]), {}), "needle_whole", 100, " points", 0)
            lines.append(f"| {length} | {name} | {report.counted_text(row)} | "
                         f"{report.interval_text(row, 'needle_whole', percent=True)} | "
                         f"{'-' if row['label'] == _anchor_label(summary, length) else diff} |")
    return lines


def kept_whole_orders_answers(summary: dict) -> bool:
    """At every length, do the headline rows rank the same by answers and by answer kept whole?"""
    for length in COUNTED_TARGET:
        rows = [r for r in summary["rows"] if r["length"] == length and r.get("counted")
                and any(test(r["config"]) for _, test in HEADLINE[:3])]
        by_answers = sorted(rows, key=lambda r: r["counted_accuracy"])
        by_whole = sorted(rows, key=lambda r: r.get("needle_whole") or 0)
        if [r["label"] for r in by_answers] != [r["label"] for r in by_whole]:
            return False
    return True


def chunkkv_not_apart(summary: dict) -> bool:
    """Does the paired accuracy interval of ChunkKV against memstep include 0 at every length?"""
    test = HEADLINE[2][1]
    labels = {r["label"] for r in summary["rows"] if test(r["config"])}
    found = [p for p in summary.get("paired") or [] if p["label"] in labels
             and p.get("accuracy_difference_low") is not None]
    return bool(found) and all(p["accuracy_difference_low"] <= 0 <= p["accuracy_difference_high"] for p in found)


def _anchor_label(summary: dict, length: int) -> str | None:
    row = next((r for r in summary["rows"] if r["length"] == length and HEADLINE[0][1](r["config"])), None)
    return row and row["label"]


def finch_rows(row: dict) -> bool:
    return row["config"]["kind"] == "kvpress" and str(row["config"].get("scorer", "")).startswith("finch")


def finch_question_text(cells: list[dict]) -> str:
    """How many of the question's own tokens each Finch variant kept (its cells record it)."""
    found = defaultdict(list)
    for cell in cells:
        settings = cell.get("settings") or {}
        if cell["label"].startswith("kvpress finch") and "question_entries_kept" in settings:
            found[cell["label"]].append((settings["question_entries_kept"], settings["question_tokens"]))
    lines = []
    for label, pairs in sorted(found.items()):
        whole = sum(1 for kept, total in pairs if kept >= total)
        low = min(kept / total for kept, total in pairs)
        lines.append(f"- {label}: the question kept whole in {whole} of {len(pairs)} cases (the fewest: "
                     f"{100 * low:.0f}% of its tokens).")
    return "\n".join(lines)


def finch_after(rows: list[dict]) -> list[str]:
    """What is left once the harness keeps the question whole: Finch's own score, from the numbers."""
    by = {r["config"]["scorer"]: r for r in rows if r["length"] == 2048}
    registry, unrotated = by.get("finch"), by.get("finch-unrotated")
    if registry is None:
        return []
    text = (f"With the question whole, Finch as kvpress runs it answers {report.counted_text(registry)} of the "
            f"cases the full cache answers, KL {report.interval_text(registry, 'kl')}, and keeps every token of "
            f"the answer in {report.interval_text(registry, 'needle_whole', percent=True)} of the layer-head "
            "slots. Its score is the question's attention averaged over the window and normalized, with no "
            "pooling over neighbouring keys (SnapKV average-pools over 5, memstep passes each key's attention to the "
            "14 keys after it), so it keeps "
            "scattered tokens of the answer: the pooling ablation above shows the same loss for memstep's own "
            "memory without pooling.")
    if unrotated is not None:
        overlap = all(a[f"{m}_low"] is not None and b[f"{m}_low"] is not None
                      and a[f"{m}_low"] <= b[f"{m}_high"] and b[f"{m}_low"] <= a[f"{m}_high"]
                      for m in ("counted", "kl") for a, b in [(registry, unrotated)])
        text += (f" Leaving the kept keys at their document positions (finch-unrotated) gives "
                 f"{report.counted_text(unrotated)}, KL {report.interval_text(unrotated, 'kl')} on "
                 f"{unrotated['cells']} cases; " + ("their intervals overlap Finch's, so these cases do not say "
                                                    "whether the re-rotation itself costs anything." if overlap else
                                                    "the intervals separate the two: the re-rotation costs here."))
    return [text + " What remains is Finch on this model, not memstep's harness."]


def finch_section(summary: dict, cells: list[dict]) -> list[str]:
    rows = [r for r in summary["rows"] if finch_rows(r)]
    if not rows:
        return []
    kept = {}
    for cell in cells:  # kept entries minus document entries = question entries kept (older cells too)
        settings = cell.get("settings") or {}
        if cell["label"].startswith("kvpress finch") and settings.get("kept_entries") is not None:
            kept.setdefault(cell["label"], []).append(settings["kept_entries"] - settings["document_entries"])
    spans = "; ".join(f"{label}: {min(v)}-{max(v)}" for label, v in sorted(kept.items()))
    chunked = next((r for r in rows if r["config"]["scorer"] == "finch-chunked"), None)
    first = (f" ({report.counted_text(chunked)} of the cases the full cache answers at {chunked['length']:,} "
             f"tokens, KL {report.interval_text(chunked, 'kl')})") if chunked else ""
    return [
        "## Finch: why it scored low, and what was ours",
        "",
        f"memstep's first Finch runs{first} set `chunk_length` = c = 512. kvpress's "
        "FinchPress then keeps the same share of every 512-token chunk, and the question window sits in the "
        "last chunk, which is short (the context is about 2,070 tokens: four chunks of 512 and one of ~50 "
        "holding the question). That chunk keeps its share of ~50 entries, fewer than the question's 18-21 "
        "tokens, so part of the question itself is dropped before the answer is generated, and the end of the "
        "document with it. kvpress's own evaluation registry runs `FinchPress()` (no chunks: one top-k over "
        "the whole context), which keeps the window whole. The chunk length was memstep's harness choice, not "
        "Finch's: `finch` is now kvpress's registry setting, and the chunked runs are kept as `finch-chunked`. "
        "`finch-unrotated` leaves the kept keys at their document positions (kvpress re-rotates them to "
        "0..n-1 by default) to show what the re-rotation does on this model.",
        "",
        f"Question entries left in the cache (kept entries minus document entries, per cell): {spans}.",
        "",
        finch_question_text(cells),
        "",
        *finch_after(rows),
        "",
        report.fair_table(summary, finch_rows),
        "",
        report.paired_table(summary, lambda p: p["label"].startswith("kvpress finch")),
        "",
        "What these cases cannot tell apart:",
        "",
        "\n".join(report.unsupported(summary, lambda p: p["label"].startswith("kvpress finch")))
        or "- nothing: every interval excludes zero",
    ]


def gemma3_section(folder: Path) -> list[str]:
    """Gemma 3 270M: hybrid attention (sliding-window and global layers)."""
    store = ResultStore(folder)
    cells = store.cells()
    if not cells:
        return []
    summary = summarized(cells)
    run = (load_summary(folder) or {}).get("run") or {}
    form = (run.get("settings") or {}).get("prompt_form", "completion")
    scopes = sorted({c.get("retention_layers") for c in cells if c.get("retention_layers")})
    failures = store.failures()
    failed = sorted({(f["label"], f["message"]) for f in failures})
    return [
        "## Gemma 3 270M: sliding-window and global layers",
        "",
        f"From `results/eval-gemma3/` (`make bench-gemma3`). Gemma 3 270M (base model, Gemma terms of use), fp32, "
        f"CPU: 18 layers, 15 of them sliding-window layers (window 512) and 3 global ones (every sixth). Only the "
        f"global layers follow the memory schedule; a sliding layer holds its last 511 entries whatever the "
        f"schedule. M = c = 512: the chunk equals the window, so each chunk's queries in a sliding layer see "
        f"exactly the window's keys of the chunks before (the engine's invariant holds at any c, this keeps "
        f"each step's work like SmolLM2's), and M = 512 makes a global layer hold what a sliding one holds. "
        f"The model is asked in **{form}** form (a base model: the prompt ends where the answer starts; the "
        f"runner picks the form from the model). Cases: {cases_text(cells)} (16,384 tokens: the first Austen text "
        f"alone, the other is shorter); needle kinds: {', '.join(sorted({c.get('kind', 'passkey') for c in cells}))}.",
        "",
        f"**Retention is counted on the global layers** (the cells' `retention_layers`: {', '.join(scopes) or '-'}): "
        "a sliding layer keeps its window by construction, so counting it would only say how far the needle is "
        "from the end. KL, top-1 agreement and counted accuracy are as above. kvpress presses compress the "
        "global layers only and leave the sliding ones whole, kvpress's own rule for Gemma 3 (it applies it to "
        "its multimodal class; the text-only `Gemma3ForCausalLM` is outside its supported list and would have its "
        "sliding layers compressed too, which breaks their window masks). The peer gives each layer kind its own "
        "attention mask after the press (transformers < 5.3 derives both from one cache length).",
        "",
        "What the full cache answers, per needle kind:",
        "",
        kinds_table(cells),
        "",
        report.fair_table(summary, lambda r: r["config"]["kind"] != "hf"),
        "",
        "### Paired differences (same cases)",
        "",
        report.paired_table(summary),
        "",
        "What these cases cannot tell apart:",
        "",
        "\n".join(report.unsupported(summary)) or "- nothing: every interval excludes zero",
        "",
        "What has run, per length (`make bench-gemma3` fills the rest; finished cells are kept):",
        "",
        *gemma3_coverage(summary),
        "",
        "### kvpress presses that do not run on Gemma 3",
        "",
        "\n".join(f"- {label}: {message}" + (" (kvpress's KeyRerotationPress reads `rotary_emb.inv_freq`; "
                                             "Gemma 3's rotary embedding keeps one per layer type, "
                                             "`sliding_attention_inv_freq` and `full_attention_inv_freq`)"
                                             if "inv_freq" in message else "")
                  for label, message in failed) or "- none: every press asked for ran",
    ]


GEMMA3_LENGTHS = (2048, 8192, 16384)  # the lengths `make bench-gemma3` runs


def gemma3_coverage(summary: dict) -> list[str]:
    """One line per length of the Gemma 3 grid: the configurations with cells there, and their cases."""
    lines = []
    for length in GEMMA3_LENGTHS:
        rows = [r for r in summary["rows"] if r["length"] == length]
        lines.append(f"- {length:,} tokens: " + ("; ".join(f"{r['label']} ({r['cells']} cases)" for r in rows)
                                                 if rows else "not run yet"))
    return lines


def gemma3_sentence(folder: Path) -> list[str]:
    """One line for the README: Gemma 3's question-aware FM and the kvpress presses, from the numbers."""
    cells = ResultStore(folder).cells() if folder.exists() else []
    if not cells:
        return []
    summary = summarized(cells)
    parts = []
    for length in sorted({r["length"] for r in summary["rows"]}):
        aware = next((r for r in summary["rows"] if r["length"] == length and HEADLINE[0][1](r["config"])), None)
        if aware:
            parts.append(f"{length:,} tokens: {report.counted_text(aware)}, KL {report.interval_text(aware, 'kl')}")
    peer_texts = []
    for length in sorted({r["length"] for r in summary["rows"]}):
        peers = [r for r in summary["rows"] if r["length"] == length and r["config"]["kind"] == "kvpress"
                 and r.get("kl")]
        if peers:
            peer_texts.append(f"At {length:,} tokens " + "; ".join(
                f"{r['label'].replace(' M=512', '')} {report.counted_text(r)}, KL {report.interval_text(r, 'kl')}"
                for r in peers))
    agnostic = [f"{r['length']:,} tokens {report.counted_text(r)}" for r in summary["rows"]
                if r["config"]["kind"] == "memstep" and r["config"]["schedule"] == "fm"
                and not r["config"].get("question_aware") and r.get("counted")]
    failed = sorted({f["label"].replace(" M=512", "") for f in ResultStore(folder).failures()})
    return ["", "On **Gemma 3 270M** (15 sliding-window layers that keep their 512-token window, 3 global layers "
            "that follow the budget; a base model asked in completion form), question-aware FM (M = c = 512) "
            "answers, of the cases its full cache answers, " + "; ".join(parts) + "."
            + (f" Without the question, FM answers {', '.join(agnostic)}." if agnostic else "")
            + (f" kvpress (global layers only). {'. '.join(peer_texts)}." if peer_texts else "")
            + (f" {', '.join(failed)} does not run on Gemma 3 (see the details)." if failed else "")
            + " Details: [docs/evaluation.md](docs/evaluation.md#gemma-3-270m-sliding-window-and-global-layers)."]


def docs(summary: dict, cells: list[dict], earlier: dict | None, gemma3: Path | None = None) -> str:
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
        "Span-preserving selection (`--span`) and the public Needle-In-A-Haystack test (`--benchmark niah`), with "
        "tighter budgets: [docs/spans-and-niah.md](spans-and-niah.md).",
        "",
        f"Cases: {cases_text(cells)}. A case is one of two Austen texts (each case reads its own window of its "
        "text) x a needle kind x a depth (1/6, 1/2, 5/6) x a seed. Needle kinds: `passkey` (\"The magic number "
        "for the vault is 51537.\"), `code` (\"The door of the garden opens with the code 4821.\"), `word` (\"The "
        "password of the museum is juniper.\"), `name` (\"The keeper of the harbour was a man named Tobias.\"), "
        "each asked back by the thing it is about.",
        "",
        "**Headline rows** (the comparison this page is about): memstep FM question-aware at the engine's "
        "defaults (the recommended setting), kvpress SnapKV with the question as its window and kvpress ChunkKV "
        "(that SnapKV inside) as their authors run them, and memstep's full cache as the reference. Each should "
        f"reach {COUNTED_TARGET[2048]} counted cases at 2,048 tokens and {COUNTED_TARGET[4096]} at 4,096 and "
        "8,192 (counted: the full cache answers them). The cases `make bench-long` adds for this lean to the "
        "needle kinds the 135M full cache can answer (passkey and word: seeds 1-2 at 2,048, seeds 0-1 at 4,096, "
        "depths 1/4 and 3/4 with seeds 0-1 at 8,192); the code and name needles stay in at 2,048 (seed 0). The table says what "
        "has run so far.",
        "",
        counts_table(summary),
        "",
        f"Other rows have fewer cases: {short_rows(summary)}. The run was cut to fit a shared 2-core machine; "
        "`make bench-eval` fills the rest (finished cells are kept), and every interval below is computed on the "
        "cases a row has.",
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
        "### Why the presses rank as they do: the answer kept whole",
        "",
        "A needle's answer (a five-digit number, a word, a name) is several tokens, and the model can only "
        "read it back if every one of them survives. The presses differ in exactly that: SnapKV scores tokens "
        "one by one after a pool over 5 keys, memstep pools the question's scores over 15 keys, ChunkKV keeps "
        "or drops whole chunks of 20 tokens (a needle sentence spans one or two). The share of layer-head "
        "slots that keep the whole answer "
        + ("ranks the three as their answers do, at every length:" if kept_whole_orders_answers(summary) else
           "does not rank the three as their answers do at every length:"),
        "",
        *kept_whole_section(summary),
        "",
        "Where the two orders agree, the ranking is consistent with one cause, how much of the answer's span "
        "survives: pooling over 15 keys keeps more of it than SnapKV's 5, keeping whole chunks keeps more "
        "still" + (" (ChunkKV's answers are within the paired intervals of memstep's at every length)"
                   if chunkkv_not_apart(summary) else "") + ". A paired interval that includes 0 means these "
        "cases do not tell the two apart.",
        "",
        "## Ablations (2048 tokens): where memstep's question-aware gains come from",
        "",
        "Question pooling (how the question's attention spreads over neighbouring keys). This grid ran when the "
        f"default was the tuned recipe (`--question-pool {TUNED}`: `{TUNED_POOL}` at weight {TUNED_WEIGHT:g}, "
        f"at M = 512 running as `{pool_at(TUNED_POOL, 512)}`: each key's attention passed on to the 14 keys after it, a memory entry keeping the strongest "
        "share it has had, fading to 0.7 of itself per step, and taking the strongest share any KV head of its layer "
        "gives its position); its row is the one the others pair with. The others: follow:15+carry+heads@256 without "
        "fading; follow:15+carry without sharing between heads; follow:15 without carrying; "
        f"{QUESTION_POOL}, today's default (the strongest attention among each key and its 7 neighbours on either side; "
        f"here at weight {EARLIER_WEIGHT:g}, and on a few cases at its own weight {QUESTION_WEIGHT:g}); mean over 5; none; "
        "the question weight (the question's share of the score); and one compression at the end (one step reads "
        "the whole document, then cuts to M) against chunked question-awareness (c = 512), each paired with the "
        "anchor on the same cases. Settings were chosen on these cases, so these rows measure fit, not how a "
        "setting carries to new cases: that is the frozen test split ([test-split.md](test-split.md)).",
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
    parts += [""] + finch_section(summary, cells)
    if gemma3 is not None:
        parts += [""] + gemma3_section(gemma3)
    if earlier:
        notes = (Path(__file__).parent / "eval_docs_earlier.md").read_text(encoding="utf-8").split("-->", 1)[1]
        setup, reading = notes.split("<!-- table -->")
        parts += ["", "## The earlier grid: RoPE positions and scorers (question-agnostic, passkey template)", "",
                  "From `results/legacy-grid/summary.json` (`memstep eval` with `--ropes compact,document --scorers "
                  "chunk-attention,conv,snapkv`, kvpress SnapKV with its default window of 64 tokens and "
                  "StreamingLLM, and with the question ending the context but the window still 64): accuracy "
                  "over all cases, before needle kinds, KL and counted accuracy existed. Its kvpress rows are "
                  "not the presses as their authors set them (see the headline above for that).", "",
                  setup.strip(), "", report.results_table(earlier), "", report.contrasts_text(earlier), "",
                  "Reading it (written when that grid ran):", "", reading.strip()]
    return "\n".join(parts) + "\n"


def short_rows(summary: dict) -> str:
    """The rows with fewer cases than the grid asks for, with their counts."""
    short = [f"{r['label']} at {r['length']} {r['cells']}" for r in summary["rows"]
             if r["cells"] < (16 if is_ablation(r["config"]) else 24)
             and not any(test(r["config"]) for _, test in HEADLINE)]
    return ", ".join(short) if short else "none"


def _config_of(summary: dict, paired: dict) -> dict:
    return next(r["config"] for r in summary["rows"] if r["label"] == paired["label"])


def readme_block(summary: dict, gemma3: Path | None = None) -> str:
    """The README's short version: the recommendation and the takeaway per length (the table, every
    paired interval and the ablations are in docs/evaluation.md)."""
    return "\n".join([report.recommendation(summary), ""] + report.fair_takeaway(summary)
                     + [*(gemma3_sentence(gemma3) if gemma3 is not None else []), "",
                        "Every row, the paired intervals and the ablations: [docs/evaluation.md](docs/evaluation.md)."])


def replace_block(path: Path, block: str, start: str = README_START, end: str = README_END) -> None:
    text = path.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} block")
    before, rest = text.split(start, 1)
    path.write_text(f"{before}{start}\n{block}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def replace_where_marked(paths, block: str, start: str, end: str) -> None:
    """``block`` between its markers in every file of ``paths`` that has them (at least one must)."""
    marked = [Path(path) for path in paths if path and start in Path(path).read_text(encoding="utf-8")]
    if not marked:
        raise SystemExit(f"none of {', '.join(map(str, paths))} has a {start} ... {end} block")
    for path in marked:
        replace_block(path, block, start, end)


def niah_block(folder: Path) -> str:
    """The README's needle table, from the summary `memstep eval --benchmark niah` last wrote there."""
    found = standings(load_summary(folder) or {})
    if not found:
        raise SystemExit(f"no needle-test rows in {folder}/summary.json: run `memstep eval --benchmark niah` first")
    return "\n".join([
        needle_headline(found), "",
        "Answered of the depths the full cache answers · answer retention (the share of the answer's (KV head, "
        "token) pairs still held, over every depth run), at equal kept entries; then memstep minus each press on "
        "the same depths (paired, Newcombe's 95% interval): *leads* or *loses* where the interval excludes 0, "
        "else *ties*.", "", standing_table(found), "",
        f"*Written by `python benchmarks/eval_docs.py` from `{folder}/summary.json`.*"])


def fidelity_block(folder: Path, table: bool = True) -> str:
    """The needle test's fidelity beyond the needle (KL and top-1 agreement over the essay that follows),
    from a folder `memstep eval --benchmark niah --metrics kl` wrote: the sentence, and with ``table``
    the table under it."""
    summary = load_summary(folder) or {}
    found = fidelities(summary)
    if not found:
        raise SystemExit(f"no needle-test rows with KL in {folder}/summary.json: run `memstep eval --benchmark "
                         "niah --metrics accuracy,kl,retention` there first")
    lines = [fidelity_headline(found)]
    if table:
        lines += ["", "Mean KL from the full cache's next-token distributions over "
                  f"{essay_tokens(summary)} that follow each document (nats per token) · top-1 agreement with it, "
                  "over the depths run; then memstep minus each press on the same depths (paired, 95% t interval; a "
                  "negative KL difference: memstep's predictions are closer to the full cache's).", "",
                  fidelity_table(found)]
    return "\n".join(lines + ["", f"*Written by `python benchmarks/eval_docs.py` from `{folder}/summary.json`.*"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results/eval")
    parser.add_argument("--earlier", default="results/legacy-grid", help="the earlier grid's folder (its summary.json)")
    parser.add_argument("--gemma3", default="results/eval-gemma3", help="the Gemma 3 results folder ('' = none)")
    parser.add_argument("--docs", default="docs/evaluation.md")
    parser.add_argument("--readme", default=None)
    parser.add_argument("--niah", default="results/niah",
                        help="the needle test's results folder, for the README's needle table ('' = none)")
    parser.add_argument("--niah-fidelity", default="results/niah-kl",
                        help="a needle-test folder run with --metrics kl, for the README's sentence and the needle "
                             "docs' table of KL and top-1 agreement ('' = none)")
    parser.add_argument("--niah-docs", default="docs/spans-and-niah.md", help="where the needle test's table goes")
    args = parser.parse_args(argv)
    cells = ResultStore(args.results).cells()
    if not cells:
        raise SystemExit(f"no cells in {args.results}: run `make bench-eval` first")
    summary = summarized(cells)
    gemma3 = Path(args.gemma3) if args.gemma3 and Path(args.gemma3).exists() else None
    Path(args.docs).write_text(docs(summary, cells, load_summary(args.earlier), gemma3), encoding="utf-8")
    if args.readme:
        replace_block(Path(args.readme), readme_block(summary, gemma3))
        # the needle test's standing (the dev split's public grid) goes where its markers are: the docs
        if args.niah:
            replace_where_marked([args.readme, args.niah_docs], niah_block(Path(args.niah)), NIAH_START, NIAH_END)
        if args.niah_fidelity and Path(args.niah_fidelity).is_dir():
            folder = Path(args.niah_fidelity)
            if FIDELITY_START in Path(args.readme).read_text(encoding="utf-8"):
                replace_block(Path(args.readme), fidelity_block(folder, table=False), FIDELITY_START, FIDELITY_END)
            replace_block(Path(args.niah_docs), fidelity_block(folder), FIDELITY_START, FIDELITY_END)
    print(f"wrote {args.docs}" + (f" and the block of {args.readme}" if args.readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
