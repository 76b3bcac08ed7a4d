"""Calibration: short real runs on the chosen engine, measuring what the model needs.

1. The failure-free run (a candidate without checkpoints; on a real engine after a
   short warm-up run) to the target and 50% past it, as lab/runner.py's baselines:
   iterations and seconds to target, hence the step time, and the contraction rate
   fitted on its iterates (lab/bound.py).
2. Each checkpointing candidate's ``C``, the seconds its saves add per interval, as a
   whole-run difference (lab/advise/wall.py: the seconds an engine records blocked are
   only part of it on a real engine): short failure-free runs with saves every ``n``
   iterations against the same runs without, back to back (repeated on real engines).
   ``n`` is dense, so the difference stands out of the run-to-run noise, but at least one
   write long for an asynchronous save, whose write (its synchronous twin's blocked
   seconds per save) runs in the background and must not queue.
3. Each candidate at its Young/Daly interval with one failure of the trace's kind
   (same components, ``iter=`` instead of ``mtbf=``) half an interval after a save, in
   runs spread over the way to the target (:func:`failure_plan`: one half way per
   seed on ``sim``, at least 4 at 1/8, 3/8, 5/8, 7/8 on real engines): the recovery seconds, the rework (iterations to target
   minus the failure-free run's, same seed), what the failure cost in all measured
   within that run (lab/advise/wall.py: recovery, rework and slow steps after it), the
   perturbation and SCAR's bound for it.
4. Each candidate with that failure and another on the first step after its recovery:
   how much longer the second takes to recover (Ray: the warm spare the first used is
   still starting, so a recovery soon after another takes several times as long as a
   lone one), priced by the model for failures an MTBF apart. The second
   failure stops the steps, so that spare starts on idle cores; the runs of step 3
   also record when the spare started after their failure was ready with the steps
   running beside it, as on a trace (engines/ray/driver/cluster.py ``refilled``): how late a
   failure may still find it starting (wall.refill_delay).

A failure run has its failure-free run's seed, so rework is the failure's alone; with
several calibration seeds both are repeated per seed and averaged (a workload whose
iterations to target vary by seed is otherwise predicted from one seed's luck). Seconds
are on the engine's clock (simulated on ``sim``, wall on real engines).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback, Callbacks
from trainthrough.engines.registry import traits
from trainthrough.engines.result import RunResult
from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec
from trainthrough.lab.advise.candidates import Candidate
from trainthrough.lab.advise.model import Baseline, Measured, interval
from trainthrough.lab.advise.wall import StepClock, failure_cost, phase_cost, save_cost
from trainthrough.lab.bound import Contraction, IterateTracker, fit_contraction
from trainthrough.lab.runner import resolve_defaults, run_silent
from trainthrough.lab.validate import for_strategy

Say = Callable[[str], None]

#: pairs of runs (without, with saves) per checkpoint cost: a real engine's pace drifts
#: from run to run (by a fifth for the same seed on a shared machine), so the mean of
#: several pairs and their spread; an engine on a virtual clock is deterministic
#: (``Traits.virtual_clock``): one pair is exact
EXACT_PAIRS = 1
#: 4, not 2, on real engines: one pair's noise is about a third of a save's cost
#: (docs/advise.md)
REAL_PAIRS = 4
#: failure runs per candidate, at least (more with more calibration seeds): spread over
#: the run, as a trace's failures are. On a real engine what one failure costs varies
#: with where it strikes (rework, the run's phase) by more than its mean, so two
#: samples at the same point leave the mean far off (docs/advise.md); on a virtual
#: clock the failure cost is read exactly from one run per seed
EXACT_FAILURE_RUNS = 1
REAL_FAILURE_RUNS = 4
#: the interval the checkpoint cost is measured at, at least (wall.phase_cost: the
#: second half of each interval is the pace without saves)
PHASED = 8


def _exact(cfg: RunConfig) -> bool:
    """Whether the run's engine repeats itself exactly (a virtual clock, no drift)."""
    return traits(cfg.engine).virtual_clock


def _run(cfg: RunConfig, tracker: Callback | None = None) -> RunResult:
    """One calibration run of ``cfg``'s strategy, with the base's settings it reads."""
    return run_silent(for_strategy(replace(cfg, baseline=False, checkpoint_dir=None),
                                   cfg.strategy), tracker)


