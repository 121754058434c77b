"""Every limit of the question-pool grammar, on both sides: the last value accepted and the first refused
(limits from memstep/question_pool.py's docstrings: widths 1-255, max and mean odd, @N and /K from 1 to
AT_MOST, shares strictly between 0 and 1, +last's weight up to 1, spans from 1 of 1-512 positions, <N from 1)."""

from __future__ import annotations

import pytest

from memstep.errors import MemstepError
from memstep.question_pool import (AT_MOST, MAX_SPAN_LENGTH, fade_at, heads_at, last_at, lend_at,
                                   parse_question_pool, spans_at)

# (accepted, refused): each pair straddles one limit
LIMITS = [
    ("follow:255", "follow:256"), ("follow:1", "follow:0"),
    ("max:255", "max:257"), ("max:1", "max:0"), ("max:3", "max:2"),
    ("mean:255", "mean:257"), ("mean:1", "mean:0"), ("mean:5", "mean:4"),
    (f"follow:15+fade:0.7@{AT_MOST}", f"follow:15+fade:0.7@{AT_MOST + 1}"),
    ("follow:15+fade:0.7@1", "follow:15+fade:0.7@0"),
    (f"follow:15+fade:0.7/{AT_MOST}", f"follow:15+fade:0.7/{AT_MOST + 1}"),
    ("follow:15+fade:0.7/1", "follow:15+fade:0.7/0"),
    ("follow:15+fade:0.999", "follow:15+fade:1"), ("follow:15+fade:0.001", "follow:15+fade:0"),
    (f"follow:15+heads@{AT_MOST}", f"follow:15+heads@{AT_MOST + 1}"), ("follow:15+heads@1", "follow:15+heads@0"),
    ("follow:15+heads/0.999", "follow:15+heads/1"), ("follow:15+heads/0.001", "follow:15+heads/0"),
    ("follow:15+lend:0.999", "follow:15+lend:1"), ("follow:15+lend:0.001", "follow:15+lend:0"),
    (f"follow:15+spans:1x{MAX_SPAN_LENGTH}", f"follow:15+spans:1x{MAX_SPAN_LENGTH + 1}"),
    ("follow:15+spans:1x1", "follow:15+spans:1x0"), ("follow:15+spans:1x20", "follow:15+spans:0x20"),
    ("follow:15+spans:1x20<1", "follow:15+spans:1x20<0"),
    (f"follow:15+spans:1x20<{AT_MOST}", f"follow:15+spans:1x20<{AT_MOST + 1}"),
    ("follow:15+last:1", "follow:15+last:1.5"), ("follow:15+last:0.001", "follow:15+last:0"),
    ("follow:15+last<1", "follow:15+last<0"), (f"follow:15+last<{AT_MOST}", f"follow:15+last<{AT_MOST + 1}"),
]


@pytest.mark.parametrize("accepted,refused", LIMITS)
def test_each_limit_on_both_sides(accepted, refused):
    parse_question_pool(accepted)
    with pytest.raises(MemstepError, match="question pool"):
        parse_question_pool(refused)


def test_the_accepted_edges_take_effect():
    """The values at the edges are read as written, not clipped or dropped."""
    assert parse_question_pool("follow:255") == ("follow", 255) and parse_question_pool("max:255") == ("max", 255)
    assert fade_at(f"follow:15+fade:0.7@{AT_MOST}", AT_MOST) == 0 and fade_at(f"follow:15+fade:0.7@{AT_MOST}", 1) is None
    assert fade_at("follow:15+fade:0.7/1", 10) == 1
    assert heads_at("follow:15+heads@1", 1) == 1.0 and heads_at("follow:15+heads@1", 0) is None
    assert lend_at("follow:15+lend:0.999", 10) == 0.999
    assert spans_at(f"follow:15+spans:1x{MAX_SPAN_LENGTH}", 10) == (1, MAX_SPAN_LENGTH)
    assert spans_at("follow:15+spans:1x20<1", 0) == (1, 20) and spans_at("follow:15+spans:1x20<1", 1) is None
    assert last_at("follow:15+last:1", 10) == 1.0 and last_at("follow:15+last<1", 0) == 1.0
    assert last_at("follow:15+last<1", 1) is None
