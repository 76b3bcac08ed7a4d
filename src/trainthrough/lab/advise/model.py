"""The advisor's predictions: pure arithmetic on what calibration measured.

All seconds are on the engine's clock (``Calibration.clock``): simulated seconds on
``sim`` (engines/sim/clock.py), wall seconds since training started on real engines.

For a strategy with failure-free step time ``t`` (checkpoints included), a failure
costing ``L = recovery + lost * t`` seconds (``lost``: the steps it cost beyond
recovering, the rework and the slow steps after it, measured within a failure run;
lab/advise/wall.py) and failures arriving every ``MTBF``
seconds on average (also while recovering: such a failure lengthens the outage
but loses no progress, so only some of them cost rework; how many, and by how much it
lengthens the outage, depends on the engine: :func:`outage`, :func:`costing`), the time
to target is the renewal model
of :func:`trainthrough.lab.perf_model.expected_runtime`:

    time_to_target = I0 * t0 * (1 + steady) / (1 - L / MTBF)

with ``I0`` and ``t0`` the failure-free iterations to target and step time, and
``steady`` the failure-free overhead of the strategy's checkpoints at its interval,
``C / (N t0)``. The interval ``N`` is Young/Daly's ``sqrt(2 C MTBF)`` (lab/perf_model.py)
with ``C`` the seconds one interval's saves add to a run (lab/advise/wall.py); an asynchronous save also needs the interval to be
at least one write long, or writes queue behind each other. Expected failures to
target are ``time_to_target / MTBF``; cloud cost is lab/cloud_cost.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from trainthrough.lab import perf_model as pm
from trainthrough.lab.advise.wall import refill_delay, spare_share
from trainthrough.lab.cloud_cost import Pricing, cost_to_target


@dataclass(frozen=True)
class Baseline:
    """The failure-free run everything is measured against (no checkpoints)."""

    strategy: str
    iterations: int  #: I0, iterations to target
    seconds: float  #: seconds to target
    contraction: float | None = None  #: c fitted as lab/bound.py does
    distance0: float | None = None
    fit_r2: float | None = None
    seeds: int = 1  #: calibration seeds averaged

    @property
    def step_seconds(self) -> float:
        return self.seconds / self.iterations


@dataclass(frozen=True)
class Measured:
    """One candidate's calibration: its checkpoint cost and one injected failure."""

    name: str
    interval: int | None  #: checkpoint every N iterations (None: no checkpoints)
    checkpoint_seconds: float = 0.0  #: C, seconds one interval's saves add to a run
    write_seconds: float = 0.0  #: async: one interval's writes, done in the background
    steady: float = 0.0  #: C / (interval * t0): the failure-free overhead at ``interval``
    #: iterations the calibration failures struck, one per failure run (the recovery,
    #: rework and steps lost below are means over these runs)
    failed_at: tuple[int, ...] = ()
    recovery_seconds: float | None = None  #: failure to recovered, as the engine reports
    rework: float | None = None  #: iterations to target minus I0 (None: never reached it)
    rework_bound: float | None = None  #: SCAR's bound for the recorded perturbation
    perturbation_norm: float | None = None
    #: steps a failure cost beyond recovering (rework and slow steps after it), measured
    #: within the failure run at its own pace (None: use ``rework``)
    lost_steps: float | None = None
    steady_spread: float = 0.0  #: standard deviation of ``steady`` over the cost pairs
    lost_spread: float | None = None  #: of ``lost_steps`` over the calibration seeds
    #: a failure right after another's recovery took this much longer to recover ...
    refill_excess: float = 0.0
    refill_gap: float = 0.0  #: ... striking this many seconds after it
    #: seconds from a failure until the spare started for the next one was ready, with
    #: the steps running beside it (mean over the failure runs; None: not reported)
    refill_window: float | None = None


@dataclass(frozen=True)
class Prediction:
    """What the advisor predicts for one candidate at an MTBF."""

    name: str
    label: str
    interval: int | None
    interval_seconds: float | None
    steady: float  #: failure-free overhead, a fraction of the failure-free time
    rework: float | None  #: iterations redone per failure (measured at the interval)
    recovery_seconds: float | None  #: R: failure to recovered
    per_failure_seconds: float | None  #: L: R + rework of the failures that cost any
    failures: float | None  #: expected failures before the target
    seconds_to_target: float  #: inf: a failure costs at least an MTBF (no progress)
    overhead: float  #: time to target / failure-free time - 1, failures included
    nodes: int
    cost_on_demand: float | None
    cost_spot: float | None
    why: list[str] = field(default_factory=list)
    #: standard error of ``seconds_to_target`` from the calibration's failure runs (the
    #: spread of their steps lost, its largest noise); None: fewer than two such runs
    seconds_se: float | None = None
    #: seconds of outage one failure adds (R, less where recoveries overlap: outage())
    outage_seconds: float | None = None


