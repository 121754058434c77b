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
# the same, counted against an even split of its step's keys (share x keys): a step with fewer keys
# (FM's first, the chunk alone) hands out larger shares, and a plain carry keeps that advantage for good
LIFT = "+lift"


# a last suffix: a key takes the strongest share any KV head of the layer gives its position, so what
# the question finds through one head stays in every head (the scorer's part stays each head's own)
HEADS = "+heads"


def shares_heads(pool: str) -> bool:
    """Whether ``pool`` shares the question's vote between a layer's KV heads (``follow:15+carry+heads``)."""
    return str(pool).strip().endswith(HEADS)


def _unshared(pool: str) -> str:
    text = str(pool).strip()
    return text[:-len(HEADS)] if text.endswith(HEADS) else text


def carry_kind(pool: str) -> str | None:
    """How ``pool`` carries the question's vote from step to step: "carry" (``follow:15+carry``),
    "lift" (``follow:15+lift``) or None."""
    text = _unshared(pool)
    return "carry" if text.endswith(CARRY) else "lift" if text.endswith(LIFT) else None


def carries(pool: str) -> bool:
    """Whether ``pool`` carries the question's vote from step to step (+carry or +lift)."""
    return carry_kind(pool) is not None


def parse_question_pool(pool: str) -> tuple[str, int]:
    """'max:15', 'mean:5', 'follow:15' or 'none': how a key's question attention takes its
    neighbours'. max and mean are centred on the key (N odd); follow:N gives each key the
    strongest attention among itself and the N - 1 keys before it: the question looks at what
    a fact is about ("San Francisco", "the passkey"), and the fact follows those words.
    Any of them + '+carry': a memory entry's question share is the strongest it has had in any
    step since it was read, so a fact the question looked at once is not worn away by the many
    cuts of a long document (see ChunkedPrefill); + '+lift': the same, each step's share counted
    against an even split of that step's keys. A last '+heads': each key takes the strongest share
    any KV head of its layer gives its position."""
    text = _unshared(pool)
    suffix = {"carry": CARRY, "lift": LIFT}.get(carry_kind(text), "")
    kind, _, width = text[:len(text) - len(suffix)].partition(":")
    if kind == "none" and not width:
        return "none", 1
    if kind in ("max", "mean") and width.isdigit() and int(width) % 2 == 1 and 1 <= int(width) <= 255:
        return kind, int(width)
    if kind == "follow" and width.isdigit() and 1 <= int(width) <= 255:
        return kind, int(width)
    raise MemstepError(f"question pool '{pool}' is not one of max:N, mean:N (N odd, 1-255), follow:N (1-255) or "
                      "none, optionally followed by +carry or +lift, then +heads")
