"""Checking a prediction: run a candidate on the seeded failure trace and compare.

For one candidate of an :class:`~trainthrough.lab.advise.Advice`, at the interval the
advisor chose: one failure-free run (its failure-free overhead against the advisor's
failure-free strategy on the same seed), then one run per seed on the trace itself (``--fail``
with that MTBF; each seed draws other failure times and, as any seed does, other data
order and initial values). Measured time to target is the mean over the seeds that
reached it, on the engine's clock, as the prediction. Used by tests/test_advise.py
(sim) and benchmarks/advise_check.py (sim and Ray).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from trainthrough.config import RunConfig
from trainthrough.lab.advise.advisor import Advice
from trainthrough.lab.runner import run_silent


@dataclass(frozen=True)
class Check:
    """Predicted next to measured, for one candidate."""

    name: str
    interval: int | None
    predicted_steady: float  #: failure-free overhead (fraction)
    #: the strategy's failure-free time to target over the failure-free strategy's - 1,
    #: on the first seed
    measured_steady: float
    #: the same overhead as the trace runs paid it: seconds blocked by saves per
    #: iteration, over the failure-free step time (mean over seeds); on a real engine
    #: this is free of the run-to-run noise a whole failure-free run carries
    measured_blocked: float
    predicted_seconds: float  #: time to target on the trace
    measured_seconds: float | None  #: mean over the seeds that reached the target
    predicted_overhead: float  #: time to target / failure-free time - 1
    #: mean time to target on the trace / mean failure-free time, same seeds, - 1
    measured_overhead: float | None
    predicted_failures: float | None
    measured_failures: float
    seeds: int
    reached: int  #: seeds that reached the target
    #: standard deviation over the seeds of each one's time to target on the trace over
    #: its failure-free time, - 1: the measured overhead's run-to-run noise
    overhead_spread: float | None = None

    @property
    def seconds_ratio(self) -> float | None:
        """measured / predicted time to target (None: nothing to compare)."""
        if self.measured_seconds is None or not math.isfinite(self.predicted_seconds):
            return None
        return self.measured_seconds / self.predicted_seconds

    @property
    def overhead_ratio(self) -> float | None:
        if self.measured_overhead is None or not math.isfinite(self.predicted_overhead) \
                or self.predicted_overhead == 0:
            return None
        return self.measured_overhead / self.predicted_overhead


def failure_free(advice: Advice, seeds: list[int]) -> dict[int, float]:
    """Seconds to target of the advisor's failure-free strategy, per seed (the reference
    for the measured overheads; share it between the candidates checked)."""
    cfg = replace(RunConfig.from_dict(advice.config), strategy=advice.baseline.strategy,
                  baseline=False, checkpoint_dir=None, failures=[])
    out = {}
    for seed in seeds:
        s = run_silent(replace(cfg, seed=seed))
        if s["sim_seconds_to_target"] is None:
            raise RuntimeError(f"seed {seed}: the failure-free run did not reach the target")
        out[seed] = float(s["sim_seconds_to_target"])
    return out


def check(advice: Advice, name: str, seeds: list[int],
          free: dict[int, float] | None = None) -> Check:
    """Run candidate ``name`` of ``advice`` failure-free and on its trace for ``seeds``.

    Measured overheads are against the failure-free strategy's runs on the same seeds
    (``free``, from :func:`failure_free`; computed here if not given), so a seed that
    needs more iterations than another changes the time to target, not the overhead.
    """
    free = free if free is not None else failure_free(advice, seeds)
    p = next(x for x in advice.predictions if x.name == name)
    cfg = RunConfig.from_dict(advice.config)
    cfg = replace(cfg, strategy=name, baseline=False, checkpoint_dir=None,
                  checkpoint_every=p.interval or cfg.checkpoint_every)
    base = advice.baseline
    first = seeds[0]
    mine = run_silent(replace(cfg, seed=first, failures=[]))
    steady = (mine["sim_seconds_to_target"] / free[first] - 1
              if mine["sim_seconds_to_target"] is not None else math.nan)
    budget = max(cfg.max_iterations or 0, 5 * base.iterations)
    times, failures, blocked, reached = [], [], [], []
    for seed in seeds:
        s = run_silent(replace(cfg, seed=seed, failures=[advice.trace], max_iterations=budget))
        failures.append(s["failures"])  # the run stops at the target: failures before it
        blocked.append(s["checkpoint_blocked_seconds"] / max(1, s["iterations"])
                       / base.step_seconds)
        if s["sim_seconds_to_target"] is not None:
            times.append(float(s["sim_seconds_to_target"]))
            reached.append(seed)
    mean = statistics.fmean(times) if times else None
    overhead = (mean / statistics.fmean(free[k] for k in reached) - 1
                if mean is not None else None)
    each = [t / free[k] - 1 for t, k in zip(times, reached)]
    return Check(name, p.interval, p.steady, steady, statistics.fmean(blocked),
                 p.seconds_to_target, mean, p.overhead, overhead, p.failures,
                 statistics.fmean(failures), len(seeds), len(times),
                 statistics.stdev(each) if len(each) > 1 else None)
