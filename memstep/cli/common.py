"""What every `memstep` verb shares: the parser whose usage errors are one line, argument
types, bounds, output files, and the error path (exit 2 with one readable line)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from contextlib import contextmanager

from memstep.errors import MemstepError
from memstep.outputs import os_reason, shown


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2
        # fail() already says "memstep: error:"; name only the subcommand ("run: ..."), not "memstep" twice
        command = self.prog.partition(" ")[2]
        raise MemstepError(f"{command}: {message}" if command else message)


def ints(text: str) -> list[int]:
    """Comma-separated whole numbers: '2048,8192'."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise MemstepError(f"expected comma-separated whole numbers, got '{text}'") from None
    if not values:
        raise MemstepError("expected at least one number")
    return values


def fractions(text: str) -> list[float]:
    """Comma-separated fractions in [0, 1], or percentages: '0,0.5,1' or '10%,90%'."""
    try:
        values = [float(v.rstrip("%")) / (100 if v.strip().endswith("%") else 1) for v in text.split(",") if v.strip()]
    except ValueError:
        raise MemstepError(f"expected comma-separated depths such as 0,0.5,1 or 10%,90%, got '{text}'") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise MemstepError(f"depths must be between 0 and 1 (or 0% and 100%), got '{text}'")
    return values


def names(text: str) -> list[str]:
    """Comma-separated names, blanks dropped."""
    return [v.strip() for v in text.split(",") if v.strip()]


def at_least(name: str, value, low: int = 1, unit: str = "") -> None:
    """An optional number given on the command line must be ``low`` or more."""
    if value is not None and value < low:
        raise MemstepError(f"{name} must be at least {low}{unit} (got {value})")


# Arguments that name files or folders: the operating system's bytes, whatever their encoding (Python
# carries bytes that are not UTF-8 as lone surrogates, and hands them back to the system unchanged).
PATH_ARGUMENTS = frozenset({"document", "output", "haystacks", "readme", "kvpress_python", "calibration",
                            "calibration_text"})


def check_text_arguments(args) -> None:
    """Every text argument (a question, a model name, a list of settings) is valid UTF-8 text:
    bytes that are not UTF-8, or a lone surrogate, are refused in one line before any work (the
    tokenizer and the JSON output would fail on them after the model loads)."""
    for dest, value in sorted(vars(args).items()):
        if dest in PATH_ARGUMENTS:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(item, str):
                continue
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                option, char = "--" + dest.replace("_", "-"), item[err.start]
                if "\udc80" <= char <= "\udcff":  # how Python carries a byte that is not UTF-8
                    raise MemstepError(f"{option} holds bytes that are not UTF-8 (0x{ord(char) - 0xdc00:02x} at "
                                       f"character {err.start + 1:,}): give it as UTF-8 text") from None
                raise MemstepError(f"{option} holds an unpaired surrogate ({char!r} at character {err.start + 1:,}): "
                                   "give valid Unicode text") from None


def check_output_path(output: str | None, force: bool = False) -> None:
    """An --output file: a new file in an existing folder (an existing one with --force), checked
    before any work."""
    from memstep.outputs import check_new_file

    if output is None:
        if force:
            raise MemstepError("--force needs --output")
        return
    check_new_file(output, force)


def write_output(output: str, text: str, force: bool = False) -> None:
    """The --output file, written whole or not at all (memstep.outputs.write_new_file)."""
    from memstep.outputs import write_new_file

    write_new_file(output, text, force)


def add_force_option(p) -> None:
    p.add_argument("--force", action="store_true",
                   help="replace the model in an existing non-empty --output folder: the folder is swapped whole "
                        "for the new one when it is complete (the old model's files, of any format, go; every other "
                        "file in it is kept; a failure at any point leaves it as it was)")


def output_folder(args, model=None) -> None:
    """A model --output folder (memstep.outputs): checked before anything loads; with the
    loaded ``model``, also that its disk has room for the model's weights."""
    if args.output is None:  # (an empty --output is refused below, before any work)
        if args.force:
            raise MemstepError("--force needs --output")
        return
    from memstep.outputs import check_free_space, check_output_folder

    check_output_folder(args.output, args.force)
    if model is not None:
        check_free_space(args.output, sum(p.numel() * p.element_size() for p in model.parameters()))


def saved_into(args):
    """The block that saves the model: --force lets it write into the existing folder."""
    from memstep.outputs import forced

    return forced(args.output if args.output and args.force else None)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is: what Ctrl+C does (a save in progress removes its
    temporary folder on the way out), then exit 143."""


@contextmanager
def terminate_as_interrupt():
    """Inside this block (main thread only), SIGTERM raises Terminated once; a second SIGTERM
    while that unwinds is ignored, so the cleanup it runs is not cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_command(command) -> int:
    """Run a command (parsing included): a user's error is one line on stderr and exit 2,
    never a traceback."""
    try:
        with terminate_as_interrupt():
            return command()
    except MemstepError as err:
        return fail(err)
    except Terminated:
        print("memstep: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("memstep: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early: no traceback
        _silence_stdout()
        print("memstep: error: the output was closed early (broken pipe)", file=sys.stderr)
        return 2
    except (MemoryError, OverflowError, RecursionError) as err:  # a safety net: inputs are bounded first
        print(f"memstep: error: the request is too large for this machine ({type(err).__name__}): "
              "use smaller sizes", file=sys.stderr)
        return 2
    # Safety nets: the commands check files before the work, but a file can still fail on the
    # way (a name too long, permission denied, the disk full, bytes that are not text).
    except UnicodeError as err:
        return fail(MemstepError(f"a file is not readable text ({type(err).__name__}: "
                                 f"{getattr(err, 'reason', err)}): give a UTF-8 text file"))
    except OSError as err:
        where = f" {shown(err.filename)}" if getattr(err, "filename", None) else ""
        return fail(MemstepError(f"cannot use{where}: {os_reason(err)}"))


MAX_MESSAGE_CHARS = 1000


def fail(err: MemstepError) -> int:
    """One line on stderr, whatever the message holds (a file name may carry newlines or
    control characters: they are shown escaped), and exit code 2."""
    message = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(err))
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 1] + "…"
    print(f"memstep: error: {message}", file=sys.stderr)
    return 2


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's exit-time flush does not raise again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
