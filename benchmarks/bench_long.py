"""memstep at the paper's lengths: whole-book prefills from 8k to 128k tokens on this machine.

Each row is one run of the command users type,

    memstep run assets/pride_and_prejudice.txt --schedule S --chunk 1024 --memory 1024 --max-tokens N --json

in its own process (so its peak RSS is its own), measured from outside with wait4: peak RSS
(ru_maxrss), CPU seconds (user + system). A first process with a one-token document gives
what loading the model costs; a row's "above the model" figures subtract it. Next to each
row: the engine's modeled peak (its JSON), the planner's FLOPs and predicted seconds for the
same settings on this machine (a matmul rate and a copy bandwidth measured in this run), and
the fraction of the matmul limit the run reached (FLOPs / (rate x CPU seconds)).

Two fits: log(CPU seconds) against log(tokens) per schedule (IMDC's target: slope <= 1.1,
linear time), and IMDC's peak RSS at the longest length over its peak at the shortest
(target: within 10%, flat memory). The full cache runs up to --full-max tokens (its time
grows as the square of the length, its memory linearly).

    OMP_NUM_THREADS=1 flock /tmp/memstep-heavy.lock .venv/bin/python benchmarks/bench_long.py \\
        --lengths 8192,16384,32768,65536,131072 --docs
    .venv/bin/python benchmarks/bench_long.py --lengths 8192,32768       # quicker
    .venv/bin/python benchmarks/bench_long.py --from-json benchmarks/results/bench_long_cpu.json --docs

--load-weights resident passes `memstep run --load-weights resident` (every page of the memory-mapped
weights read at load): the rows then show what the run itself adds, without the weights' file
pages that a longer document touches for the first time (its own JSON and docs block, `..._resident`).

--model takes any model `memstep run` takes (Gemma 3 270M once it is a model choice); the
JSON is named after it. Rows already in the JSON for the same model, threads and settings
are kept (an interrupted run resumes; --fresh measures everything again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NOVEL = ROOT / "assets" / "pride_and_prejudice.txt"
FIGURE = ROOT / "docs" / "bench_long.png"
SLOPE_TARGET, FLAT_TARGET = 1.1, 0.10
LENGTHS = (8192, 16384, 32768, 65536, 131072)


def run_cli(args: list[str], threads: int) -> dict:
    """One `memstep run` in its own process: its JSON, peak RSS and CPU seconds (from wait4), and
    its resident memory sampled every SAMPLE_SECONDS split into anonymous (what the process
    allocated) and file-backed (the memory-mapped weights and libraries, paged in as touched)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TQDM_DISABLE="1")
    with tempfile.TemporaryDirectory() as tmp:
        out, err_path = Path(tmp) / "run.json", Path(tmp) / "stderr.txt"
        command = [sys.executable, "-m", "memstep", "run", *args, "--quiet", "--output", str(out)]
        began = time.perf_counter()
        sampled = {"anonymous": 0, "file": 0}
        with err_path.open("wb") as err_file:
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err_file, cwd=ROOT, env=env)
            while True:
                pid, status, usage = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    break
                for key, value in resident_parts(child.pid).items():
                    sampled[key] = max(sampled[key], value)
                time.sleep(SAMPLE_SECONDS)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - began
        if child.returncode != 0:
            err = err_path.read_text(errors="replace")
            raise SystemExit(f"`{' '.join(command)}` failed ({child.returncode}):\n{err[-2000:]}")
        result = json.loads(out.read_text())
    return {"command": "memstep run " + " ".join(args), "result": result, "wall_seconds": wall,
            "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss": usage.ru_maxrss * 1024,
            "peak_anonymous_sampled": sampled["anonymous"], "peak_file_sampled": sampled["file"]}


SAMPLE_SECONDS = 0.25