def interval(checkpoint_seconds: float, write_seconds: float, mtbf: float, step: float,
             most: int, least: int = 1) -> int:
    """Young/Daly's interval in whole iterations, at least one write long, at least
    ``least`` (the interval the cost was measured at: a save's cost is known there, not
    for saves packed closer, where asynchronous writes start to queue), at most
    ``most``."""
    yd = pm.young_daly_interval(checkpoint_seconds, mtbf) / step
    floor = max(1, least, math.ceil(write_seconds / step - 1e-9))
    return int(min(most, max(floor, round(yd))))


OVERLAPS = ("queue", "batch", "parallel")  #: how an engine recovers overlapping failures


def outage(recovery: float, mtbf: float, overlap: str = "queue") -> float:
    """Expected seconds of outage one failure adds, recoveries ``recovery`` long each.

    Failures arrive as a Poisson process of rate ``1/M`` (``M`` = MTBF), also while the
    engine recovers; how one striking then adds to the outage is the engine's
    (``Capabilities.batched_recovery`` and ``parallel_recovery``, per consistency mode):

    ``queue`` (``sim``: one replacement at a time): every failure adds its whole
    recovery, ``R``, also one striking during another's.

    ``batch`` (Ray's bulk-synchronous rounds): a failure due during a recovery is held
    back to its end (engines/ray/driver/bsp.py ``_settle``), and all held back then strike
    together and recover side by side, in one recovery more, during which the next
    batch gathers. A failure striking a running engine so starts an outage of
    ``R (1 + p + p^2 + ...) = R exp(R/M)`` (``p = 1 - exp(-R/M)``: one falls due during a
    recovery), holding it and, by Wald, ``exp(R/M) R/M`` failures more: per failure
    ``R exp(x) / (1 + x exp(x))`` with ``x = R/M`` (docs/advise.md compares it with
    measured traces).

    ``parallel`` (Ray's asynchronous runs: every death starts its own replacement at
    once, engines/ray/driver/recovery.py): the engine is out at ``t`` if any failure struck in
    ``(t - R, t]``. The gap ``g`` from the previous failure is exponential, mean ``M``;
    the previous failure's outage ``[-g, -g + R]`` reaches past the new one's strike (at
    0) by ``R - g`` if ``g < R``, and every earlier one ends before it, so the new
    failure's ``[0, R]`` adds ``min(g, R)``:

        E[min(g, R)] = integral_0^R P(g > s) ds = integral_0^R exp(-s/M) ds
                     = M (1 - exp(-R/M))

    That is ``R`` for the ``exp(-R/M)`` of failures striking outside a recovery, and for
    the ``1 - exp(-R/M)`` striking during one ``E[g | g < R] = M - R exp(-R/M) / (1 -
    exp(-R/M))``, about ``R/2`` when ``R << M``: its recovery runs past the earlier one's
    end only by the time between them. Summed over failures it is the covered share of
    an M/D/infinity queue's time, ``1 - exp(-R/M)`` (never all of it: parallel
    recoveries alone never stop progress). It assumes recoveries independent of each
    other; on Ray they are long mostly right after another failure (waiting for the
    spare), and the formula still comes close to measured traces (docs/advise.md).
    """
    if overlap == "parallel":
        return mtbf * -math.expm1(-recovery / mtbf)
    if overlap == "batch":
        held = recovery / mtbf * math.exp(recovery / mtbf)
        return recovery * math.exp(recovery / mtbf) / (1 + held)
    if overlap != "queue":
        raise ValueError(f"overlap must be one of {', '.join(OVERLAPS)} (got {overlap!r})")
    return recovery


def costing(recovery: float, mtbf: float, overlap: str = "queue") -> float:
    """The share of failures that strike a running engine, so lose progress: the others
    strike during a recovery (queued or side by side: ``exp(-R/M)`` strike outside one,
    arrivals being memoryless) or are held back to its end (``batch``: one of the ``1 +
    x exp(x)`` failures of an outage, :func:`outage`), when no step has run since."""
    x = recovery / mtbf
    return 1 / (1 + x * math.exp(x)) if overlap == "batch" else math.exp(-x)


