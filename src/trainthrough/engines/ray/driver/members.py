"""One actor of a run as the driver sees it, and its life cycle.

A :class:`Member` is in exactly one :class:`MemberState` at a time. :data:`TRANSITIONS`
lists every change of state the driver makes, and :meth:`Member.transition` is the only
way to make one: it refuses any other with :class:`MemberStateError`. A member's death
is seen once, so DEAD is final; a dead member's place is taken by a new member.

The fields that mean something only in some states follow the state:

* ``whoami`` and ``setup``: refs pending until the member is first seen ready
  (:meth:`~trainthrough.engines.ray.driver.cluster.RayCluster.ready` clears them);
* ``killed_at``: None while SPARE, STARTING or SERVING; when the driver killed it
  (entering KILLED), or when its death was seen (entering DEAD without a kill);
* ``killed_from``: the state a KILLED (or later DEAD) member was killed in;
* ``watch``: the pending ``watch`` call, armed at creation; None once DEAD, or once
  Ray reported a serving replica dead while ZooKeeper has not confirmed it yet;
* ``strike``: what the driver recorded when a failure it injected killed the member
  (None for a member that died on its own or was fenced).

Which members count where: :attr:`Member.alive` (neither killed nor dead: may be
struck, is told of changes, goes back to the pool), :attr:`Member.serving` (in service
and not killed) and :attr:`Member.in_service` (put in service and its death not seen
yet, though it may have been killed meanwhile: such a replica still holds its chain
place until its death is handled).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from trainthrough.engines.signals import ProcessIdentity
from trainthrough.workloads.base import Params


class MemberState(Enum):
    """Where a member is in its life cycle."""

    SPARE = "spare"  #: a warm shard actor, not assigned to any shard yet
    STARTING = "starting"  #: assigned; starting, or waiting for its down time to end
    SERVING = "serving"  #: in service
    KILLED = "killed"  #: killed by the driver; its death not seen yet
    DEAD = "dead"  #: its death seen and handled (final)


_S = MemberState
#: Every change of state the driver makes, and why.
TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    _S.SPARE: frozenset({_S.STARTING}),  # taken to replace a lost replica
    _S.STARTING: frozenset({_S.SERVING,  # put in service (start-up, or its down time over)
                            _S.KILLED,  # a failure struck it during its recovery
                            _S.DEAD}),  # it died starting
    _S.SERVING: frozenset({_S.KILLED,  # a failure struck it, or it was fenced
                           _S.DEAD}),  # it died on its own
    _S.KILLED: frozenset({_S.DEAD}),  # its death seen
    _S.DEAD: frozenset(),
}


class MemberStateError(RuntimeError):
    """A change of state :data:`TRANSITIONS` does not allow (a bug in the driver)."""


class OutageWork(NamedTuple):
    """The workers' seconds with a shard unreachable so far, summed over workers."""

    busy: float  #: spent computing
    total: float  #: spent in all


@dataclass(frozen=True)
class Strike:
    """What the driver recorded when a failure it injected killed a member."""

    iteration: int  #: the (executed) iteration the failure struck at
    before: Params | None  #: the parameters just before (shards only)
    work: OutageWork  #: the workers' outage work at the kill (for the busy share)
    #: a shard's version at the kill, between bulk-synchronous rounds (worker-copy's
    #: replay checks against it); None otherwise
    version: int | None = None


@dataclass(eq=False)
class Member:
    """One actor of the run: what it is, its handle, process, death watch and state."""

    kind: str  #: "shard" or "worker"
    index: int  #: shard id or worker id (a spare's is meaningless until it is taken)
    name: str
    handle: Any
    state: MemberState = MemberState.STARTING
    pool_key: tuple[str, ...] = ()  #: what a pooled actor of its kind needs (pool.py)
    proc: ProcessIdentity | None = None  #: set once identified on this node
    whoami: Any = None  #: pending ref: (pid, node id)
    setup: list[Any] = field(default_factory=list)  #: refs to finish before it serves
    watch: Any = None  #: pending ``watch`` call: fails the moment the process dies
    #: a spare started when a replacement took the previous one: when (perf_counter)
    #: that failure struck, until this one is seen ready (``RayCluster.refilled``)
    refill_since: float | None = None
    strike: Strike | None = None
    killed_at: float | None = field(default=None, init=False)
    killed_from: MemberState | None = field(default=None, init=False)

    def transition(self, to: MemberState, at: float | None = None) -> None:
        """Go to state ``to``; ``at``: when (``time.perf_counter``; None: now), recorded
        as ``killed_at`` on entering KILLED, or DEAD if it was not killed first.

        Raises:
            MemberStateError: :data:`TRANSITIONS` has no such change from this state.
        """
        if to not in TRANSITIONS[self.state]:
            allowed = ", ".join(sorted(s.value for s in TRANSITIONS[self.state])) or "none"
            raise MemberStateError(
                f"{self.kind} {self.name} cannot go from {self.state.value} to {to.value} "
                f"(from {self.state.value}: {allowed})")
        now = time.perf_counter() if at is None else at
        if to is MemberState.KILLED:
            self.killed_at, self.killed_from = now, self.state
        elif to is MemberState.DEAD:
            if self.killed_at is None:
                self.killed_at = now
            self.watch = None
        self.state = to

    @property
    def alive(self) -> bool:
        """Neither killed nor seen dead."""
        return self.state not in (MemberState.KILLED, MemberState.DEAD)

    @property
    def serving(self) -> bool:
        """In service and not killed."""
        return self.state is MemberState.SERVING

    @property
    def in_service(self) -> bool:
        """Put in service and its death not seen yet (it may have been killed)."""
        return self.state is MemberState.SERVING or (
            self.state is MemberState.KILLED and self.killed_from is MemberState.SERVING)

    @property
    def down_since(self) -> float:
        """When it was killed, or seen dead if it was not (KILLED and DEAD only).

        Raises:
            MemberStateError: it is neither.
        """
        if self.killed_at is None:
            raise MemberStateError(f"{self.kind} {self.name} is {self.state.value}, "
                                   "not killed or dead")
        return self.killed_at
