"""How a question-aware score spreads the question's attention over neighbouring keys.

Kept free of torch so the command line can check the setting before any model loads."""

from __future__ import annotations

import re
from functools import lru_cache

from memstep.errors import MemstepError

# memstep's default: each key is ranked by the question's attention alone (QUESTION_WEIGHT), taking the
# strongest of itself and its 7 neighbours on each side (SnapKV's max-pool kernel), so a kept fact keeps
# the words it is read with; the kept tokens read at shared positions (presets.resolve_rope), one apart
# as the model was trained. Chosen on the development split (docs/question-aware.md, "Dev ablation").
QUESTION_POOL = "max:15"
QUESTION_WEIGHT = 1.0  # the question's share of a question-aware score (engine.question_mix)
# the recipe that was the default until 2026-12-07, by name (--question-pool tuned): built rule by rule
# on the development split, it takes the scorer's vote at TUNED_WEIGHT and reads compact positions from
# TUNED_SHARED_BELOW entries per KV head up; its dated history is in docs/question-aware.md
TUNED = "tuned"
TUNED_POOL = "follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256"
TUNED_WEIGHT = 0.75
TUNED_SHARED_BELOW = 256
# the engine's earlier defaults, newest first, each run at EARLIER_WEIGHT: results that ran at one stand in for it
EARLIER_POOLS = (TUNED_POOL, "follow:15+fade:0.7@256/8+heads@256+last<256", "follow:15+fade:0.7@256/8+heads@256",
                 "follow:15+fade:0.7@256+heads@256", "follow:15+carry+heads@256", "follow:15+carry", "follow:15",
                 "max:15")
EARLIER_WEIGHT = 0.75
# pools the tuned recipe's cells were run under by name before it became the default
RAN_AS = ("follow:15+fade:0.7+heads@256",)


def named_pool(pool: str | None) -> str:
    """A pool as the engine reads it: the default for None, the tuned recipe for its name."""
    if pool is None:
        return QUESTION_POOL
    return TUNED_POOL if str(pool).strip() == TUNED else str(pool).strip()


def default_weight(pool: str | None) -> float:
    """The question's share a pool runs at unless one is given: the tuned recipe's own, else the default's."""
    return TUNED_WEIGHT if named_pool(pool) == TUNED_POOL else QUESTION_WEIGHT


def shared_below(pool: str | None) -> int | None:
    """Below how many kept entries per KV head a question-aware memory under ``pool`` reads at shared
    positions when asked for auto positions: the tuned recipe's TUNED_SHARED_BELOW, else always (None)."""
    return TUNED_SHARED_BELOW if named_pool(pool) == TUNED_POOL else None


QUESTION_POOLS = ("max", "mean", "follow", "none")


CARRY = "+carry"  # a pool's suffix: an entry keeps the strongest question share it had since it was read
# +fade:F: +carry with each held share worth F (0 < F < 1) of itself one step on, so an entry's old
# peak counts less the longer ago it was (a memory of the best shares ever seen raises the bar a
# late fact must clear, step by step); /K: only the votes already carried through K cuts fade (a
# fact keeps its full vote for K steps after it was read; an old peak still falls back after that)
FADE = "+fade"
# +fade:F and +heads read @N and /X alike: @N, the whole rule in steps that keep N or more entries
# per KV head besides the sinks (1 to AT_MOST); /X, the milder rule everywhere else (below N, or in
# every step without @N); @N without /X: nothing below N. A small memory needs the full carry to hold
# a fact over many cuts, and every slot for the head's own picks.
AT_MOST = 1_000_000
_AT = r"(?:@(\d{1,7}))?"
_SHARE = r"(0\.\d*[1-9]\d*)"  # a number strictly between 0 and 1
_CARRY = re.compile(r"\+(carry|fade:" + _SHARE + _AT + r"(?:/(\d{1,7}))?)$")


def _at(digits: str | None) -> int | None:
    """The N of an @N suffix, or the K of a /K (0 without one); None outside 1 to AT_MOST."""
    if digits is None:
        return 0
    return int(digits) if 1 <= int(digits) <= AT_MOST else None