def baseline(cfg: RunConfig, cands: list[Candidate], say: Say, warm_up: bool = True
             ) -> tuple[Baseline, StepClock]:
    """Step 1 (module docstring), and the run's steps (the shape of a failure-free run,
    for :func:`~trainthrough.lab.advise.wall.failure_cost`).

    Raises:
        UserError: the failure-free run does not reach the target.
    """
    plain = next((c for c in cands if not c.checkpoints), cands[0])
    if not _exact(cfg) and warm_up:
        # Warm up first (actors, imports, first allocations): the first run of a session
        # trains slower, and every step time and overhead is measured against this one.
        # Once: the calibration seeds' runs share the session.
        say("warm-up run")
        _run(replace(cfg, strategy=plain.name, failures=[], stop_at_target=False,
                     max_iterations=min(cfg.max_iterations or 50, 50)))
    tracker, clock = IterateTracker(), StepClock()
    say(f"failure-free run ({plain.name}, seed {cfg.seed}) to the target")
    s = _run(replace(cfg, strategy=plain.name, failures=[], past_target=0.5),
             Callbacks([tracker, clock]))
    if s.iterations_to_target is None or not s.sim_seconds_to_target:
        raise UserError(f"{cfg.workload} does not reach its target {s.target} without "
                        f"failures within {s.iterations} iterations; raise "
                        "--max-iterations or choose an easier --target")
    seconds = float(s.sim_seconds_to_target)
    if plain.checkpoints and s.sim_seconds > 0:  # only if no candidate skips saves
        seconds *= 1 - s.checkpoint_blocked_seconds / s.sim_seconds
    fit = fit_contraction(tracker.iterations, tracker.iterates)
    return Baseline(plain.name, s.iterations_to_target, seconds,
                    fit.c if fit else None, fit.distance0 if fit else None,
                    fit.r2 if fit else None), clock


def checkpoint_cost(cfg: RunConfig, c: Candidate, base: Baseline, say: Say
                    ) -> tuple[float, float, float, list[float], int]:
    """Step 2: (C, its spread over the pairs, write seconds, paces): what one interval's
    saves add to the run's time (a full save, or r of the rows r*N apart); async, what
    writing one interval's saves takes in the background; the seconds per iteration of
    the runs without saves (more samples of the failure-free pace); the interval the
    cost was measured at."""
    every = cfg.checkpoint_every or 1
    short = replace(cfg, failures=[], stop_at_target=False,
                    max_iterations=min(base.iterations, 4 * every))
    say(f"checkpoint cost of {c.name}")
    write = 0.0
    if c.strategy.persist == "async":
        s = _run(replace(short, strategy=f"base={c.name},persist=sync"))
        write = s.checkpoint_blocked_seconds * every / max(1, s.iterations)
    # Prioritized saves take r of the rows every r*N: measured at the configured N.
    # Otherwise every PHASED iterations, or more: twice the steps a background write
    # takes, so the second half of each interval is free of it (wall.phase_cost).
    n = every if c.strategy.checkpoint == "prioritized" else min(
        every, max(PHASED, 2 * math.ceil(write / base.step_seconds - 1e-9) + 2))
    # Evaluations land on every phase alike only if no multiple of n is one of theirs.
    while c.strategy.checkpoint != "prioritized" and math.gcd(n, cfg.eval_every or 1) > 1:
        n += 1
    costs, paces, pairs = [], [], []
    for _ in range(EXACT_PAIRS if _exact(cfg) else REAL_PAIRS):
        clock = StepClock()
        saved = _run(replace(short, strategy=c.name, checkpoint_every=n), clock)
        # Prioritized saves come every r*n iterations, not every n: no phase is free
        # of them, so they are measured against their twin without saves.
        within = None if c.strategy.checkpoint == "prioritized" else phase_cost(clock, n)
        if within is not None:
            costs.append(within[0])
            # The run's own pace without its saves (evaluations included, as in the
            # failure-free run; the phases' pace leaves most of them out).
            its = max(1, saved.iterations)
            paces.append((saved.sim_seconds - within[0] * its / n) / its)
            continue
        # Else (and an engine that reports at its ticks): its twin without saves.
        pairs.append((_run(replace(short, strategy=f"base={c.name},checkpoint=none")), saved))
        without = pairs[-1][0]
        paces.append(without.sim_seconds / max(1, without.iterations))
    if pairs:
        cost, spread = save_cost(pairs, n)
    else:
        cost = statistics.fmean(costs)
        spread = statistics.stdev(costs) if len(costs) > 1 else 0.0
    # Per interval: the configured one for prioritized saves (r of the rows each r*N),
    # else one full save, whatever N.
    return cost, spread, write, paces, n


def _pooled(base: Baseline, bases: list[Baseline], paces: list[float]) -> Baseline:
    """The failure-free time to target at the mean pace of every failure-free run the
    calibration made: a real engine's pace drifts with what else the machine runs, and
    one run is one sample of it. Only the failure-free runs without saves are pooled."""
    if not paces:
        return base
    own = [b.seconds / b.iterations for b in bases]
    return replace(base, seconds=base.iterations * statistics.fmean(own + paces))


