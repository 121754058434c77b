"""Square growth's order of operations, on a case worked by hand where the two orders differ.

The reference (IMDC's MemSizeScheduler) computes the square budget as
int(i**2 * ((M - a) / (n - 1)**2) + a): the division first, in floats. With M = 195, n = 27,
a = floor(195 / 27) = 7 and i = 13 the exact value is 169 * 188 / 676 + 7 = 47 + 7 = 54, but
188 / 676 = 0.27810650887573962... is rounded down in binary, so 169 times it is
46.99999999999999 and int() gives 46: the reference's budget is 46 + 7 = 53. Multiplying first
(169 * 188 = 31772, / 676 = 47.0 exactly) gives 54.
"""

from __future__ import annotations

from memstep.schedules import growth_budget, growth_budgets, make_schedule


def test_square_growth_divides_first_as_the_reference_does():
    assert growth_budget(195, 27, 13, "square") == 53
    assert growth_budget(195, 27, 13, "square", rounding="divide-first") == 53
    assert growth_budget(195, 27, 13, "square", rounding="multiply-first") == 54
    # the whole curve: only step 13 tells the orders apart here
    divide, multiply = growth_budgets(195, 27, "square"), growth_budgets(195, 27, "square", "multiply-first")
    assert [i for i, (x, y) in enumerate(zip(divide, multiply)) if x != y] == [13]
    assert divide[0] == 7 and divide[-1] == 195  # a, then M at the last step


def test_the_im_schedule_carries_the_reference_rounding():
    # 27 chunks of 10 tokens: the IM budget after step 13 is the square curve's 53
    schedule = make_schedule("im", 270, 10, 195, growth="square")
    assert schedule.steps == 27 and schedule.memory_sizes[13] == 53
    assert make_schedule("im", 270, 10, 195, growth="square", rounding="multiply-first").memory_sizes[13] == 54