# the engine reads a pool's rules in every layer of every cut: each split is parsed once per pool string
@lru_cache(maxsize=64)
def _split_carry(text: str) -> tuple[str, str | None, float, int, int]:
    """``text`` (no +heads) without its carry suffix, the carry's kind, how much of a held share
    is left one step on (1 but for +fade:F), from how many kept entries per head every carried
    vote fades (the @N of +fade:F@N; 0 without) and through how many cuts a vote must have been
    carried to fade elsewhere (the /K; 0 without)."""
    found = _CARRY.search(text)
    if not found or _at(found.group(3)) is None or _at(found.group(4)) is None:
        return text, None, 1.0, 0, 0
    kind = found.group(1).partition(":")[0]
    fade = float(found.group(2)) if found.group(2) else 1.0
    return text[:found.start()], kind, fade, _at(found.group(3)), _at(found.group(4))


# a last suffix: a key takes the strongest share any KV head of the layer gives its position, so what
# the question finds through one head stays in every head (the scorer's part stays each head's own);
# /W: the larger of its own head's share and W (0 < W < 1) times that strongest one (the others'
# finds weigh less than the head's own); @N as for +fade
HEADS = "+heads"
_HEADS = re.compile(r"\+heads" + _AT + r"(?:/" + _SHARE + ")?$")


# after +heads (or in its place), before +last: +lend:C, in a cut where +heads does not share in full,
# a KV head whose question share is spread thin takes, as under +heads, the strongest share any head of
# its layer gives each position; spread thin: its top picks (an eighth of the entries it keeps) hold
# less than C (0 < C < 1) times what the most focused head's top picks hold. A head that found what the
# question asks for keeps its own ranking; one that found nothing in particular holds what another found
LEND = "+lend"
_LEND = re.compile(r"\+lend:" + _SHARE + "$")
LEND_TOP = 8  # a head's top picks: 1/8 of the entries it keeps besides the sinks (at least one)


# after +lend (or in its place), before +last: +spans:KxL<N, in the prefill's last cut where it keeps fewer
# than N entries per KV head besides the sinks (<N left out: whatever it keeps), each layer's K strongest
# spans of L positions (counted from the first position after the sinks, as --span fixedL) by the
# question's vote summed over the layer's KV heads stay in every head, ahead of the head's own picks,
# which fill the rest of its budget: a fact several heads each give a little, kept as a layer-wide piece
# (as ChunkKV keeps them). Only in the last cut: after the last chunk no later fact needs those slots.
# +spans:Kxsentence: the K strongest sentences instead (a sentence ends after a token that ends in . ! ?
# or a line break, and one longer than 48 tokens is split, as --span sentence)
SPANS = "+spans"
SENTENCE = "sentence"
MAX_SPAN_LENGTH = 512  # positions in one span of +spans:KxL (as --span's longest)
_SPANS = re.compile(r"\+spans:(\d{1,3})x(\d{1,3}|" + SENTENCE + r")(?:<(\d{1,7}))?$")


@lru_cache(maxsize=64)
def _split_spans(pool: str) -> tuple[str, tuple[int, int | str] | None, int]:
    """``pool`` without its +spans (and +last) suffix, its (K, L) (L "sentence" for sentences; None
    without +spans, or a malformed one, which parse_question_pool refuses) and below how many kept
    entries per head it applies (AT_MOST + 1 without <N)."""
    text = _split_last(pool)[0]
    found = _SPANS.search(text)
    if not found:
        return text, None, 0
    count = int(found.group(1))
    length = found.group(2) if found.group(2) == SENTENCE else int(found.group(2))
    below = _at(found.group(3)) if found.group(3) else AT_MOST + 1
    if count < 1 or (length != SENTENCE and not 1 <= length <= MAX_SPAN_LENGTH) or below is None:
        return text, None, 0
    return text[:found.start()], (count, length), below


def spans_need_text(pool: str) -> bool:
    """Whether ``pool`` shares sentences (+spans:Kxsentence): the engine needs the text's sentence breaks."""
    spans = _split_spans(pool)[1]
    return spans is not None and spans[1] == SENTENCE


def spans_at(pool: str, budget: int) -> tuple[int, int | str] | None:
    """The (K, L) of ``pool``'s +spans:KxL if the prefill's last cut keeps ``budget`` entries per head
    besides the sinks, or None: no +spans, or from the N of +spans:KxL<N up."""
    _, spans, below = _split_spans(pool)
    return spans if spans is not None and budget < below else None


@lru_cache(maxsize=64)
def _split_lend(pool: str) -> tuple[str, float | None]:
    """``pool`` without its +lend:C (and +spans, +last) suffix, and the C (None without +lend:C)."""
    text = _split_spans(pool)[0]
    found = _LEND.search(text)
    return (text[:found.start()], float(found.group(1))) if found else (text, None)


