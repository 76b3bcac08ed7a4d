"""Costs as whole-run time differences: what a save and a failure add to a run's clock.

Why not the seconds an engine records for them: on a real engine they are only part of
the cost. An asynchronous save records almost nothing blocked, yet makes the run longer
(each save is a round trip from the driver to every shard, and the background write
runs on the cores the steps need); a failure costs its recorded recovery and rework
plus slow steps after it (evaluations around the disruption, the restored shard's first
steps, a warm process started in place of the one taken). docs/advise.md has the
figures. So the advisor measures, on every engine alike (on ``sim`` both ways agree):

- **per-save cost**: within a short failure-free run saving every ``n`` iterations, each
  step's seconds by its place after the last save, the steps late in the interval (the
  save's effects are over) being the pace without saves (:func:`phase_cost`): saves and
  no saves alternate within one run, so the machine's pace, which drifts from run to
  run with what else it runs, cancels; an engine that does not report every step is
  measured by a run without saves against one with, back to back (:func:`save_cost`);
- **per-failure cost**: the failure run's time to target minus what it would have
  taken without the failure, at its own pace until the strike (:func:`failure_cost`).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right

from trainthrough.engines.callbacks import Callback
from trainthrough.engines.result import RunResult
from trainthrough.events import Record


class StepClock(Callback):
    """The engine's clock after every step it reports: (executed iteration, seconds)."""

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.seconds: list[float] = []
        self.failures: list[float] = []  #: seconds each failure struck at
        #: seconds from a failure until the spare started for the next one was ready
        #: (Ray's warm spare: engines/ray/driver/cluster.py ``refilled``)
        self.spares: list[float] = []

    def after_step(self, iteration: int, sim_seconds: float) -> None:
        self.iterations.append(iteration)
        self.seconds.append(sim_seconds)

    def on_event(self, event: Record) -> None:
        if event.get("type") == "failure":
            self.failures.append(float(event["sim_seconds"]))
        elif event.get("type") == "spare-ready":
            self.spares.append(float(event["after_failure"]))

    def at(self, iteration: int) -> float:
        """Seconds when executed iteration ``iteration`` was last seen done (0 before
        any step; an engine reporting at its ticks, not every step, gives the tick's)."""
        k = bisect_right(self.iterations, iteration)
        return self.seconds[k - 1] if k else 0.0


def failure_cost(clock: StepClock, failed_at: int, seconds: float, base: StepClock,
                 base_seconds: float, base_iterations: int) -> tuple[float, float]:
    """What one failure added to a run's time to target, and the run's own pace.

    Until the strike (after executed iteration ``failed_at``) the run is failure-free;
    had it stayed so, it would have reached the target after its seconds then times
    the failure-free run's (``base``) ratio of its time to target to its time at that
    iteration. That shape (the first steps' warm-up, the evaluations near the target)
    is the failure-free run's; the pace is the failure run's own, so a run that
    happened to be slower or faster than the failure-free one does not count as the
    failure's. The difference is the failure's cost in all: recovering, the rework,
    and the slow steps after it however long they last (a replacement process that
    starts on the cores the steps need: on Ray the slow steps go on for tens of steps
    after a recovery, and a window that ends too soon counts them as the run's pace).

    Args:
        clock: the failure run's :class:`StepClock`.
        seconds: the failure run's seconds to target.
        base, base_seconds, base_iterations: the same seed's failure-free run's
            :class:`StepClock`, seconds and iterations to target.

    Returns:
        (seconds lost, failure-free seconds per iteration at the run's pace).
    """
    free = clock.at(failed_at) * base_seconds / max(1e-12, base.at(failed_at))
    return seconds - free, free / base_iterations


