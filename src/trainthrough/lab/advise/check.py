"""Checking a prediction: run a candidate on the seeded failure trace and compare.

For one candidate of an :class:`~trainthrough.lab.advise.Advice`, at the interval the
advisor chose: one failure-free run per seed (its failure-free overhead against the
advisor's failure-free strategy on the same seed), then one run per seed on the trace itself (``--fail``
with that MTBF; each seed draws other failure times and, as any seed does, other data
order and initial values). Measured time to target is the mean over the seeds that
reached it, on the engine's clock, as the prediction. Used by tests/test_advise.py
(sim) and benchmarks/advise_check.py (sim and Ray).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.lab.advise.advisor import SIMULATED, Advice
from trainthrough.lab.advise.wall import StepClock, phase_cost
from trainthrough.lab.jobs import job_pool
from trainthrough.lab.runner import run_silent
from trainthrough.lab.validate import for_strategy


@dataclass(frozen=True)
class Check:
    """Predicted next to measured, for one candidate."""

    name: str
    interval: int | None
    predicted_steady: float  #: failure-free overhead (fraction)
    #: the strategy's failure-free time to target over the failure-free strategy's - 1,
    #: the mean over the seeds (each seed against its own failure-free run)
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
    steady_spread: float | None = None  #: the same for ``measured_steady``
    reference_seconds: float | None = None  #: mean failure-free time of the seeds
    #: each seed's runs: seed, reference and failure-free seconds to target, seconds to
    #: target on the trace (None: not reached), failures struck before it, and the
    #: seconds each one struck at (what the trace drew; the model expects time / MTBF)
    runs: tuple[dict[str, Any], ...] = ()

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


def _reference(advice: Advice, seed: int) -> float:
    """Seconds to target of the advisor's failure-free strategy on ``seed``."""
    cfg = for_strategy(replace(RunConfig.from_dict(advice.config), baseline=False,
                               checkpoint_dir=None, failures=[], seed=seed),
                       advice.baseline.strategy)
    s = run_silent(cfg)
    if s.sim_seconds_to_target is None:
        raise RuntimeError(f"seed {seed}: the failure-free run did not reach the target")
    return float(s.sim_seconds_to_target)


def failure_free(advice: Advice, seeds: list[int], jobs: int = 1) -> dict[int, float]:
    """Seconds to target of the advisor's failure-free strategy, per seed (the reference
    for the measured overheads; on ``sim``, whose clock does not drift, share it between
    the candidates checked). ``jobs``: runs at a time (sim only, see :func:`check`)."""
    with job_pool(_jobs(advice, jobs)) as pool:
        futures = {seed: pool.submit(_reference, advice, seed) for seed in seeds}
        return {seed: f.result() for seed, f in futures.items()}


def _jobs(advice: Advice, jobs: int) -> int:
    """Runs side by side only on a simulated clock: on a real engine they would share
    the cores and each one's seconds would measure the others too."""
    if jobs > 1 and advice.clock != SIMULATED:  # the clock its numbers were measured on
        raise ValueError(f"runs side by side need sim's clock, not {advice.clock!r}")
    return max(1, jobs)


def _seed_runs(advice: Advice, cfg: RunConfig, seed: int, budget: int,
               reference: float | None) -> tuple[RunResult, RunResult, dict[str, Any]]:
    """One seed of a check: the reference (unless given), the candidate failure-free,
    then on the trace; their summaries and the seed's row of ``Check.runs``."""
    ref = reference if reference is not None else _reference(advice, seed)
    own = StepClock()
    mine = run_silent(replace(cfg, seed=seed, failures=[]), own)
    clock = StepClock()
    s = run_silent(replace(cfg, seed=seed, failures=[advice.trace], max_iterations=budget),
                   clock)
    run = {"seed": seed, "reference": ref,
           "failure_free": mine.sim_seconds_to_target,
           "trace": s.sim_seconds_to_target, "failures": s.failures,
           "iterations": (mine.iterations_to_target, s.iterations_to_target),
           "executed": s.iterations,
           # the engine's clock after every step, failure-free and on the trace
           "steps": ((own.iterations, own.seconds), (clock.iterations, clock.seconds)),
           "struck_at": [round(t, 3) for t in clock.failures],
           # seconds from a failure to its refill spare ready (Ray)
           "spares": [round(t, 3) for t in clock.spares],
           "recoveries": [round(r.recovery_seconds, 3) for r in s.recoveries]}
    return mine, s, run


