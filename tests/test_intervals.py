"""95% intervals of the suite reports: t for a mean, Fieller for a paired ratio."""

from __future__ import annotations

import random
import statistics

import pytest

from trainthrough.lab.intervals import (
    add_intervals,
    mean_interval,
    ratio_interval,
    reduction_interval,
    t975,
)


def test_t_quantiles_match_the_table_and_approach_the_normal() -> None:
    assert t975(1) == 12.706 and t975(9) == 2.262 and t975(30) == 2.042
    assert t975(40) == pytest.approx(2.021, abs=1e-3)
    assert t975(120) == pytest.approx(1.980, abs=1e-3)
    assert all(t975(d) > t975(d + 1) for d in range(1, 200))
    with pytest.raises(ValueError):
        t975(0)


def test_mean_interval_is_the_student_t_interval() -> None:
    ci = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert ci is not None
    half = 2.776 * statistics.stdev([1, 2, 3, 4, 5]) / 5 ** 0.5
    assert (ci.estimate, ci.lo, ci.hi) == pytest.approx((3.0, 3 - half, 3 + half))
    one = mean_interval([4.0])
    assert one is not None and one.lo is None and one.hi is None
    assert mean_interval([]) is None


def test_a_constant_baseline_reduces_fieller_to_a_t_interval_of_the_ratio() -> None:
    a = [3.0, 5.0, 4.0, 6.0, 2.0]
    ci = ratio_interval(a, [20.0] * 5)
    t = mean_interval(a)
    assert ci is not None and t is not None and t.lo is not None and t.hi is not None
    assert (ci.estimate, ci.lo, ci.hi) == pytest.approx((t.estimate / 20, t.lo / 20,
                                                         t.hi / 20))
    red = reduction_interval(a, [20.0] * 5)
    assert red is not None and red.lo is not None and red.hi is not None
    assert (red.estimate, red.lo, red.hi) == pytest.approx((1 - 0.2, 1 - t.hi / 20,
                                                            1 - t.lo / 20))


def test_a_baseline_within_noise_of_zero_gives_no_bounded_reduction() -> None:
    ci = reduction_interval([1.0, 0.0, 2.0, -1.0], [3.0, -2.0, 1.0, -1.5])
    assert ci is not None and ci.lo is None and ci.hi is None
    assert ratio_interval([1.0], [2.0]) is None  # one pair: no spread to speak of
    assert ratio_interval([1.0, 2.0], [0.0, 0.0]) is None
    with pytest.raises(ValueError):
        ratio_interval([1.0, 2.0], [1.0])


def test_fieller_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    # Paired, correlated reworks as in the suite: 10 seeds, the baseline ~20 +- 4,
    # the strategy 0.2 of it plus its own noise; the true ratio is 0.2.
    rng = random.Random(5)
    hits = trials = 0
    for _ in range(1500):
        b = [20 + rng.gauss(0, 4) for _ in range(10)]
        a = [0.2 * 20 + 0.5 * (x - 20) + rng.gauss(0, 2) for x in b]
        ci = ratio_interval(a, b)
        assert ci is not None and ci.lo is not None and ci.hi is not None
        trials += 1
        hits += ci.lo <= 0.2 <= ci.hi
    assert 0.93 <= hits / trials <= 0.97, hits / trials


def _row(strategy: str, seed: int, rework: float | None, fraction: str = "50%") -> dict:
    return {"workload": "mf", "fraction": fraction, "strategy": strategy, "seed": seed,
            "rework_iterations": rework}


def test_reductions_pair_runs_by_seed_and_drop_seeds_without_rework() -> None:
    base = [_row("checkpoint-restart", s, r) for s, r in enumerate([20, 22, 18, None])]
    scar = [_row("scar", s, r) for s, r in [(3, 1.0), (2, 3.0), (1, 2.0), (0, 4.0)]]
    groups = [base, scar]
    summary = [{"workload": "mf", "fraction": "50%", "strategy": "checkpoint-restart"},
               {"workload": "mf", "fraction": "50%", "strategy": "scar"}]
    add_intervals(summary, groups, ("workload", "fraction", "strategy"), "checkpoint-restart")
    s = summary[1]
    # seed 3 has no baseline rework: pairs are seeds 0-2, (4, 2, 3) vs (20, 22, 18)
    assert s["reduction_pairs"] == 3
    assert s["reduction_vs_baseline"] == pytest.approx(1 - 9 / 60)
    assert s["reduction_lo"] < s["reduction_vs_baseline"] < s["reduction_hi"]
    assert summary[0]["reduction_lo"] is None  # the baseline itself
    assert summary[0]["rework_lo"] < 20 < summary[0]["rework_hi"]
