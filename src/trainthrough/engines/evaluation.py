"""When to evaluate: one policy for every engine, so that iterations to target are exact.

Scoring the model every ``eval_every`` iterations only would know the iteration a
run first reaches its target to within ``eval_every``, and rework (the difference
of two such numbers, lab/runner.py) to within twice that: a failure one iteration
after a checkpoint would cost "0" iterations. Evaluating every iteration costs one
evaluation per iteration. Instead, for each executed iteration ``t`` an engine
finishes, :class:`EvalPolicy` decides (:class:`EvalAction`):

- ``EVALUATE`` at every multiple of ``every`` (the curve, as before), and at the
  ``after`` iterations that follow a disruption (a failure struck, or a recovery
  ended, after iteration ``d``: ``d < t <= d + after``), so curves show the dip;
  the state at ``d`` itself is evaluated too, when the engine still holds it;
- ``KEEP`` otherwise, while the target has not been reached: the engine hands over a
  copy of the parameters, held until the next evaluation, as long as the copies held
  fit in ``keep_bytes`` (``lookback_bytes``; :meth:`EvalPolicy.fits`): the oldest are
  kept, a copy that does not fit is not;
- ``SKIP`` once the target is reached (nothing more to locate).

**Look-back** (:meth:`~trainthrough.engines.base.RunContext.evaluate`): when an
evaluation at ``t`` finds the target reached for the first time, the kept iterations
since the previous evaluation are scored first, oldest first, until one reaches it;
that one is the iteration to target. A regular evaluation that does not reach the
target but is *near* it (closer than the metric moved over the last interval, while
progress is steady: :func:`near`) looks back too, at most :data:`NEAR_LOOKS` times a run: noisy metrics
(mini-batch SGD) touch the target between two evaluations and leave it again.
Engines and the failure-free baseline share the rule, so rework is a difference of
two exact numbers.

**What is guaranteed.** Let ``m(t)`` be the metric after executed iteration ``t`` and
``t*`` the first ``t`` at which ``m(t)`` reaches the target (what evaluating every
iteration reports). The run reports ``t*`` whenever the target is still reached at
the first scheduled evaluation at or after ``t*`` and every iteration since the
evaluation before it was kept (their copies fit in ``lookback_bytes``: a model of
``P`` float32 parameters keeps ``lookback_bytes / 4P`` of them, 16 of a 1M-parameter
model by default, none of a 124M one). The first condition holds whenever the metric
approaches the target monotonically, and whenever it stays reached for the few
iterations to the next scheduled evaluation (a touch that does not last is still
found when it happens in an interval a near look-back scores); the second holds on ``sim`` (PS and
DP), on Ray bulk-synchronous rounds and on gloo while the group's first member
lives (it keeps the copies). On Ray asynchronous runs the driver sees the
iteration (the mean step of asynchronous workers) at its ticks, and keeps what it
sees: when the iteration moves by more than one per tick, an unseen iteration
cannot be scored. Otherwise the reported iteration is the first *evaluated* one
at which the target is reached, never earlier than ``t*``. Every summary states
how exact its own number is: ``target_resolution`` is the distance between the
iteration to target and the last iteration scored before it (1: exact, in the sense
above), ``evaluations`` how many scorings the run made.

**Cost.** Evaluations: ``iterations / every`` as before, plus at most ``after + 1``
per disruption, plus at most ``(NEAR_LOOKS + 1) * (every - 1)`` once (the look-backs).
Copies: one per iteration until the target is reached, at most ``every - 1`` held at
a time and never more than ``lookback_bytes`` together. Where the parameters live in
another process (gloo's first member), the copies stay there and are scored there:
only their scores travel (:mod:`trainthrough.engines.gloo.evals`). Evaluating is free
on ``sim``'s clock, so sim runs keep their bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trainthrough.workloads.base import Evaluation, Params

#: iterations evaluated after a disruption (a failure, or the end of a recovery)
AFTER_DISRUPTION = 3
#: look-backs a run may spend on evaluations near, but not at, the target
NEAR_LOOKS = 2


class EvalAction(Enum):
    """What an engine does with the parameters of the iteration it just finished."""

    SKIP = "skip"
    KEEP = "keep"  # copy them: a later evaluation may look back at them
    EVALUATE = "evaluate"


@dataclass(frozen=True)
class EvalPolicy:
    """The schedule of evaluations (see the module docstring); pure, shared by engines."""

    every: int
    after: int = AFTER_DISRUPTION
    keep_bytes: int = 64 * 2**20  #: what the copies held at a time may take together

    def decide(self, iteration: int, previous: int, target_known: bool,
               disrupted: int | None) -> EvalAction:
        """The action for executed iteration ``iteration``.

        Args:
            iteration: the executed iteration just finished.
            previous: the last iteration the engine finished before it (``iteration -
                1``, except where an engine only sees iterations now and then, as Ray's
                asynchronous driver does: a multiple of ``every`` passed in between
                then counts as due now).
            target_known: the target was already reached.
            disrupted: the latest iteration after which a failure struck or a recovery
                ended (None: none yet).
        """
        if iteration // self.every > previous // self.every:
            return EvalAction.EVALUATE
        if disrupted is not None and disrupted < iteration <= disrupted + self.after:
            return EvalAction.EVALUATE
        return EvalAction.SKIP if target_known else EvalAction.KEEP

    def fits(self, held: int, nbytes: int) -> bool:
        """Whether a copy of ``nbytes`` is kept beside copies of ``held`` bytes (KEEP
        asks for it): the oldest copies of an interval are kept, the rest are not."""
        return held + nbytes <= self.keep_bytes


def near(recent: list[float], target: float) -> bool:
    """Whether the last of ``recent`` (the last three regular evaluations' metrics,
    oldest first) is near ``target``: closer to it than the metric moved over the last
    interval, while progress is steady (that move at least half the one before).

    A metric that moves that much between two evaluations may have touched the target
    in between and come back (noisy SGD does): the interval is worth scoring. While
    each move is less than half the one before, the trend dominates (a fast, monotone
    approach), which the look-back at the target already locates exactly.
    """
    if len(recent) < 3:
        return False
    before, last = abs(recent[-2] - recent[-3]), abs(recent[-1] - recent[-2])
    return abs(recent[-1] - target) <= last and last >= before / 2


@dataclass
class Kept:
    """The parameters of one iteration, kept for a possible look-back; or, where the
    engine scored its copy where it lives (gloo), that score alone (``params`` empty)."""

    iteration: int
    params: Params
    sim_seconds: float
    wall_seconds: float
    extras: dict[str, Any]
    scored: Evaluation | None = None

    @property
    def nbytes(self) -> int:
        return params_bytes(self.params)


def params_bytes(params: Params) -> int:
    """The bytes a copy of ``params`` takes."""
    return sum(v.numel() * v.element_size() for v in params.values())


@dataclass
class Evaluations:
    """One run's evaluation state: what was seen, scored and kept (the acting side of
    :class:`EvalPolicy`; :class:`~trainthrough.engines.base.RunContext` drives it)."""

    policy: EvalPolicy
    kept: list[Kept] = field(default_factory=list)
    observed: int = -1  # the last iteration an engine reported finished
    scored: int = -1  # the last iteration evaluated
    disrupted: int | None = None
    count: int = 0  # evaluations made
    recent: list[float] = field(default_factory=list)  # metrics of the last regular ones
    near_looks: int = 0  # look-backs the margin triggered so far

    def decide(self, iteration: int, target_known: bool) -> EvalAction:
        """The policy's action for ``iteration``; an iteration seen before is skipped."""
        if iteration <= self.observed:
            return EvalAction.SKIP
        previous, self.observed = self.observed, iteration
        return self.policy.decide(iteration, previous, target_known, self.disrupted)

    def keep(self, kept: Kept) -> bool:
        """Hold ``kept`` if it fits beside what is held (:meth:`EvalPolicy.fits`);
        whether it was."""
        if not self.policy.fits(sum(k.nbytes for k in self.kept), kept.nbytes):
            return False
        self.kept.append(kept)
        return True

    def take(self, iteration: int) -> Kept | None:
        """The kept parameters of ``iteration`` (removed), if any."""
        for i, k in enumerate(self.kept):
            if k.iteration == iteration:
                return self.kept.pop(i)
        return None

    def gap(self, iteration: int) -> list[Kept]:
        """The kept iterations after the last evaluation and before ``iteration``,
        oldest first (what a look-back scores)."""
        return sorted((k for k in self.kept if self.scored < k.iteration < iteration),
                      key=lambda k: k.iteration)

    def wants_look_back(self, iteration: int, metric: float, reached: bool,
                        target: float) -> bool:
        """Whether the evaluation of ``metric`` at ``iteration`` first scores the iterations
        since the last evaluation: the target is reached here for the first time, or it
        is not but ``metric`` is within the margin of it (:func:`near`, at regular
        evaluations, at most :data:`NEAR_LOOKS` times a run). Call once per evaluation,
        before recording it."""
        regular = iteration // self.policy.every > self.scored // self.policy.every
        if regular:
            self.recent = (self.recent + [metric])[-3:]
        if iteration - self.scored <= 1:
            return False
        if reached:
            return True
        if regular and self.near_looks < NEAR_LOOKS and near(self.recent, target):
            self.near_looks += 1
            return True
        return False

    def scored_at(self, iteration: int) -> None:
        """``iteration`` was evaluated: what was kept up to it is no longer needed."""
        self.count += 1
        self.scored = max(self.scored, iteration)
        self.observed = max(self.observed, iteration)
        self.kept = [k for k in self.kept if k.iteration > iteration]