def resident_parts(pid: int) -> dict[str, int]:
    """Resident bytes of a process now: anonymous and file-backed (Linux smaps_rollup; {} elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in text.splitlines()[1:] if line.endswith("kB")}
    if "Rss" not in fields or "Anonymous" not in fields:
        return {}
    return {"anonymous": fields["Anonymous"], "file": fields["Rss"] - fields["Anonymous"]}


def model_baseline(document: Path, model: str | None, threads: int, weights: str = "mapped") -> dict:
    """What a one-token run costs: loading the model, tokenizer and libraries (no prefill to speak of)."""
    args = [str(document), "--schedule", "full", "--max-tokens", "1", "--load-weights", weights] + (
        ["--model", model] if model else [])
    got = run_cli(args, threads)
    return {"peak_rss": got["peak_rss"], "cpu_seconds": got["cpu_seconds"], "command": got["command"],
            "peak_anonymous_sampled": got["peak_anonymous_sampled"], "peak_file_sampled": got["peak_file_sampled"]}


def measure_row(document: Path, model: str | None, tokens: int, schedule: str, size: int, threads: int,
                baseline: dict, machine: dict, shape, weights: str = "mapped") -> dict:
    args = [str(document.relative_to(ROOT) if document.is_relative_to(ROOT) else document),
            "--schedule", schedule, "--max-tokens", str(tokens)]
    if weights != "mapped":
        args += ["--load-weights", weights]
    if schedule != "full":
        args += ["--chunk", str(size), "--memory", str(size)]
    if model:
        args += ["--model", model]
    got = run_cli(args, threads)
    result = got["result"]
    prefill_cpu = got["cpu_seconds"] - baseline["cpu_seconds"]
    steps = result["steps"]
    row = {
        "tokens": tokens, "prefilled": result["tokens"], "schedule": schedule,
        "chunk": None if schedule == "full" else size, "memory": None if schedule == "full" else size,
        "steps": len(steps), "command": got["command"],
        "cpu_seconds": got["cpu_seconds"], "prefill_cpu_seconds": prefill_cpu,
        "prefill_wall_seconds": result["seconds"], "wall_seconds": got["wall_seconds"],
        "cpu_seconds_per_token": prefill_cpu / result["tokens"],
        "peak_rss": got["peak_rss"], "peak_rss_above_model": got["peak_rss"] - baseline["peak_rss"],
        "model_peak_rss": baseline["peak_rss"], "model_cpu_seconds": baseline["cpu_seconds"],
        "peak_anonymous_sampled": got["peak_anonymous_sampled"], "peak_file_sampled": got["peak_file_sampled"],
        "peak_bytes_modeled": result["peak_bytes_modeled"],
        "widest_step_tokens": max(s["memory_before"] + s["chunk_size"] for s in steps),
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
    }
    plan = planned(shape, result["tokens"], schedule, size, machine)
    row.update(flops=plan.flops, planned_seconds=plan.seconds, planned_peak_bytes=plan.peak_bytes,
               limit_fraction=plan.flops / (machine["matmul_flops_per_second"] * prefill_cpu))
    return row


def planned(shape, tokens: int, schedule: str, size: int, machine: dict):
    """The planner's view of the run on this machine (its measured matmul rate and copy bandwidth)."""
    from memstep import planner

    rate, bandwidth = machine["matmul_flops_per_second"], machine["copy_bytes_per_second"]
    here = planner.Gpu("this machine", rate / 1e12, rate / 1e12, rate / 1e12, bandwidth / 1e9, 1 << 40)
    sized = {} if schedule == "full" else {"chunk": size, "memory": size}
    return planner.plan(shape, here, schedule=schedule, tokens=tokens, growth="linear", attention="sdpa",
                        dtype="fp32", efficiency=1.0, bandwidth_efficiency=1.0, device="cpu", **sized)


def measure_machine(model: str | None, threads: int) -> tuple[dict, object]:
    """The model's shape and this machine's matmul rate and copy bandwidth, at the rows' thread count."""
    import torch

    from benchmarks.bench_engine import copy_bandwidth, matmul_rate
    from memstep.engine import model_shape
    from memstep.models import load_model

    torch.set_num_threads(threads)
    lm = load_model(model, "cpu", "auto")
    shape = model_shape(lm.model)
    dtype = next(lm.model.parameters()).dtype
    device = torch.device("cpu")
    machine = {"matmul_flops_per_second": matmul_rate(device, dtype), "copy_bytes_per_second": copy_bandwidth(device),
               "model": lm.name, "dtype": lm.dtype, "trained_positions": getattr(lm.model.config,
                                                                                  "max_position_embeddings", None)}
    del lm
    return machine, shape


