"""95% intervals for the evaluation's small samples (12 cases, not 12,000).

- Passkey accuracy is k successes out of n cases: the Wilson score interval, which stays
  inside [0, 1] and is not degenerate at 0/n or n/n (the normal "p +- 1.96 se" interval
  gives 0-0% for 0/12, claiming certainty from twelve cases).
- A mean of per-case values (the paired NLL difference to the full cache, the retention
  of the needle): Student's t interval, mean +- t(0.975, n-1) s / sqrt(n).

No scipy: the t quantiles for 1-30 degrees of freedom are the printed table's values and
beyond that a Cornish-Fisher expansion around the normal quantile (within 1e-4 there).
"""

from __future__ import annotations

import math
from statistics import mean, stdev

Z_975 = 1.959963984540054  # the normal distribution's 97.5% quantile

# t(0.975, df) for df = 1..30 (two-sided 95%), as printed in statistics tables.
T_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


def t_quantile_975(df: int) -> float:
    """Student's t 97.5% quantile with ``df`` degrees of freedom (two-sided 95%)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1 (got {df})")
    if df <= len(T_975):
        return T_975[df - 1]
    z, v = Z_975, float(df)  # Cornish-Fisher: the normal quantile plus powers of 1/df
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))


def wilson_interval(successes: int, n: int, z: float = Z_975) -> tuple[float, float]:
    """Wilson score interval for a proportion of ``successes`` out of ``n`` (95% by default)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1 (got {successes}/{n})")
    p = successes / n
    scale = 1 + z * z / n
    center = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at 0/n and n/n the bound is exactly 0 or 1 (rounding would leave 1e-17)
    return (0.0 if successes == 0 else center - half), (1.0 if successes == n else center + half)


def mean_interval(values) -> dict | None:
    """Mean of ``values`` with its 95% t interval: {mean, low, high, half, n}; None for no
    values; low/high/half None for one value (no spread to estimate)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    m = mean(values)
    if len(values) < 2:
        return {"mean": m, "low": None, "high": None, "half": None, "n": 1}
    half = t_quantile_975(len(values) - 1) * stdev(values) / math.sqrt(len(values))
    return {"mean": m, "low": m - half, "high": m + half, "half": half, "n": len(values)}


def paired_difference_interval(both: int, only_first: int, only_second: int, neither: int,
                               z: float = Z_975) -> tuple[float, float, float]:
    """Difference of two proportions measured on the same cases (first minus second) with
    Newcombe's hybrid score interval for paired data (Newcombe 1998, method 10): the Wilson
    intervals of both proportions, combined with the phi correlation of the pairs, its
    numerator ad - bc shrunk by n/2 towards zero when positive (Newcombe's correction, as in
    Altman et al., *Statistics with Confidence*, 2000). Returns (difference, low, high)."""
    n = both + only_first + only_second + neither
    if n < 1 or min(both, only_first, only_second, neither) < 0:
        raise ValueError(f"need non-negative pair counts and at least one case (got {both}, {only_first}, "
                         f"{only_second}, {neither})")
    p1, p2 = (both + only_first) / n, (both + only_second) / n
    l1, u1 = wilson_interval(both + only_first, n, z)
    l2, u2 = wilson_interval(both + only_second, n, z)
    denominator = (both + only_first) * (only_second + neither) * (both + only_second) * (only_first + neither)
    numerator = both * neither - only_first * only_second
    numerator = max(0.0, numerator - n / 2) if numerator > 0 else numerator
    phi = 0.0 if denominator == 0 else numerator / math.sqrt(denominator)
    difference = p1 - p2
    below = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    above = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return difference, max(-1.0, difference - below), min(1.0, difference + above)