def refill_delay(excess: float, gap: float, mtbf: float, window: float | None = None,
                 run: float | None = None, alone: float = 0.0) -> float:
    """Expected extra recovery seconds per failure from the one before it.

    A failure that strikes ``gap`` seconds after another took ``excess`` seconds longer
    to recover than a lone one (Ray: the warm spare the first replacement used is being
    started again, on the cores the steps need): it waits until that spare is ready,
    ``window`` seconds after the first failure. The back-to-back run that measures the
    excess is one sample of that window (``gap + excess``) and stops the steps right
    after the first recovery; ``window`` is measured in the lone-failure runs, with the
    steps running beside the starting spare as on a trace (each failure of a trace waits
    about ``window - g`` at a gap ``g``, second for second). Its lone recovery,
    ``alone`` seconds, runs meanwhile: it recovers when the spare is ready or when a lone
    recovery would have, whichever is later (docs/advise.md has the trace figures).
    So a failure ``g`` after another takes ``max(0, window - alone - g)`` longer than
    alone, for failures ``Exp(mtbf)`` apart; 0 where no excess was measured (sim: a
    replacement is always ready). Without ``window``, the back-to-back sample: the whole
    ``excess`` for any gap up to ``gap``, less second for second after it.

    ``run``: the run's seconds, if known. A failure in its first ``window`` seconds
    cannot have waited for a spare started before the run (the run starts with one
    ready): a failure at ``t`` waits only for gaps ``g < t``, which takes
    ``E[g * max(0, window - g)] / run`` off the mean (failures uniform over the run).
    """
    if excess <= 0:
        return 0.0
    if window is not None:
        w = max(0.0, window - alone)
        e = math.exp(-w / mtbf)
        mean = w - mtbf * (1 - e)  # E[max(0, w - g)]
        if run is None or run <= w:
            return mean
        g1 = mtbf * (1 - e) - w * e  # E[g; g < w]
        g2 = 2 * mtbf * g1 - w * w * e  # E[g^2; g < w]
        return mean - (w * g1 - g2) / run
    near = 1 - math.exp(-gap / mtbf)
    later = math.exp(-gap / mtbf) * (excess - mtbf * (1 - math.exp(-excess / mtbf)))
    return excess * near + later


def spare_share(window: float, mtbf: float, alone: float = 0.0) -> float:
    """The share of a spare's start, from a lone recovery's end (``alone`` seconds after
    the failure) to the spare ready (``window`` seconds after it), during which steps run
    beside it on a trace: until it is ready or the next failure strikes, ``Exp(mtbf)``
    after the first, whichever is first (then the steps stop: that failure waits for the
    spare). ``E[max(0, min(g, w) - a)] / (w - a) = M (exp(-a/M) - exp(-w/M)) / (w - a)``:
    1 for failures far apart, less the closer they come to the window."""
    if window <= alone:
        return 1.0
    return mtbf * (math.exp(-alone / mtbf) - math.exp(-window / mtbf)) / (window - alone)


def _trimmed(xs: list[float]) -> float:
    """Mean of the middle 80%: a step the machine stalled (another process's burst) is
    not the save's, and an unlucky run's burst must not set the pace either."""
    xs = sorted(xs)
    cut = len(xs) // 10
    return statistics.fmean(xs[cut:len(xs) - cut] if len(xs) > 2 * cut else xs)


def phase_cost(clock: StepClock, every: int) -> tuple[float, float] | None:
    """(seconds the saves add per ``every`` iterations, seconds a step takes without
    them) within one failure-free run saving after every ``every``-th iteration; None if
    the engine did not report every step or the run held fewer than two intervals.

    A save after iteration ``i`` (``i % every == 0``) lands in that step's seconds; an
    asynchronous one's write runs on during the next steps. The steps in the second
    half of the interval are taken as unaffected: ``every`` must be at least twice the
    steps a background write takes.
    """
    its, secs = clock.iterations, clock.seconds
    if len(its) < 2 * every + 2 or its != list(range(its[0], its[0] + len(its))):
        return None
    by_phase: dict[int, list[float]] = {k: [] for k in range(every)}
    for j in range(1, len(its)):
        if its[j] > every:  # the first interval warms up (first allocations, caches)
            by_phase[its[j] % every].append(secs[j] - secs[j - 1])
    if any(not v for v in by_phase.values()):
        return None
    step = {k: _trimmed(v) for k, v in by_phase.items()}
    pace = statistics.fmean(step[k] for k in range(every // 2, every))
    return sum(step.values()) - every * pace, pace


def save_cost(pairs: list[tuple[RunResult, RunResult]], every: int) -> tuple[float, float]:
    """Seconds the saves add per ``every`` iterations: (mean, spread) over ``pairs`` of
    (without saves, with saves every ``every``) results of runs of equal length.

    The spread is the pairs' standard deviation (0 for one pair): the noise of the
    machine's pace, reported next to the mean rather than hidden in it.
    """
    per = [(w.sim_seconds - wo.sim_seconds) * every / max(1, w.iterations) for wo, w in pairs]
    return statistics.fmean(per), statistics.stdev(per) if len(per) > 1 else 0.0