def predict(base: Baseline, m: Measured, label: str, mtbf: float, nodes: int,
            pricing: Pricing | None = None, overlap: str = "queue") -> Prediction:
    """The prediction for one measured candidate (see the module docstring).

    ``overlap``: how the engine recovers a failure striking during another's recovery
    (:func:`outage`; ``queue`` on ``sim``).
    """
    pricing = pricing or Pricing()
    t0 = base.step_seconds
    why: list[str] = []
    if m.interval is not None:
        why.append(f"checkpoints every {m.interval} it (Young/Daly for C={m.checkpoint_seconds:.3g} s"
                   + (f", >= one write of {m.write_seconds:.3g} s" if m.write_seconds else "")
                   + f") cost {100 * m.steady:.2f}% failure-free")
    if m.rework is None or m.recovery_seconds is None:
        why.append("did not reach the target after one calibration failure")
        return Prediction(m.name, label, m.interval, _secs(m.interval, t0), m.steady, None,
                          m.recovery_seconds, None, None, math.inf, math.inf, nodes, None,
                          None, why)
    rework = max(0, m.rework)  # a failure that happened to help is noise, not a gain
    steps = rework if m.lost_steps is None else max(0.0, m.lost_steps)
    if m.lost_steps is not None and m.refill_window:
        # Beyond the rework, a lone failure's lost steps are slow steps beside the
        # spare being started again, from its recovery until the spare is ready; a
        # failure meanwhile stops the steps (its wait for the spare is counted in its
        # recovery), so on a trace they last only part of that (wall.spare_share).
        # Without this the wait was counted twice: on Ray mlr at an MTBF of 3 s the
        # calibration read 14.4 steps lost a failure (4.75 of them rework), the trace
        # 10.6 a failure that lost progress, this 10.6.
        steps = min(steps, rework) + max(0.0, steps - rework) * spare_share(
            m.refill_window, mtbf, m.recovery_seconds)
    # A failure soon after another may find the engine's replacement not ready yet;
    # less so early in the run (it starts with one ready), so the time to target
    # itself is needed: from a run without end, then the time that gave, twice.
    run: float | None = None
    for _ in range(3):
        recovery = m.recovery_seconds + refill_delay(m.refill_excess, m.refill_gap, mtbf,
                                                        m.refill_window, run,
                                                        m.recovery_seconds)
        # A failure striking during an earlier one's recovery, or held back to its end,
        # lengthens the outage (outage()) but finds no new progress to lose: only the
        # others cost rework (costing()).
        down = outage(recovery, mtbf, overlap)
        lost = down + costing(recovery, mtbf, overlap) * steps * t0 * (1 + m.steady)
        try:
            seconds = pm.expected_runtime(base.seconds, pm.Overhead(
                m.name, m.steady, lost, m.steady + lost / mtbf), mtbf)
        except ValueError:
            seconds = math.inf
            break
        run = seconds
    why.append(f"a failure costs {recovery:.3g} s recovering"
               + (f" ({m.recovery_seconds:.3g} s alone)" if recovery > m.recovery_seconds
                  else "") + f" + {rework:.3g} it rework"
               + (f" ({steps:.3g} steps lost in all)" if m.lost_steps is not None else "")
               + (f" (bound {m.rework_bound:.3g})" if m.rework_bound is not None
                  and math.isfinite(m.rework_bound) else "")
               + (f"; recoveries overlap ({overlap}): {down:.3g} s of outage per failure"
                  if overlap != "queue" else ""))
    if not math.isfinite(seconds):
        why.append(f"each failure costs {lost:.3g} s >= the MTBF: no progress")
        return Prediction(m.name, label, m.interval, _secs(m.interval, t0), m.steady, rework,
                          recovery, lost, None, math.inf, math.inf, nodes, None,
                          None, why)
    return Prediction(
        m.name, label, m.interval, _secs(m.interval, t0), m.steady, rework,
        recovery, lost, seconds / mtbf, seconds, seconds / base.seconds - 1, nodes,
        cost_to_target(seconds, nodes, pricing.on_demand),
        cost_to_target(seconds, nodes, pricing.spot), why,
        _seconds_se(base, m, mtbf, overlap, seconds), down)


def _seconds_se(base: Baseline, m: Measured, mtbf: float, overlap: str, seconds: float
                ) -> float | None:
    """The change in time to target when the steps lost grow by one standard error of
    their mean over the calibration's failure runs (``lost_spread / sqrt(runs)``), from
    the value the prediction used (a mean below 0, noise, is used as 0; ``seconds`` is
    the prediction there): upwards, the larger side, as the time to target is convex in
    the cost of a failure.

    A failure run's steps lost vary with where it struck and with the machine, enough
    on a real engine to move the time to target by a sizeable share of the 20% a
    prediction is held to (docs/advise.md). Shown next to the prediction so a user can
    tell a difference between candidates from that noise."""
    runs = len(m.failed_at)
    if m.lost_steps is None or not m.lost_spread or runs < 2:
        return None
    more = replace(m, lost_steps=max(0.0, m.lost_steps) + m.lost_spread / math.sqrt(runs),
                   lost_spread=None)
    up = predict(base, more, "", mtbf, 1, overlap=overlap).seconds_to_target
    return up - seconds if math.isfinite(up) else math.inf


def _secs(n: int | None, step: float) -> float | None:
    return None if n is None else n * step


def rank(preds: list[Prediction], by: str = "time") -> list[Prediction]:
    """Best first: least time to target (``by="cost"``: least on-demand cost), ties by
    less failure-free overhead, then candidate order."""
    def key(p: Prediction) -> tuple[float, float]:
        main = p.seconds_to_target if by == "time" else (
            p.cost_on_demand if p.cost_on_demand is not None else math.inf)
        return (main, p.steady)
    return sorted(preds, key=key)
