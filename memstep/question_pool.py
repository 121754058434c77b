"""How a question-aware score spreads the question's attention over neighbouring keys.

Kept free of torch so the command line can check the setting before any model loads."""

from __future__ import annotations

from memstep.errors import MemstepError

QUESTION_POOL = "max:15"  # each key takes the question attention of its 15 neighbours (max), see question_mix
QUESTION_POOLS = ("max", "mean", "none")


def parse_question_pool(pool: str) -> tuple[str, int]:
    """'max:15', 'mean:5' or 'none': how a key's question attention takes its neighbours'."""
    kind, _, width = str(pool).strip().partition(":")
    if kind == "none" and not width:
        return "none", 1
    if kind in QUESTION_POOLS[:2] and width.isdigit() and int(width) % 2 == 1 and 1 <= int(width) <= 255:
        return kind, int(width)
    raise MemstepError(f"question pool '{pool}' is not one of max:N, mean:N (N odd, 1-255) or none")
