"""How a question-aware score spreads the question's attention over neighbouring keys.

Kept free of torch so the command line can check the setting before any model loads."""

from __future__ import annotations

from memstep.errors import MemstepError

# each key takes the strongest question attention of itself and the 14 keys before it (see question_share),
# and a memory entry keeps the strongest it has had in any step (+carry); max:15 (centred) until the public
# needle test showed it cutting answers in two, then follow:15 until the same test at 4,096 tokens showed
# answers worn away over the later cuts (docs/spans-and-niah.md)
QUESTION_POOL = "follow:15+carry"
# the engine's earlier defaults, newest first: results that ran at one stand in for it
EARLIER_POOLS = ("follow:15", "max:15")
QUESTION_POOLS = ("max", "mean", "follow", "none")


CARRY = "+carry"  # a pool's suffix: an entry keeps the strongest question share it had since it was read


def carries(pool: str) -> bool:
    """Whether ``pool`` carries the question's vote from step to step (``follow:15+carry``)."""
    return str(pool).strip().endswith(CARRY)


def parse_question_pool(pool: str) -> tuple[str, int]:
    """'max:15', 'mean:5', 'follow:15' or 'none': how a key's question attention takes its
    neighbours'. max and mean are centred on the key (N odd); follow:N gives each key the
    strongest attention among itself and the N - 1 keys before it: the question looks at what
    a fact is about ("San Francisco", "the passkey"), and the fact follows those words.
    Any of them + '+carry': a memory entry's question share is the strongest it has had in any
    step since it was read, so a fact the question looked at once is not worn away by the many
    cuts of a long document (see ChunkedPrefill)."""
    text = str(pool).strip()
    kind, _, width = (text[:-len(CARRY)] if carries(text) else text).partition(":")
    if kind == "none" and not width:
        return "none", 1
    if kind in ("max", "mean") and width.isdigit() and int(width) % 2 == 1 and 1 <= int(width) <= 255:
        return kind, int(width)
    if kind == "follow" and width.isdigit() and 1 <= int(width) <= 255:
        return kind, int(width)
    raise MemstepError(f"question pool '{pool}' is not one of max:N, mean:N (N odd, 1-255), follow:N (1-255) or "
                      "none, optionally followed by +carry")