def calibration_failure(trace: FailureSpec, at: int) -> str:
    """The trace's failure (its components and options) at iteration ``at``, once."""
    target, _, rest = trace.text.partition("@")
    options = [o for o in rest.split(",")[1:] if not o.strip().startswith("max=")]
    return ",".join([f"{target}@iter={at}", *options])


def failure_point(iterations: int, every: int | None, where: float = 0.5) -> int:
    """``where`` of the way to the target (half by default), half an interval after a
    save (checkpointing runs)."""
    half = max(1, int(iterations * where))
    if not every or every >= iterations:
        return half if not every else max(1, min(half, every // 2))
    return (half // every) * every + max(1, every // 2)


def failure_plan(seeds: int, runs: int) -> list[tuple[int, float]]:
    """The calibration's failure runs: ``max(seeds, runs)`` of them, run ``j`` on
    calibration seed ``j % seeds`` with its failure ``(j + 1/2) / n`` of the way to the
    target. A trace's failures strike anywhere in the run, and what one costs depends on
    where (rework near the target, the run's phase): the mean over evenly spread points
    is the trace's expected cost, where every failure half way is one point's."""
    n = max(seeds, runs)
    return [(j % seeds, (j + 0.5) / n) for j in range(n)]


def with_failure(cfg: RunConfig, c: Candidate, base: Baseline, trace: FailureSpec,
                 every: int | None, say: Say, clock: StepClock | None = None,
                 where: float = 0.5) -> tuple[RunResult, int]:
    """Step 3: one failure ``where`` of the way to the target, at ``every`` (None: no
    checkpoints); the run's result and the iteration the failure struck at (``clock``:
    given, it records the run's steps)."""
    at = failure_point(base.iterations, every, where)
    say(f"{c.name}: one failure at iteration {at} ({where:.2f} of the way, seed {cfg.seed})"
        + (f", checkpoint every {every}" if every else ""))
    run_cfg = replace(cfg, strategy=c.name, failures=[calibration_failure(trace, at)],
                      checkpoint_every=every or cfg.checkpoint_every,
                      max_iterations=max(cfg.max_iterations or 0, 3 * base.iterations))
    return _run(run_cfg, clock), at


def back_to_back(cfg: RunConfig, c: Candidate, base: Baseline, trace: FailureSpec,
                 every: int | None, say: Say) -> tuple[float, float] | None:
    """Step 4: the calibration failure, then another on the first step after its
    recovery: (how much longer the second took to recover than the first, seconds
    between them); None if either was not recovered. Run only as far as that."""
    at = failure_point(base.iterations, every)
    say(f"{c.name}: a failure at iteration {at} and another right after its recovery")
    clock = StepClock()
    s = _run(replace(cfg, strategy=c.name, stop_at_target=False, max_iterations=at + 30,
                     failures=[calibration_failure(trace, at), calibration_failure(trace, at + 1)],
                     checkpoint_every=every or cfg.checkpoint_every), clock)
    recs = s.recoveries
    if len(recs) < 2 or len(clock.failures) < 2:
        return None
    return (recs[-1].recovery_seconds - recs[0].recovery_seconds,
            clock.failures[-1] - clock.failures[0])


def _combine(bases: list[Baseline]) -> Baseline:
    """The seeds' failure-free runs as one: mean iterations and seconds to target (the
    contraction rate of the first seed's)."""
    first = bases[0]
    return replace(first, iterations=round(statistics.fmean(b.iterations for b in bases)),
                   seconds=statistics.fmean(b.seconds for b in bases), seeds=len(bases))


def _one_failure(cfg: RunConfig, c: Candidate, base: Baseline, trace: FailureSpec,
                 every: int | None, say: Say, shape: StepClock, where: float = 0.5
                 ) -> dict[str, Any]:
    """A seed's failure run reduced to what the model needs (None: not reached)."""
    clock = StepClock()
    s, at = with_failure(cfg, c, base, trace, every, say, clock, where)
    recs = s.recoveries
    to_target, seconds = s.iterations_to_target, s.sim_seconds_to_target
    out: dict[str, Any] = {
        "failed_at": at,
        "rework": to_target - base.iterations if to_target is not None else None,
        "recovery": sum(r.recovery_seconds for r in recs) if recs else None,
        "norm": sum(r.perturbation_norm for r in recs) if recs else None,
        "lost": None, "bound": None,
        # the spare this failure's replacement started, ready with the steps resumed
        "window": clock.spares[0] if clock.spares else None}
    if to_target is not None and seconds is not None and recs:
        lost, pace = failure_cost(clock, at, seconds, shape, base.seconds, base.iterations)
        # Beyond recovering, in the run's own steps (the model prices them at the
        # calibrated step time): the rework and the slow steps after the recovery.
        out["lost"] = (lost - out["recovery"]) / pace
    if base.contraction is not None and base.distance0 is not None and recs:
        out["bound"] = Contraction(base.contraction, base.distance0, 0, 0.0).bound(
            [(r.at_iteration, r.perturbation_norm) for r in recs])
    return out


def _mean(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs]
    return None if any(v is None for v in values) else statistics.fmean(values)


def _present(runs: list[dict[str, Any]], key: str) -> float | None:
    """Mean of the runs that have ``key`` (None: none has; an engine without spares)."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def _spread(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs]
    if len(values) < 2 or any(v is None for v in values):
        return None
    return statistics.stdev(values)


def measure(cfg: RunConfig, cands: list[Candidate], trace: FailureSpec, mtbf: float,
            say: Say, seeds: int = 1) -> tuple[Baseline, list[Measured]]:
    """Every step (module docstring), for every candidate, on ``seeds`` seeds from
    ``cfg.seed`` on: the failure-free runs and the failure runs are repeated per seed
    (rework is each seed's against its own failure-free run) and averaged; the
    checkpoint cost, which no seed changes, is measured once (in pairs on real engines).

    ``cfg``'s fields not set resolve from the workload (interval, budgets, target).
    """
    cfg, workload = resolve_defaults(cfg)
    # The candidates' interval, whatever the base's own strategy saves (each run reads
    # its share of the base: _run).
    cfg = replace(cfg, checkpoint_every=cfg.checkpoint_every or workload.default_checkpoint_every)
    cfgs = [replace(cfg, seed=cfg.seed + i) for i in range(seeds)]
    made = [baseline(c, cands, say, warm_up=i == 0) for i, c in enumerate(cfgs)]
    bases, shapes = [b for b, _ in made], [k for _, k in made]
    base = _combine(bases)
    costs: dict[str, tuple[float, float, float, int]] = {}
    paces: list[float] = []
    for c in cands:
        if c.checkpoints:
            cost, spread, write, more, at = checkpoint_cost(cfg, c, base, say)
            costs[c.name] = (max(0.0, cost), spread, write, at)  # measured free: noise
            paces += more
    if not _exact(cfg):  # a virtual clock's pace does not drift: its baseline is exact
        base = _pooled(base, bases, paces)
    t0 = base.step_seconds
    out = []
    for c in cands:
        every, (cost, spread, write, at) = None, costs.get(c.name, (0.0, 0.0, 0.0, 1))
        if c.checkpoints:
            # Prioritized: measured at the configured N, but its cost scales with N.
            least = 1 if c.strategy.checkpoint == "prioritized" else at
            every = interval(cost, write, mtbf, t0, base.iterations, least)
        runs = [_one_failure(cfgs[k], c, bases[k], trace, every, say, shapes[k], where)
                for k, where in failure_plan(seeds, EXACT_FAILURE_RUNS if _exact(cfg)
                                             else REAL_FAILURE_RUNS)]
        # A property of the engine's replacements, not of the seed: measured once
        # per candidate, pooled below.
        excess, gap = back_to_back(cfg, c, base, trace, every, say) or (0.0, 0.0)
        out.append(Measured(
            c.name, every, cost, write, cost / (every * t0) if every else 0.0,
            tuple(r["failed_at"] for r in runs), _mean(runs, "recovery"), _mean(runs, "rework"),
            _mean(runs, "bound"), _mean(runs, "norm"), _mean(runs, "lost"),
            spread / (every * t0) if every else 0.0, _spread(runs, "lost"), excess, gap,
            _present(runs, "window")))
    return base, pool_refill(out, [c.strategy.replication == "none" for c in cands])


def pool_refill(measured: list[Measured], spare: list[bool]) -> list[Measured]:
    """Every candidate whose replacement comes from the engine's warm spare (``spare``;
    not a chain's failover) gets the mean back-to-back excess and gap of them all, and
    the mean spare window.

    What a failure soon after another waits for is the spare the first one's
    replacement started: the same actor, started the same way, whatever the strategy.
    Each candidate's own figure is one back-to-back run, one sample of the same
    quantity with its noise (docs/advise.md); the mean over all of them is steadier.
    """
    pool = [m for m, s in zip(measured, spare) if s]
    if len(pool) < 2:
        return measured
    excess = statistics.fmean(m.refill_excess for m in pool)
    gap = statistics.fmean(m.refill_gap for m in pool)
    windows = [m.refill_window for m in pool if m.refill_window is not None]
    window = statistics.fmean(windows) if windows else None
    return [replace(m, refill_excess=excess, refill_gap=gap, refill_window=window) if s
            else m for m, s in zip(measured, spare)]
