"""Data-parallel fault-tolerance policies: recovery, elasticity, replacement.

Policies decide, engines act. Call order, for any data-parallel engine:

1. once: :func:`group_recovery_policy` for the strategy, :class:`ElasticPolicy` and
   :class:`ReplacementPolicy` for the run;
2. before every step: ``ElasticPolicy.decide(live)`` sizes the global batch and the
   learning rate for the ranks alive now;
3. on a failure: ``GroupRecoveryPolicy.decide(GroupFailure)`` returns a
   :class:`~trainthrough.ft.decisions.GroupRecoveryDecision`; after a re-formation
   ``ReplacementPolicy.decide`` says when replacements join (the group grows back).

The three recovery policies follow Nicolae et al. (CCGrid'22, REFERENCE.md §3).
Every decision is a frozen value computed from a few numbers: no tensors, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from trainthrough.errors import UserError
from trainthrough.ft.decisions import (
    ElasticDecision,
    GroupRecoveryDecision,
    RecoveryAction,
    ReplacementDecision,
)

Phase = Literal["boundary", "forward", "backward", "allreduce", "update", "inner", "outer"]
ELASTIC = ("keep-global", "keep-local")


@dataclass(frozen=True)
class GroupFailure:
    """What a policy is told about a failure.

    ``phase``: where the group's step in flight stood (``boundary`` = nothing in
    flight: between two steps, or after the commit, :func:`~trainthrough.dp.step.group_phase`);
    ``buckets_done``: allreduce buckets that completed with every rank's share. No
    survivor has applied an uncommitted step (the update follows the commit).
    """

    failed: tuple[int, ...]
    survivors: int
    phase: Phase = "boundary"
    buckets_done: int = 0
    have_checkpoint: bool = False


class GroupRecoveryPolicy(Protocol):
    """Decides how a data-parallel group recovers from lost ranks."""

    def decide(self, failure: GroupFailure) -> GroupRecoveryDecision: ...


def _restart(f: GroupFailure) -> GroupRecoveryDecision:
    return GroupRecoveryDecision(RecoveryAction.ROLLBACK_ALL, f.failed, rewind=True,
                                 from_checkpoint=f.have_checkpoint)


class CheckpointRestart:
    """Every rank restarts from the last checkpoint; failed ranks are replaced first.

    Loses the steps since that checkpoint (half an interval on average) plus the
    restart; needs no spare state in memory.
    """

    def decide(self, failure: GroupFailure) -> GroupRecoveryDecision:
        return _restart(failure)


class MiniBatchRollback:
    """Survivors drop the interrupted step and redo that global mini-batch.

    No checkpoint is read and nothing is lost: at most one step of rework. Nothing
    is undone either, since no survivor applied an uncommitted step: a failure-free
    step costs nothing extra (Nicolae et al. copy the state before each update).
    With no survivor there is nobody to copy from: fall back to a restart.
    """

    def decide(self, failure: GroupFailure) -> GroupRecoveryDecision:
        if failure.survivors == 0:
            return _restart(failure)
        in_step = failure.phase != "boundary"
        return GroupRecoveryDecision(RecoveryAction.MINI_BATCH_ROLLBACK, failure.failed,
                                     reform=True, redo_step=in_step)


class LossyForward:
    """Finish the interrupted step with what arrived; carry on.

    The failed ranks' share of the interrupted step is dropped (buckets reduced
    before the failure keep it), so the model takes a slightly different step: the
    perturbation. Nothing is redone and nothing is read.
    """

    def decide(self, failure: GroupFailure) -> GroupRecoveryDecision:
        if failure.survivors == 0:
            return _restart(failure)
        return GroupRecoveryDecision(RecoveryAction.LOSSY_FORWARD, failure.failed, reform=True,
                                     complete_step=failure.phase != "boundary")


class DropLocal:
    """Relaxed sync (LocalSGD, DiLoCo): the lost replicas' local steps since their last
    outer step are dropped; the survivors keep theirs, nobody rolls back.

    Lost during inner steps (``boundary``, ``inner``): the survivors re-form at the
    next outer step, which averages without the lost replicas. Lost at ``outer``: no
    member applied the outer step before its collective completed, so it is run again
    on the survivors (``redo_step``). With no survivor: a restart.
    """

    def decide(self, failure: GroupFailure) -> GroupRecoveryDecision:
        if failure.survivors == 0:
            return _restart(failure)
        return GroupRecoveryDecision(RecoveryAction.DROP_LOCAL, failure.failed, reform=True,
                                     redo_step=failure.phase == "outer")


def group_recovery_policy(recovery: str) -> GroupRecoveryPolicy:
    """The policy for a strategy's ``recovery`` choice.

    Raises:
        UserError: a recovery that only exists for the parameter server.
    """
    policies: dict[str, type] = {"rollback-all": CheckpointRestart,
                                 "mini-batch-rollback": MiniBatchRollback,
                                 "lossy-forward": LossyForward, "drop-local": DropLocal}
    if recovery not in policies:
        raise UserError(f"recovery {recovery!r} is for the parameter server; data-parallel "
                        f"runs use one of: {', '.join(policies)}")
    return policies[recovery]()  # type: ignore[no-any-return]


class ElasticPolicy:
    """What a smaller (or regrown) group trains on.

    ``keep-global``: the global batch stays ``ranks * batch_size``, so each survivor
    takes a larger share and the optimization is unchanged. ``keep-local``: each rank
    keeps ``batch_size``, the global batch shrinks with the group and the learning
    rate is scaled by the same factor (the linear scaling rule).
    """

    def __init__(self, mode: str, ranks: int, batch_size: int) -> None:
        if mode not in ELASTIC:
            raise UserError(f"elastic must be one of {', '.join(ELASTIC)} (got {mode!r})")
        self.mode, self.ranks, self.batch_size = mode, ranks, batch_size

    def decide(self, live: int) -> ElasticDecision:
        if self.mode == "keep-global" or live >= self.ranks:
            return ElasticDecision(live, self.ranks * self.batch_size, 1.0)
        return ElasticDecision(live, live * self.batch_size, live / self.ranks)


class ReplacementPolicy:
    """Failed ranks come back ``delay`` simulated seconds after the failure (if enabled)."""

    def __init__(self, enabled: bool, delay: float) -> None:
        self.enabled, self.delay = enabled, delay

    def decide(self, failed: tuple[int, ...], now: float) -> ReplacementDecision | None:
        if not self.enabled or not failed:
            return None
        return ReplacementDecision(tuple(sorted(failed)), now + self.delay)


class StragglerPolicy:
    """``straggler_deadline``: the group commits a step without a member it waited for
    longer than the deadline (None: it waits, up to the collective timeout).

    What each member says of the collective that broke (how long it waited in it)
    tells who was late: the members that reached it waited the whole deadline for the
    others; a member that came after they had given up found the group closed at once.
    So when some member waited the deadline out, the ones that did not are the
    stragglers, unless nobody did (then nobody was late: a death broke the group).
    """

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def decide(self, waited: dict[int, float]) -> tuple[int, ...]:
        """The members to drop, by slot, from each reporting member's wait in seconds."""
        if self.deadline is None or not any(w >= self.deadline for w in waited.values()):
            return ()
        return tuple(sorted(s for s, w in waited.items() if w < self.deadline))
