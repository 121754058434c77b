"""LaCo on the embedded model: what layer collapse removes, keeps and saves.

One run of ``memstep.compress.collapse_run.CollapseRun`` with the default settings and both
merge variants (the paper's formula and the released notebook's), then the dense model,
LaCo and the layer-removal baselines at the same number of removed layers (block influence
as in ShortGPT, uniformly spaced) measured on the same probe: held-out perplexity (Pride and
Prejudice), passkey accuracy (a few cases at ~1k tokens, full cache), parameters, weight
bytes, KV bytes per token and the prefill seconds of one document (best of --repeats; with
one torch thread the process CPU seconds too, which shared cores barely move). A second
search with the paper's own kind of setting (C=4, I=2) shows both variants where they differ.

    .venv/bin/python benchmarks/bench_laco.py            # -> benchmarks/results/bench_laco_cpu.json
    .venv/bin/python benchmarks/bench_laco.py --quick    # a smaller probe, for a look

Prints the Markdown table of the README's "Compress: layer collapse (LaCo)" section.
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
WIDER = dict(C=4, I=2, T=0.8)  # the paper's kind of window, for the variants' difference
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
                  f"{event['passkey_accuracy']:.0%}, prefill {event['prefill_seconds']:.2f} s{same}", flush=True)
    report = collapse.report
    report["seconds"] = time.perf_counter() - began
    return report


def table(reports: list[tuple[str, dict]]) -> str:
    lines = ["| settings | model | layers | removed | params | KV / token | perplexity | vs dense | passkey | "
             "prefill CPU s | saved |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for title, report in reports:
        for key, row in report["models"].items():
            removed = row.get("removed")
            if key.startswith("laco-"):
                removed = report["searches"][key[5:]]["removed"]
            removed_text = "—" if key == "dense" else (", ".join(map(str, removed)) or "none")
            correct = row["passkey_correct"]
            label = row["label"] + (f" (= {LABEL_OF[row['same_as']]})" if "same_as" in row else "")
            if title != reports[0][0] and key == "dense":
                continue  # the same dense row as above
            lines.append(
                f"| {title} | {label} | {row['layers']} | {removed_text} | {row['params'] / 1e6:.1f} M | "
                f"{row['kv_bytes_per_token'] / 1024:.1f} KiB | {row['perplexity']:.2f} | "
                f"x{row['perplexity_ratio']:.2f} | {sum(correct)}/{len(correct)} | "
                f"{row['prefill_cpu_seconds']:.2f} | {row['prefill_cpu_seconds_saved']:.0%} |")
    return "\n".join(lines)


def write_readme(markdown: str, readme: Path = ROOT / "README.md") -> None:
    start, end = "<!-- laco-results:start -->", "<!-- laco-results:end -->"
    text = readme.read_text()
    head, rest = text.split(start, 1)
    readme.write_text(f"{head}{start}\n{markdown}\n{end}{rest.split(end, 1)[1]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 passkey cases, 4 windows, 1024-token prefill")
    parser.add_argument("--repeats", type=int, default=2, help="timed prefills per model (best counts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time ratios are stable)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--readme", action="store_true", help="also put the table into README.md (between its "
                                                               "laco-results markers)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model("embedded", device="auto", dtype="float32")
    device = lm.device.split(":")[0]
    output = args.output or RESULTS / f"bench_laco_{device}.json"
    sizes = dict(windows=4, passkey_cases=2, prefill_tokens=1024) if args.quick else dict(
        windows=8, passkey_cases=5, passkey_tokens=1024, prefill_tokens=2048)
    probe = make_probe(lm.tokenizer, **sizes)
    texts = calibration_texts(CALIBRATION_SENTENCES)
    began = time.perf_counter()
    defaults = {k: v for k, v in DEFAULTS.items() if k != "H"}
    print(f"default settings {defaults}, both variants", flush=True)
    main_report = run(lm, texts, probe, args.repeats, ("paper", "notebook"), True, **defaults)
    print(f"wider window {WIDER}, both variants", flush=True)
    wide = {**defaults, **WIDER}
    wide_report = run(lm, texts, probe, args.repeats, ("paper", "notebook"), False,
                      dense=main_report["models"]["dense"], **wide)
    reports = [(f"C={defaults['C']} I={defaults['I']} T={defaults['T']} (defaults)", main_report),
               (f"C={wide['C']} I={wide['I']} T={wide['T']}", wide_report)]
    markdown = table(reports)
    result = {"model": lm.name, "device": lm.device, "dtype": lm.dtype, "torch_threads": torch.get_num_threads(),
              "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
              "seconds": time.perf_counter() - began, "probe": probe.to_dict(), "paper": PAPER,
              "runs": {"defaults": main_report, "wider": wide_report}, "settings": {"defaults": defaults,
                                                                                     "wider": wide},
              "markdown": markdown}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1))
    print(markdown)
    if args.readme:
        write_readme(markdown)
    print(f"wrote {output} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
