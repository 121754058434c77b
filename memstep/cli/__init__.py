"""`memstep ...`: one module per verb (schedule, run, plan, eval, compress) and the shared
argument types and error path in ``common``.

Every error a user can cause ends the process with exit code 2 and one readable line.
Building the parser imports no torch: `memstep schedule` and `memstep plan` answer at once.
"""

from __future__ import annotations

import argparse
import sys

from memstep.cli import compress, plan, run, schedule
from memstep.cli import eval as evaluate  # the module is named for its verb; keep the builtin unshadowed
from memstep.cli.common import Parser, check_text_arguments, run_command

VERBS = (schedule, run, plan, evaluate, compress)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="memstep", description="Chunked long-context prefill under a memory budget.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for verb in VERBS:
        verb.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    def parse_and_run() -> int:
        args = build_parser().parse_args(argv)
        check_text_arguments(args)  # before any command's work: nothing loads for a question it cannot read
        return args.func(args)

    return run_command(parse_and_run)


if __name__ == "__main__":
    sys.exit(main())
