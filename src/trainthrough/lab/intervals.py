"""95% confidence intervals for suite reports: a mean, and a ratio of paired means.

Rework is measured over a handful of seeds (10 in the SCAR suite), so a report that
prints only means cannot tell a 10-point gap between strategies from sampling noise.

- **Mean rework**: Student's t interval, ``mean ± t(0.975, n-1) * sd / sqrt(n)``. With
  n = 10 it is the standard choice; a percentile bootstrap is known to come out too
  narrow at that size, and rework per seed is a count spread around its mean with no
  heavy tail to speak of.
- **Reduction** ``1 - mean(a) / mean(b)`` of strategy ``a`` against the baseline
  ``b``, *paired by seed* (the same seed loses the same shards at the same iteration
  and has the same failure-free twin, so the two reworks are correlated): Fieller's
  interval for the ratio of two means. It is the set of ratios ``rho`` for which the
  paired differences ``a_i - rho * b_i`` have a mean the t test cannot tell from 0;
  it needs no resampling (deterministic, no seed of its own), reduces to a t interval
  of ``mean(a) / mean(b)`` when the baseline's rework does not vary (checkpoint-restart
  replays exactly the iterations it rolled back), and is **unbounded** when the
  baseline's mean rework is itself not clearly above 0: a reduction against nothing is
  undefined, and the report says so rather than print a number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: two-sided 95% quantiles t(0.975, df) for df = 1..30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1).

    Tabulated up to 30; beyond, the Cornish-Fisher expansion in 1/df (off by < 1e-4).
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


@dataclass(frozen=True)
class Interval:
    """An estimate and its 95% interval; ``lo``/``hi`` are None where unbounded."""

    estimate: float
    lo: float | None
    hi: float | None


def mean_interval(xs: Sequence[float]) -> Interval | None:
    """The mean of ``xs`` with its t interval (None for no values; lo = hi = the value
    for one, since one run says nothing about the spread, shown as such by callers)."""
    if not xs:
        return None
    m = statistics.fmean(xs)
    if len(xs) == 1:
        return Interval(m, None, None)
    half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return Interval(m, m - half, m + half)


def ratio_interval(a: Sequence[float], b: Sequence[float]) -> Interval | None:
    """``mean(a) / mean(b)`` for paired samples, with Fieller's 95% interval.

    Returns None when the pairs are too few (< 2) or ``mean(b)`` is 0. The interval is
    ``(None, None)`` (unbounded) when ``mean(b)`` is not significantly different from 0.
    """
    n = len(a)
    if n != len(b):
        raise ValueError(f"paired samples differ in length: {n} and {len(b)}")
    if n < 2:
        return None
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    if mb == 0:
        return None
    saa = statistics.variance(a) / n
    sbb = statistics.variance(b) / n
    sab = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True)) / (n - 1) / n
    t2 = t975(n - 1) ** 2
    # rho is inside iff (ma - rho mb)^2 <= t2 (saa - 2 rho sab + rho^2 sbb):
    # a quadratic q2 rho^2 - 2 q1 rho + q0 <= 0.
    q2, q1, q0 = mb * mb - t2 * sbb, ma * mb - t2 * sab, ma * ma - t2 * saa
    disc = q1 * q1 - q2 * q0
    if q2 <= 0 or disc < 0:  # mean(b) within noise of 0: no bounded interval
        return Interval(ma / mb, None, None)
    root = math.sqrt(disc)
    return Interval(ma / mb, (q1 - root) / q2, (q1 + root) / q2)


def reduction_interval(a: Sequence[float], b: Sequence[float]) -> Interval | None:
    """``1 - mean(a) / mean(b)`` (paired by position) with its 95% interval."""
    r = ratio_interval(a, b)
    if r is None:
        return None
    return Interval(1.0 - r.estimate, None if r.hi is None else 1.0 - r.hi,
                    None if r.lo is None else 1.0 - r.lo)


def _rework_by_seed(members: Sequence[dict[str, Any]]) -> dict[Any, float]:
    out: dict[Any, float] = {}
    for r in members:
        v = r.get("rework_iterations")
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[r.get("seed")] = float(v)
    return out


def add_intervals(summary: list[dict[str, Any]], groups: Sequence[Sequence[dict[str, Any]]],
                  by: Sequence[str], baseline_strategy: str) -> None:
    """Add ``rework_lo``/``rework_hi`` and ``reduction_lo``/``reduction_hi`` (95%) to each
    summary row (``summary[i]`` aggregates the runs ``groups[i]``).

    The reduction pairs each run with the ``baseline_strategy`` run of the same seed in
    the group with the same other keys; seeds where either has no rework are left out,
    and ``reduction_pairs`` says how many pairs remain. Its point estimate over those
    pairs replaces ``reduction_vs_baseline``, so the estimate and its interval are
    computed from the same runs.
    """
    for s, members in zip(summary, groups, strict=True):
        ci = mean_interval(list(_rework_by_seed(members).values()))
        s["rework_lo"] = ci.lo if ci else None
        s["rework_hi"] = ci.hi if ci else None
        s.update(reduction_lo=None, reduction_hi=None, reduction_pairs=None)
    if "strategy" not in by:
        return
    i = list(by).index("strategy")
    keys = [tuple(s.get(k) for k in by) for s in summary]
    base = {k[:i] + k[i + 1:]: _rework_by_seed(g)
            for k, g in zip(keys, groups, strict=True) if k[i] == baseline_strategy}
    for k, s, members in zip(keys, summary, groups, strict=True):
        b = base.get(k[:i] + k[i + 1:])
        if k[i] == baseline_strategy or b is None:
            continue
        a = _rework_by_seed(members)
        seeds = [x for x in a if x in b]
        s["reduction_pairs"] = len(seeds)
        r = reduction_interval([a[x] for x in seeds], [b[x] for x in seeds])
        if r is None or statistics.fmean(b[x] for x in seeds) <= 0:
            s["reduction_vs_baseline"] = None
            continue
        s.update(reduction_vs_baseline=r.estimate, reduction_lo=r.lo, reduction_hi=r.hi)