def fits(rows: list[dict]) -> dict:
    """Per schedule: the slope of log CPU seconds against log tokens, and the peak RSS's spread."""
    out = {}
    for schedule in sorted({r["schedule"] for r in rows}):
        mine = sorted((r for r in rows if r["schedule"] == schedule), key=lambda r: r["tokens"])
        if len(mine) < 2:
            continue
        x = np.log([r["prefilled"] for r in mine])
        slope = float(np.polyfit(x, np.log([r["prefill_cpu_seconds"] for r in mine]), 1)[0])
        first, last = mine[0], mine[-1]
        out[schedule] = {"tokens": [r["tokens"] for r in mine], "time_slope": slope,
                         "peak_rss_growth": last["peak_rss"] / first["peak_rss"] - 1,
                         "peak_rss_above_model_growth": (last["peak_rss_above_model"] / first["peak_rss_above_model"] - 1
                                                         if first["peak_rss_above_model"] > 0 else None),
                         "peak_anonymous_growth": (last["peak_anonymous_sampled"] / first["peak_anonymous_sampled"] - 1
                                                   if first.get("peak_anonymous_sampled") else None),
                         "from_tokens": first["tokens"], "to_tokens": last["tokens"]}
    return out


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MB"


def _growth(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _split(row: dict) -> str:
    if not row.get("peak_anonymous_sampled"):
        return "-"
    return f"{row['peak_anonymous_sampled'] / 2**20:,.0f} / {row['peak_file_sampled'] / 2**20:,.0f} MB"


def markdown(report: dict) -> str:
    lines = [f"{report['model']} ({report['dtype']}, {report['threads']} thread(s), CPU time; "
             f"{report['trained_positions']} trained positions), {report['document']}, chunk-attention scorer, "
             "compact RoPE positions; each row one `memstep run` process"
             + ("" if report.get("load_weights", "mapped") == "mapped" else
                f" with `--load-weights {report['load_weights']}` (every page of the weights read at load)") + ":", "",
             "| tokens | schedule | c = M | steps | CPU s (prefill) | CPU ms / token | planned s | "
             "peak RSS | above the model | anonymous / file-backed (sampled) | modeled peak | fraction of the limit |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(report["rows"], key=lambda r: (r["tokens"], r["schedule"])):
        size = "-" if r["chunk"] is None else r["chunk"]
        lines.append(f"| {r['tokens']:,} | {r['schedule']} | {size} | {r['steps']} | {r['prefill_cpu_seconds']:,.1f} | "
                     f"{1000 * r['cpu_seconds_per_token']:.2f} | {r['planned_seconds']:,.1f} | {_mb(r['peak_rss'])} | "
                     f"{_mb(r['peak_rss_above_model'])} | {_split(r)} | {_mb(r['peak_bytes_modeled'])} | "
                     f"{r['limit_fraction']:.2f} |")
    later = sorted((r for r in report["rows"] if r.get("measured_at")), key=lambda r: r["measured_at"])
    if later and len(later) < len(report["rows"]):  # a resumed JSON: say which rows the later run added
        rows = ", ".join(f"{r['schedule'].upper() if r['schedule'] != 'full' else 'full'} {r['tokens']:,}"
                         for r in sorted(later, key=lambda r: (r["schedule"], r["tokens"])))
        lines += ["", f"Rows from two runs of the same settings: {rows} were added by a later run "
                      f"({later[0]['measured_at']} to {later[-1]['measured_at']}); the others are from the first."]
    measured = {(r["schedule"], r["tokens"]) for r in report["rows"]}
    missing = [f"{name.upper()} at {', '.join(f'{t:,}' for t in LENGTHS if (name, t) not in measured)}"
               for name in ("imdc", "fm") if any((name, t) not in measured for t in LENGTHS)]
    if missing:
        model = f" --model {report['model_arg']}" if report.get("model_arg") else ""
        if report.get("load_weights", "mapped") != "mapped":
            model += f" --load-weights {report['load_weights']}"
        lines += ["", f"Not measured in this JSON: {'; '.join(missing)} tokens "
                      f"(`OMP_NUM_THREADS=1 python benchmarks/bench_long.py{model}` adds them and keeps these rows)."]
    if report["fits"]:
        lines += ["", "| schedule | lengths | time slope (log-log) | peak RSS growth | above the model | "
                      "anonymous growth (sampled) |", "|---|---|---:|---:|---:|---:|"]
    for name, f in report["fits"].items():
        target = f" (target <= {SLOPE_TARGET})" if name == "imdc" else ""
        flat = f" (target <= {FLAT_TARGET:.0%})" if name == "imdc" else ""
        lines.append(f"| {name} | {f['from_tokens']:,}-{f['to_tokens']:,} | {f['time_slope']:.2f}{target} | "
                     f"{f['peak_rss_growth']:+.1%}{flat} | {_growth(f['peak_rss_above_model_growth'])} | "
                     f"{_growth(f.get('peak_anonymous_growth'))} |")
    lines += ["", f"Loading the model (a one-token run): peak RSS {_mb(report['baseline']['peak_rss'])}, "
              f"{report['baseline']['cpu_seconds']:.1f} CPU s (subtracted above). Matmul rate measured in the same "
              f"run: {report['matmul_flops_per_second'] / 1e9:.1f} GFLOP/s; copy bandwidth "
              f"{report['copy_bytes_per_second'] / 1e9:.1f} GB/s. Modeled peak: the engine's formula "
              "(memory.step_bytes), model weights included."]
    return "\n".join(lines)


def figure(report: dict, path: Path) -> None:
    """Log-log CPU seconds and peak RSS above the model against tokens, one line per schedule."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("CPU seconds of the prefill", "peak RSS above the model"))
    colours = {"imdc": "#1f77b4", "fm": "#ff7f0e", "full": "#7f7f7f"}
    for name in ("imdc", "fm", "full"):
        mine = sorted((r for r in report["rows"] if r["schedule"] == name), key=lambda r: r["tokens"])
        if not mine:
            continue
        x = [r["tokens"] for r in mine]
        slope = report["fits"].get(name, {}).get("time_slope")
        label = name.upper() if name != "full" else "full cache"
        label += f" (slope {slope:.2f})" if slope is not None else ""
        style = dict(color=colours[name])
        fig.add_trace(go.Scatter(x=x, y=[r["prefill_cpu_seconds"] for r in mine], name=label, line=style,
                                 mode="lines+markers", legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[r["peak_rss_above_model"] / 2**20 for r in mine], name=label, line=style,
                                 mode="lines+markers", legendgroup=name, showlegend=False), row=1, col=2)
    first = min(r["tokens"] for r in report["rows"])
    ref = [r for r in report["rows"] if r["schedule"] == "imdc" and r["tokens"] == first]
    if ref:  # what linear time would look like from IMDC's first point
        xs = sorted({r["tokens"] for r in report["rows"]})
        fig.add_trace(go.Scatter(x=xs, y=[ref[0]["prefill_cpu_seconds"] * t / first for t in xs], name="linear",
                                 line=dict(color="#999", dash="dot"), mode="lines"), row=1, col=1)
    fig.update_xaxes(type="log", title_text="tokens")
    fig.update_yaxes(type="log", row=1, col=1, title_text="CPU seconds")
    fig.update_yaxes(type="log", row=1, col=2, title_text="MB")
    fig.update_layout(width=1000, height=440, template="plotly_white", margin=dict(l=60, r=20, t=80, b=50),
                      title=f"{report['model']}, c = M = {report['size']}, {report['threads']} thread(s)")
    fig.write_image(str(path))


def model_slug(model: str | None) -> str | None:
    """None for the embedded model, else the model's name in file-name characters."""
    return None if not model or model == "embedded" else re.sub(r"[^A-Za-z0-9]+", "-", model).strip("-")[-40:]


def output_path(model: str | None, weights: str = "mapped") -> Path:
    slug = model_slug(model)
    name = "bench_long_cpu" + ("" if slug is None else f"_{slug}") + ("" if weights == "mapped" else f"_{weights}")
    return RESULTS / f"{name}.json"


def write_docs(report: dict, command: str, measured: str | None = None) -> None:
    """The table into docs/benchmarks.md and, from two lengths on, the log-log figure under it
    (the embedded model: block bench-long and docs/bench_long.png; another: bench-long-<model>)."""
    from benchmarks.docs_block import write_block

    slug = model_slug(report.get("model_arg"))
    if report.get("load_weights", "mapped") != "mapped":
        slug = f"{slug or 'embedded'}-{report['load_weights']}"
    path = FIGURE if slug is None else FIGURE.with_name(f"bench_long_{slug}.png")
    plotted = len({r["tokens"] for r in report["rows"]}) > 1
    if plotted:
        figure(report, path)
    write_block("bench-long" if slug is None else f"bench-long-{slug}",
                markdown(report) + (f"\n\n![CPU seconds and peak RSS above the model against tokens, "
                                    f"log-log]({path.name})" if plotted else ""),
                command, measured=measured)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="any model `memstep run` takes (default: the embedded one)")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated token counts")
    parser.add_argument("--schedules", default="imdc,fm,full", help="comma-separated: imdc, fm, full")
    parser.add_argument("--size", type=int, default=1024, help="chunk = memory (default 1024)")
    parser.add_argument("--full-max", type=int, default=16384, help="longest full-cache run (0: none)")
    parser.add_argument("--fm-max", type=int, default=None, help="longest FM run (default: every length)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                        help="torch threads of every run (default OMP_NUM_THREADS, else 1)")
    parser.add_argument("--document", type=Path, default=NOVEL)
    parser.add_argument("--load-weights", default="mapped", choices=("mapped", "resident"),
                        help="memstep run --load-weights: mapped (default, paged in as touched) or resident (read at load)")
    parser.add_argument("--output", type=Path, default=None, help="JSON (default benchmarks/results/bench_long_cpu*.json)")
    parser.add_argument("--fresh", action="store_true", help="measure every row again")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/benchmarks.md and the figure")
    parser.add_argument("--from-json", type=Path, default=None, help="measure nothing: tables of this JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.from_json:
        report = json.loads(args.from_json.read_text())
        print(markdown(report))
        if args.docs:
            from benchmarks.docs_block import committed_on

            write_docs(report, f"benchmarks/bench_long.py --from-json {args.from_json} --docs",
                       committed_on(args.from_json))
        return 0
    try:
        lengths = sorted({int(x) for x in args.lengths.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--lengths takes comma-separated integers (got {args.lengths!r})")
    schedules = [s for s in args.schedules.split(",") if s]
    if not lengths or min(lengths) < 1 or set(schedules) - {"imdc", "fm", "full"}:
        parser.error("--lengths must be positive and --schedules one of imdc, fm, full")
    output = args.output or output_path(args.model, args.load_weights)
    settings = {"model_arg": args.model, "threads": args.threads, "size": args.size,
                "document": args.document.name, "load_weights": args.load_weights}
    old = json.loads(output.read_text()) if output.exists() and not args.fresh else None
    if old is not None:
        old.setdefault("load_weights", "mapped")  # JSON written before the option existed
    rows = old["rows"] if old and all(old.get(k) == v for k, v in settings.items()) else []

    machine, shape = measure_machine(args.model, args.threads)
    print(f"matmul {machine['matmul_flops_per_second'] / 1e9:.1f} GFLOP/s", file=sys.stderr)
    baseline = model_baseline(args.document, args.model, args.threads, args.load_weights)
    report = {**settings, **machine, "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "baseline": baseline, "rows": rows, "fits": {}}
    # the shortest first (it sizes the rest), then the longest (the rows the targets compare), then the others
    order = lengths[:1] + lengths[-1:] + lengths[1:-1] if len(lengths) > 1 else lengths
    for tokens in order:
        for schedule in schedules:
            if (schedule == "full" and tokens > args.full_max) or (
                    schedule == "fm" and args.fm_max is not None and tokens > args.fm_max):
                continue
            if any(r["tokens"] == tokens and r["schedule"] == schedule for r in rows):
                continue
            row = measure_row(args.document, args.model, tokens, schedule, args.size, args.threads, baseline,
                              machine, shape, args.load_weights)
            rows.append(row)
            print(f"[{tokens}] {schedule}: {row['prefill_cpu_seconds']:.1f} CPU s, peak RSS {_mb(row['peak_rss'])}",
                  file=sys.stderr)
            report["fits"] = fits(rows)
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(report, indent=1))  # after every row: an interrupted run keeps them
    report["fits"] = fits(rows)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    if args.docs:
        write_docs(report, "benchmarks/bench_long.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"\nwrote {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
