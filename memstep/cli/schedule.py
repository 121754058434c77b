"""`memstep schedule`: a schedule's chunk and memory sizes, instantly (no model, no torch)."""

from __future__ import annotations

import json

from memstep.presets import SWITCHES
from memstep.schedules import GROWTHS, REVIEWS, SCHEDULES, check_run_settings, format_table, make_schedule


def add_schedule_options(p, default_schedule="imdc"):
    """--schedule, --chunk, --memory, --growth, --growth-rounding, --review*: shared by
    `schedule` and `run`."""
    p.add_argument("--schedule", default=default_schedule, choices=[s for s in SCHEDULES if s != "custom"],
                   help="fm, im, imdc, full; fim (fixed-incremental: earlier memory never re-scored, each step adds "
                        "its share of M) and local (nothing kept after a step), both as the reference code")
    p.add_argument("--chunk", type=int, default=512, help="chunk size in tokens (default 512)")
    p.add_argument("--memory", type=int, default=512, help="memory budget M in tokens (default 512)")
    p.add_argument("--growth", default="linear", choices=GROWTHS,
                   help="IM/IMDC growth curve; square-sqrt and double-inverse are layer-wise (the lower half "
                        "of the layers follows the first curve, the upper half the second)")
    p.add_argument("--growth-rounding", default=None, choices=SWITCHES["growth_rounding"].choices,
                   help=SWITCHES["growth_rounding"].help + " (default divide-first)")
    p.add_argument("--review", default=None, choices=REVIEWS,
                   help="re-feed chunk ceil(M / c) among the next --review-length chunks, --review-times times, "
                        "placed uniform/exp/early/late (the reference's ReviewScheduler; FM, IM, IMDC)")
    p.add_argument("--review-times", type=int, default=1, help="how many times a review re-feeds (default 1)")
    p.add_argument("--review-length", type=int, default=8, help="the review's window of chunks (default 8)")


def review_of(args) -> tuple[str, int, int] | None:
    return (args.review, args.review_times, args.review_length) if args.review else None

def cmd_schedule(args) -> int:
    check_run_settings(args.schedule, args.tokens, args.chunk, args.memory, args.sinks)  # the app's rule too
    schedule = make_schedule(args.schedule, args.tokens, args.chunk, args.memory, args.growth, layers=args.layers,
                             rounding=args.growth_rounding or "divide-first", review=review_of(args))
    if args.json:
        print(json.dumps(schedule.to_dict()))
    else:
        print(format_table(schedule, args.sinks))
    return 0


def register(sub) -> None:
    p = sub.add_parser("schedule", help="print a schedule's chunk and memory sizes (no model)")
    p.add_argument("--tokens", type=int, required=True)
    add_schedule_options(p)
    p.add_argument("--layers", type=int, default=None,
                   help="the model's layers, for a layer-wise growth (30 for the embedded model)")
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedule)
