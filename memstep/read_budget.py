"""What reading one document may cost: its work follows the text it yields.

A parser's cost is counted in what it does, not in bytes or pages: a PDF's content-stream tokens
(operators and operands, as pypdf counts them) and XObject draws (each draw of a form charged
its bytes), an HTML page's tags, attributes, entities and '<'. Any document may spend
``work_base`` such steps, and ``work_per_char`` more for each character of text it has yielded
so far; CPU time likewise (``cpu_seconds``, plus ``cpu_per_char``). A document of empty text
objects therefore stops at the base, about a second, while a book yields text at every page and
reads to its end. Reading a text costs a fraction of running the model on it (a 135M model:
milliseconds a token), so a read never costs more than half of a run of what it yields.
Every refusal names the limit it hit.
"""

from __future__ import annotations

import _thread
import dataclasses
import threading
import time

from memstep.errors import MemstepError


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """How much work reading one document may take. ``max_chars`` (None: no cap): extraction stops
    once the text holds this many characters; the others refuse the document, naming the limit.
    The CLI and the app read with the same limits: a document is refused at the same place."""
    max_chars: int | None = None
    max_pages: int = 2000                    # PDF pages read before max_chars is reached
    max_page_content_bytes: int = 1 << 20     # one page's decompressed content stream(s)
    max_content_bytes: int = 64 << 20         # all content decompressed, pages and form draws together
    max_draws: int = 10_000                   # XObject draws (the Do operator), forms inside forms included
    work_base: int = 200_000                  # parsing steps any document may take (about a CPU-second)...
    work_per_char: int = 16                   # ...and this many more for each character of text it yields
    max_pending_chars: int = 1 << 16          # an HTML tag or comment still open after this many characters
    max_raw_chars: int = 4 << 20              # a script or style element's text
    cpu_seconds: float = 2.0                  # CPU any read may take (its process's start aside)...
    cpu_per_char: float = 1e-5                # ...and this much more for each character of text it yields
    cpu_ceiling: float = 60.0                 # the reading process's hard CPU limit when max_chars is None
    memory_bytes: int = 2 << 30               # its address space

    def cpu_for(self, chars: int) -> float:
        """CPU seconds a read that has yielded ``chars`` characters may have taken."""
        return self.cpu_seconds + self.cpu_per_char * chars

    def hard_cpu_seconds(self) -> int:
        """The reading process's CPU limit (RLIMIT_CPU): its start, and the most the text it may yield
        allows (the in-process checks stop a read long before this)."""
        most = self.cpu_ceiling if self.max_chars is None else min(self.cpu_ceiling, self.cpu_for(self.max_chars))
        return int(most) + 2


class OverBudget(BaseException):
    """Raised inside a parser when the read is over a limit: a BaseException, so a parser's own
    ``except Exception`` (pypdf's, around each form) does not swallow it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class WorkBudget:
    """The work a read has done and may still do; ``what`` names its steps in messages."""

    def __init__(self, filename: str, limits: ReadLimits, what: str):
        self.filename, self.limits, self.what = filename, limits, what
        self.units = self.chars = 0
        self._cpu0 = time.thread_time()
        self._lock = threading.Lock()

    def allowed(self) -> int:
        return self.limits.work_base + self.limits.work_per_char * self.chars

    def left(self) -> int:
        return max(0, self.allowed() - self.units)

    def spend(self, units: int) -> None:
        self.units += units
        if self.units > self.allowed():
            raise OverBudget(self.work_message())

    def add_text(self, chars: int) -> None:
        self.chars += chars

    def work_message(self) -> str:
        return (f"{self.filename}: over {self.allowed():,} {self.what} for the {self.chars:,} characters of text it "
                f"yielded (the work limit per document: {self.limits.work_base:,} plus {self.limits.work_per_char} "
                "a character): upload an excerpt or a .txt version")

    def cpu_used(self) -> float:
        return time.thread_time() - self._cpu0

    def check_cpu(self) -> None:
        if self.cpu_used() > self.limits.cpu_for(self.chars):
            raise OverBudget(self.cpu_message())

    def cpu_message(self) -> str:
        return (f"{self.filename}: reading it took over {self.limits.cpu_for(self.chars):.1f} CPU seconds for the "
                f"{self.chars:,} characters of text it yielded (the CPU limit per document: "
                f"{self.limits.cpu_seconds:g} s plus {self.limits.cpu_per_char * 1e6:g} µs a character): upload an "
                "excerpt or a .txt version")


class Watchdog:
    """In the reading process only: every ``interval`` seconds, compare the CPU the read has used with
    what its text allows, and interrupt the main thread when over (a parser's own loops between the
    budget's checks, such as a font's tables on every page, stop there too)."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.budget: WorkBudget | None = None
        self.fired: str | None = None
        self._stop = threading.Event()
        self._main = threading.get_ident()

    def __enter__(self):
        threading.Thread(target=self._watch, name="memstep-read-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def _watch(self) -> None:
        # the CPU the whole process used: the read runs in the main thread, this thread costs ~nothing
        start = time.process_time()
        while not self._stop.wait(self.interval):
            budget = self.budget
            if budget is not None and time.process_time() - start > budget.limits.cpu_for(budget.chars):
                self.fired = budget.cpu_message()
                _thread.interrupt_main()
                return


def refusal(err: OverBudget) -> MemstepError:
    return MemstepError(err.message)
