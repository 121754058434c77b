"""LaCo on the embedded model: memstep's defaults beside the settings of the authors' notebooks.

Runs of ``memstep.compress.collapse_run.CollapseRun`` on the embedded SmolLM2-135M (30 layers),
each measured on the same probe: held-out perplexity (Pride and Prejudice), passkey accuracy
(5 cases at ~1k tokens, full cache), a greedy generation sample, parameters, KV bytes per
token and the process CPU seconds of a 2,048-token prefill (best of --repeats, one torch
thread). The runs:

- memstep's defaults (C=3, L=0, H=29, I=1, T=0.45, chained merges), with the paper's formula
  and the released notebook's, then block-influence and uniform removal at the same number of
  removed layers;
- chained merges against one RDSC over each accepted run (``--merge run``) at a threshold low
  enough for merges to chain (T=0.1), with the largest weight difference between the two;
- the authors' own notebook settings: Llama-13B's (C=7, I=1, L=0, T=0.45) and Baichuan-13B's
  (C=3, I=1, L=0, T=0.6), H the top layer's index as there;
- the former default C=2 (I=1, L=1, T=0.8, H = all layers), where RDSC reduces to dropping layers.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_laco.py --docs   # -> benchmarks/results/bench_laco_cpu.json
    .venv/bin/python benchmarks/bench_laco.py --quick                    # a smaller probe, for a look

Writes the tables of docs/compress.md (between its laco markers) with --docs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memstep.compress.collapse_run import CollapseRun  # noqa: E402
from memstep.compress.data import calibration_texts  # noqa: E402
from memstep.compress.laco import CALIBRATION_SENTENCES, DEFAULTS  # noqa: E402
from memstep.compress.quality import make_probe  # noqa: E402
from memstep.models import load_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "compress.md"
DEFAULT_SETTINGS = {k: v for k, v in DEFAULTS.items() if k != "H"}
# (title, variants, settings, baselines)
RUNS = [
    ("memstep defaults", ("paper", "notebook"), DEFAULT_SETTINGS, True),
    ("chained, T=0.1", ("paper",), {**DEFAULT_SETTINGS, "T": 0.1}, False),
    ("one RDSC per run, T=0.1", ("paper",), {**DEFAULT_SETTINGS, "T": 0.1, "merge": "run"}, False),
    ("notebook Llama-13B", ("notebook",), dict(C=7, L=0, I=1, T=0.45), False),
    ("notebook Baichuan-13B", ("notebook",), dict(C=3, L=0, I=1, T=0.6), False),
    ("former default C=2", ("paper",), dict(C=2, L=1, H=30, I=1, T=0.8), False),
]
LABEL_OF = {"dense": "dense", "laco-paper": "paper formula's weights", "laco-notebook": "notebook's weights"}
PAPER = "LaCo paper: about 80% of the average benchmark score kept at about 27% of the layers removed (7B-13B)"


def run(lm, texts, probe, repeats, variants, baselines, dense=None, **settings) -> dict:
    began = time.perf_counter()
    collapse = CollapseRun(lm, texts, variants=variants, probe=probe, baselines=baselines, repeats=repeats,
                           dense=dense, **settings)
    for event in collapse:
        if event["event"] == "candidate":
            print(f"  [{event['variant']}] layers {event['layers']}: similarity {event['similarity']:.4f} "
                  f"{'merged' if event['accepted'] else 'kept'}", flush=True)
        elif event["event"] == "model":
            same = f" (weights of {event['same_as']}: its measurements)" if "same_as" in event else ""
            print(f"  {event['label']}: {event['layers']} layers, perplexity {event['perplexity']:.2f}, passkey "
                  f"{event['passkey_accuracy']:.0%}, prefill {event['prefill_cpu_seconds']:.2f} CPU s{same}",
                  flush=True)
    report = collapse.report
    report["seconds"] = time.perf_counter() - began
    return report


def settings_text(settings: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items() if k != "merge") + \
        (f" merge={settings['merge']}" if settings.get("merge", "chained") != "chained" else "")


def _removed(report: dict, key: str, row: dict) -> list[int]:
    return report["searches"][key[5:]]["removed"] if key.startswith("laco-") else row.get("removed") or []


def table(reports: list[tuple[str, dict, dict]]) -> str:
    lines = ["| run | settings | model | layers | removed | KV / token | perplexity | vs dense | passkey | "
             "prefill CPU s | saved | search s |", "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n, (title, settings, report) in enumerate(reports):
        for key, row in report["models"].items():
            if key == "dense" and n:
                continue  # the same dense row as in the first run
            removed = _removed(report, key, row)
            removed_text = "—" if key == "dense" else (", ".join(map(str, removed)) or "none")
            correct = row["passkey_correct"]
            label = row["label"] + (f" (= {LABEL_OF[row['same_as']]})" if "same_as" in row else "")
            search = report["searches"].get(key[5:], {}).get("seconds") if key.startswith("laco-") else None
            lines.append(
                f"| {title if key != 'dense' else 'dense'} | {settings_text(settings) if key != 'dense' else ''} | "
                f"{label} | {row['layers']} | {removed_text} | {row['kv_bytes_per_token'] / 1024:.1f} KiB | "
                f"{row['perplexity']:.2f} | x{row['perplexity_ratio']:.2f} | {sum(correct)}/{len(correct)} | "
                f"{row['prefill_cpu_seconds']:.2f} | {row['prefill_cpu_seconds_saved']:.0%} | "
                f"{'' if search is None else f'{search:.0f}'} |")
    return "\n".join(lines)


def merges_table(reports: list[tuple[str, dict, dict]]) -> str:
    lines = ["| run | variant | merges (base <- merged) | similarity of each accepted merge | "
             "largest weight difference, chained vs one RDSC |", "|---|---|---|---|---:|"]
    for title, _, report in reports:
        for variant, search in report["searches"].items():
            merges = "; ".join(f"{b} <- {', '.join(map(str, m))}" for b, m in search["merges"].items()) or "none"
            sims = ", ".join(f"{c['similarity']:.3f}" for c in search["candidates"] if c["accepted"]) or "—"
            best = max((c["similarity"] for c in search["candidates"]), default=float("nan"))
            diff = max(search["chain_difference"].values(), default=None)
            lines.append(f"| {title} | {variant} | {merges} | {sims} (best candidate {best:.3f}) | "
                         f"{'—' if diff is None else f'{diff:.3g}'} |")
    return "\n".join(lines)


def samples_table(reports: list[tuple[str, dict, dict]], prompt: str) -> str:
    lines = [f"Greedy answers to \"{prompt}\" (40 new tokens):", "", "| run | model | answer |", "|---|---|---|"]
    seen = set()
    for title, _, report in reports:
        for key, row in report["models"].items():
            if "same_as" in row or (key == "dense" and "dense" in seen):
                continue
            seen.add(key if key == "dense" else (title, key))
            text = row["sample"].replace("|", "\\|").replace("\n", " ")
            text = text if len(text) <= 200 else text[:200] + " …"
            lines.append(f"| {title if key != 'dense' else 'dense'} | {row['label']} | {text} |")
    return "\n".join(lines)


def render(reports: list[tuple[str, dict, dict]], prompt: str) -> str:
    return "\n\n".join([table(reports), merges_table(reports), samples_table(reports, prompt)])


def write_docs(markdown: str, path: Path = DOCS) -> None:
    start, end = "<!-- laco-results:start -->", "<!-- laco-results:end -->"
    text = path.read_text()
    head, rest = text.split(start, 1)
    path.write_text(f"{head}{start}\n{markdown}\n{end}{rest.split(end, 1)[1]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 passkey cases, 4 windows, 1024-token prefill")
    parser.add_argument("--repeats", type=int, default=2, help="timed prefills per model (best counts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time ratios are stable)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--docs", action="store_true", help="also put the tables into docs/compress.md")
    parser.add_argument("--retable", type=Path, default=None, help="re-render the tables of an existing JSON (no runs)")
    args = parser.parse_args(argv)
    if args.retable:
        result = json.loads(args.retable.read_text())
        reports = [(title, r["settings"], r["report"]) for title, r in result["runs"].items()]
        result["markdown"] = render(reports, result["probe"]["sample_prompt"])
        args.retable.write_text(json.dumps(result, indent=1))
        if args.docs:
            write_docs(result["markdown"])
        print(result["markdown"])
        return 0
    torch.set_num_threads(args.threads)
    lm = load_model("embedded", device="auto", dtype="float32")
    device = lm.device.split(":")[0]
    output = args.output or RESULTS / f"bench_laco_{device}.json"
    sizes = dict(windows=4, passkey_cases=2, prefill_tokens=1024) if args.quick else dict(
        windows=8, passkey_cases=5, passkey_tokens=1024, prefill_tokens=2048)
    probe = make_probe(lm.tokenizer, **sizes)
    texts = calibration_texts(CALIBRATION_SENTENCES)
    began = time.perf_counter()
    reports, dense = [], None
    for title, variants, settings, baselines in RUNS:
        print(f"{title}: {settings}, variants {variants}", flush=True)
        report = run(lm, texts, probe, args.repeats, variants, baselines, dense=dense, **settings)
        dense = dense or report["models"]["dense"]
        reports.append((title, settings, report))
    markdown = render(reports, probe.to_dict()["sample_prompt"])
    result = {"model": lm.name, "device": lm.device, "dtype": lm.dtype, "torch_threads": torch.get_num_threads(),
              "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
              "seconds": time.perf_counter() - began, "probe": probe.to_dict(), "paper": PAPER,
              "runs": {title: {"settings": settings, "report": report} for title, settings, report in reports},
              "markdown": markdown}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1))
    print(markdown)
    if args.docs:
        write_docs(markdown)
    print(f"wrote {output} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