def lend_at(pool: str, budget: int) -> float | None:
    """The C of ``pool``'s +lend:C in a step that keeps ``budget`` entries per head besides the sinks,
    or None: no +lend, or +heads shares in full there (every head takes the strongest share anyway)."""
    spread = _split_lend(pool)[1]
    return None if spread is None or heads_at(pool, budget) == 1.0 else spread


# the very last suffix: in the prefill's last cut the question's share weighs W against the scorer's
# (+last: W = 1, the question alone) in place of the question weight. The scorer's part keeps what
# the chunks read next will need; after the last chunk only the question is left to serve. <N: only
# in a cut that keeps fewer than N entries per KV head besides the sinks
LAST = "+last"
_LAST = re.compile(r"\+last(?::(0\.\d*[1-9]\d*|1))?(?:<(\d{1,7}))?$")


@lru_cache(maxsize=64)
def _split_last(pool: str) -> tuple[str, float | None, int]:
    """``pool`` without its +last suffix, the question's weight in the last cut (None without +last)
    and below how many kept entries per head it applies (AT_MOST + 1 without <N)."""
    text = str(pool).strip()
    found = _LAST.search(text)
    below = _at(found.group(2)) if found and found.group(2) else AT_MOST + 1
    if not found or below is None:
        return text, None, 0
    return text[:found.start()], float(found.group(1) or 1), below


def last_at(pool: str, budget: int) -> float | None:
    """What the question's share weighs in the prefill's last cut under ``pool``, when that cut keeps
    ``budget`` entries per head besides the sinks: W for +last:W, 1 for +last, None without +last or
    from the N of +last<N up (the question weight, as in every other cut)."""
    _, weight, below = _split_last(pool)
    return weight if weight is not None and budget < below else None


@lru_cache(maxsize=64)
def _split_heads(pool: str) -> tuple[str, int | None, float]:
    """``pool`` without its +heads (and +lend, +last) suffix, from how many kept entries per head it
    shares in full (0: always, or without @N; None: no +heads, or a malformed one, which
    parse_question_pool refuses), and what the strongest share weighs elsewhere (the W of /W; 0 without)."""
    text = _split_lend(pool)[0]
    found = _HEADS.search(text)
    start = _at(found.group(1)) if found else None
    if start is None:
        return text, None, 0.0
    return text[:found.start()], start, float(found.group(2)) if found.group(2) else 0.0


def heads_from(pool: str) -> int | None:
    """The smallest number of kept entries per KV head (sinks not counted) from which ``pool``
    shares the question's vote between a layer's heads in full: 0 for +heads, N for +heads@N, None
    without +heads."""
    return _split_heads(pool)[1]


def heads_at(pool: str, budget: int) -> float | None:
    """What the strongest share of a layer's heads weighs against a head's own in a step that keeps
    ``budget`` entries per head besides the sinks: 1 (shared in full), W (+heads/W, or +heads@N/W
    below N), or None (no sharing)."""
    _, start, weight = _split_heads(pool)
    if start is None:
        return None
    if weight and not start:
        return weight
    return 1.0 if budget >= start else (weight or None)


def fade_at(pool: str, budget: int) -> int | None:
    """Through how many cuts a carried vote must have been carried to fade in a step that keeps
    ``budget`` entries per head besides the sinks: 0 (every carried vote fades), K (+fade:F/K, or
    +fade:F@N/K below N), or None (none fades)."""
    _, kind, _, start, after = _split_carry(_unshared(pool))
    if kind != "fade":
        return None
    if after and not start:
        return after
    return 0 if budget >= start else (after or None)


def before_last_cut(pool: str) -> str:
    """``pool`` without the rules of the prefill's last cut alone (+spans and +last): what it runs in every
    cut before the last."""
    return _split_spans(pool)[0]


def pool_at(pool: str, budget: int) -> str:
    """What ``pool`` runs in a step that keeps ``budget`` entries per head besides the sinks, without
    its @N: +heads@N/W reads as +heads from N up and as +heads/W below (no +heads without /W);
    +fade:F@N/K as +fade:F from N up and as +fade:F/K below (+carry without /K)."""
    base = _unshared(pool)
    text, kind, fade, _, _ = _split_carry(base)
    if kind == "fade":
        after = fade_at(pool, budget)
        base = text + (CARRY if after is None else f"{FADE}:{fade:g}" + (f"/{after}" if after else ""))
    weight = heads_at(pool, budget)
    if weight is not None:
        base += HEADS + (f"/{weight:g}" if weight < 1 else "")
    spread = lend_at(pool, budget)
    if spread is not None:
        base += f"{LEND}:{spread:g}"
    spans = spans_at(pool, budget)
    if spans is not None:
        base += f"{SPANS}:{spans[0]}x{spans[1]}"
    last = last_at(pool, budget)
    return base if last is None else base + LAST + (f":{last:g}" if last < 1 else "")


