"""The states of the data-parallel group as the ``dist`` controller sees it.

:class:`~.recovery.DistRecovery` is in exactly one :class:`GroupState` at a time;
:data:`TRANSITIONS` lists every change it makes, and ``DistRecovery._to`` is the only way
to make one: it refuses any other with :class:`GroupStateError`. Which of its fields
mean something in which state:

* ``waiting``, ``started_at``: STARTING only (the processes spawned, and when);
* ``members``, ``n``: the group of attempt ``n``, from TRAINING on (a restart's
  STARTING keeps the broken group's until the fresh processes are ready);
* ``first_sign``, ``first_timeout``: REPORTING only (None otherwise): when the group
  was first seen broken, and when the first report that its collective timed out came;
* ``joiners``, ``change_requested``: warm replacements, and whether the group was asked
  to stop after a step (to take them in, to let ranks with a preemption notice go, or
  to stop with a just-in-time save); cleared by a restart;
* ``drains``: the ranks' preemption notices, in any state; ``jit``, ``stopped``,
  ``stop_logical``, ``all_drained``: the job stops with a just-in-time save (once its
  ``stop`` plan is out, ``members`` is empty and ``stopped`` the members it stopped);
* ``log.open`` (:class:`~.ledger.RecoveryLog`): the recoveries decided and not yet
  ended by a commit (:class:`OpenRecovery`), in any state: a failure during a recovery
  opens a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class GroupState(Enum):
    """Where the group is in its life cycle."""

    NEW = "new"  #: nothing spawned yet
    STARTING = "starting"  #: processes spawned; the attempt starts once all are ready
    TRAINING = "training"  #: a group is running: watch for reports and deaths
    REPORTING = "reporting"  #: the group ended (a report or a death): wait for the reports


_S = GroupState
#: Every change of state the controller makes, and why.
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    _S.NEW: frozenset({_S.STARTING}),  # the run's first processes (fresh, or resumed)
    _S.STARTING: frozenset({_S.TRAINING}),  # every process ready: the start plan is out
    _S.TRAINING: frozenset({_S.REPORTING}),  # a member reported, or a process died
    _S.REPORTING: frozenset({_S.TRAINING,  # re-formed with the survivors, or grown
                             _S.STARTING}),  # checkpoint-restart: fresh processes
}


class GroupStateError(RuntimeError):
    """A change of state :data:`TRANSITIONS` does not allow (a bug in the controller)."""


@dataclass
class OpenRecovery:
    """A recovery the controller decided, open until the group's first commit after it.

    ``n``: the attempt that carries it out (a re-formation; None for a restart, whose
    attempt the fresh processes start); ``perturbation``: measured by that attempt's
    first member, or from the checkpoint a restart chose (NaN: unknown, the attempt broke
    before it said); ``restored_from``: the step a restart loaded.
    """

    failed: list[int]
    iteration: int
    logical: int
    t_fail: float
    t_detect: float
    action: str
    phase: str
    n: int | None = None
    restart: bool = False
    perturbation: float = math.nan
    restored_from: int | None = None