def check(advice: Advice, name: str, seeds: list[int],
          free: dict[int, float] | None = None, jobs: int = 1) -> Check:
    """Run candidate ``name`` of ``advice`` failure-free and on its trace for ``seeds``.

    Measured overheads are against the failure-free strategy's runs on the same seeds,
    so a seed that needs more iterations than another changes the time to target, not
    the overhead: ``free`` (from :func:`failure_free`), or if not given, each seed's run
    just before that seed's runs of the candidate, so that on a real engine, whose pace
    drifts with what else the machine runs, an overhead compares runs made at the same
    pace. ``jobs``: seeds run at a
    time, in processes of their own; more than one only on ``sim``, whose results do
    not depend on it.
    """
    p = next(x for x in advice.predictions if x.name == name)
    cfg = RunConfig.from_dict(advice.config)
    cfg = for_strategy(replace(cfg, baseline=False, checkpoint_dir=None,
                               checkpoint_every=p.interval or cfg.checkpoint_every), name)
    base = advice.baseline
    budget = max(cfg.max_iterations or 0, 5 * base.iterations)
    ref: dict[int, float] = {}
    steadies, times, failures, blocked, reached = [], [], [], [], []
    runs: list[dict[str, Any]] = []
    with job_pool(_jobs(advice, jobs)) as pool:
        futures = [pool.submit(_seed_runs, advice, cfg, seed, budget,
                               None if free is None else free[seed]) for seed in seeds]
        for seed, future in zip(seeds, futures):
            mine, s, run = future.result()
            ref[seed] = run["reference"]
            free_seconds = mine.sim_seconds_to_target
            steadies.append(free_seconds / ref[seed] - 1 if free_seconds is not None
                            else math.nan)
            failures.append(s.failures)  # the run stops at the target: failures before it
            runs.append(run)
            blocked.append(s.checkpoint_blocked_seconds / max(1, s.iterations)
                           / base.step_seconds)
            if s.sim_seconds_to_target is not None:
                times.append(float(s.sim_seconds_to_target))
                reached.append(seed)
    mean = statistics.fmean(times) if times else None
    overhead = (mean / statistics.fmean(ref[k] for k in reached) - 1
                if mean is not None else None)
    each = [t / ref[k] - 1 for t, k in zip(times, reached)]
    return Check(name, p.interval, p.steady, statistics.fmean(steadies),
                 statistics.fmean(blocked), p.seconds_to_target, mean, p.overhead, overhead,
                 p.failures, statistics.fmean(failures), len(seeds), len(times),
                 statistics.stdev(each) if len(each) > 1 else None,
                 statistics.stdev(steadies) if len(steadies) > 1 else None,
                 statistics.fmean(ref.values()), tuple(runs))


def steady_from_steps(c: Check, eval_every: int) -> list[float]:
    """Each seed's failure-free overhead read off its failure-free run's own steps, as
    calibration reads a save's cost (lab/advise/wall.py :func:`phase_cost`): the seconds
    the saves add per interval over the interval's seconds without them. A second
    reading of ``measured_steady`` on the same runs, free of the pace drift between two
    whole runs (on a real engine larger than the saves' own cost); empty where it does not apply (no checkpoints, an engine that
    does not report every step, or an interval sharing a factor with the evaluations',
    whose cost would then land on some phases only)."""
    n = c.interval
    if not n or n < 2 or math.gcd(n, eval_every) > 1:
        return []
    out = []
    for r in c.runs:
        its, secs = r.get("steps", ((), ()))[0]
        clock = StepClock()
        for i, t in zip(its, secs):
            clock.after_step(i, t)
        got = phase_cost(clock, n)
        if got is not None and its:
            cost = got[0]
            pace = (secs[-1] - cost * len(its) / n) / len(its)  # evaluations included
            out.append(cost / (n * pace))
    return out