def _unshared(pool: str) -> str:
    return _split_heads(pool)[0]


def carry_kind(pool: str) -> str | None:
    """How ``pool`` carries the question's vote from step to step: "carry" (``follow:15+carry``),
    "fade" (``follow:15+fade:0.7``) or None."""
    return _split_carry(_unshared(pool))[1]


def carry_fade(pool: str) -> tuple[float, int]:
    """How much of a carried share is left one step on (F for ``+fade:F``, else 1), and from how many
    kept entries per head besides the sinks every carried vote fades (N for ``+fade:F@N``, else 0)."""
    return _split_carry(_unshared(pool))[2:4]


def parse_question_pool(pool: str) -> tuple[str, int]:
    """'max:15', 'mean:5', 'follow:15' or 'none': how a key's question attention takes its
    neighbours'. max and mean are centred on the key (N odd); follow:N gives each key the
    strongest attention among itself and the N - 1 keys before it: the question looks at what
    a fact is about ("San Francisco", "the passkey"), and the fact follows those words.
    Any of them + '+carry': a memory entry's question share is the strongest it has had in any
    step since it was read, so a fact the question looked at once is not worn away by the many
    cuts of a long document (see ChunkedPrefill); + '+fade:F': +carry with a held share worth F of itself one
    step on ('+fade:F/K': only the shares already carried through K cuts). Then '+heads': each key
    takes the strongest share any KV head of its layer gives its position ('+heads/W': the larger of
    its own and W times that). '@N' after +fade:F or +heads: the rule in steps that keep N or more
    entries per head (sinks not counted), and its /K or /W form, or nothing, below. Then '+lend:C':
    where +heads does not share in full, a head whose top picks hold less than C times the share the
    layer's most focused head's top picks hold takes the strongest share as under +heads. Then
    '+spans:KxL': in the prefill's last cut each layer's K spans of L positions with the most question
    share summed over its heads stay in every head ('+spans:Kxsentence': its K sentences; '+spans:KxL<N':
    where that cut keeps fewer than N per head). A very last
    '+last': the prefill's last cut ranks by the question's share alone ('+last:W': at weight W;
    '+last<N': only where that cut keeps fewer than N entries per head)."""
    pool = named_pool(pool)
    if _split_last(pool)[1] is None and LAST in str(pool):
        raise MemstepError(f"question pool '{pool}': +last comes at the very end, as +last or +last:W (0 < W <= 1), "
                           "then <N (N from 1) or nothing: follow:15+fade:0.7@256/8+heads@256+last<256")
    if _split_spans(pool)[1] is None and SPANS in str(pool):
        raise MemstepError(f"question pool '{pool}': +spans:KxL comes after +lend (or in its place) and before +last, "
                           f"K spans from 1 of L positions (1 to {MAX_SPAN_LENGTH}) or of a sentence (Kxsentence), "
                           "then <N (N from 1) or nothing: "
                           "follow:15+fade:0.7@256/8+heads@256+lend:0.75+spans:6x20<256+last<256")
    if _split_lend(pool)[1] is None and LEND in str(pool):
        raise MemstepError(f"question pool '{pool}': +lend:C comes after +heads (or in its place) and before +spans "
                           "and +last, with 0 < C < 1: follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256")
    text, start, _ = _split_heads(pool)
    if start is None and HEADS in str(pool):
        raise MemstepError(f"question pool '{pool}': +heads takes nothing after it but @N (N from 1), /W (0 < W < 1) or both: "
                           "follow:15+fade:0.7@256/8+heads@256")
    kind, _, width = _split_carry(text)[0].partition(":")
    if kind == "none" and not width:
        return "none", 1
    if kind in ("max", "mean") and width.isdigit() and int(width) % 2 == 1 and 1 <= int(width) <= 255:
        return kind, int(width)
    if kind == "follow" and width.isdigit() and 1 <= int(width) <= 255:
        return kind, int(width)
    raise MemstepError(f"question pool '{pool}' is not one of max:N, mean:N (N odd, 1-255), follow:N (1-255) or "
                      "none, optionally followed by +carry or +fade:F[@N][/K] (0 < F < 1), then "
                      "+heads[@N][/W], then +lend:C, then +spans:KxL[<N] (L a number or sentence), then +last[:W][<N]")
