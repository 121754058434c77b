"""Nested cancel scopes: an inner scope (a job started inside a job, an evaluation cell inside
a run) hands the thread back to the outer scope's flag when it ends, so Stop on the outer job
still stops it; and flags stay per thread."""

from __future__ import annotations

import threading

import pytest

from memstep.cancel import CancelFlag, Cancelled, cancel_scope, checkpoint, current_flag


def test_an_inner_scope_gives_the_outer_flag_back():
    outer, inner = CancelFlag(), CancelFlag()
    with cancel_scope(outer):
        with cancel_scope(inner):
            assert current_flag() is inner
            outer.cancel("outer stop")
            checkpoint()  # the inner job reads its own flag only
        assert current_flag() is outer
        with pytest.raises(Cancelled, match="outer stop"):
            checkpoint()  # back in the outer job: its Stop applies
    assert current_flag() is None
    checkpoint()


def test_an_inner_scope_that_was_cancelled_leaves_the_outer_job_running():
    outer, inner = CancelFlag(), CancelFlag()
    with cancel_scope(outer):
        with pytest.raises(Cancelled, match="inner stop"), cancel_scope(inner):
            inner.cancel("inner stop")
            checkpoint()
        assert current_flag() is outer
        checkpoint()  # the outer flag is not set
        with cancel_scope(inner), cancel_scope(CancelFlag()):  # three deep, unwound in order
            pass
        assert current_flag() is outer


def test_a_scope_in_another_thread_does_not_touch_this_ones():
    mine, theirs = CancelFlag(), CancelFlag()
    seen = []

    def other():
        with cancel_scope(theirs):
            seen.append(current_flag())
        seen.append(current_flag())

    with cancel_scope(mine):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert current_flag() is mine
    assert seen == [theirs, None]
