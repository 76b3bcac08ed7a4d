"""The ``sim`` host of the data-parallel checkpointer: the group's saves on a virtual clock.

What is saved and how it is restored is :mod:`trainthrough.ft.dp_checkpoint` (the
same code the gloo ranks run); when to save and the accounting is
:class:`~trainthrough.ft.checkpointer.Checkpointer`, whose backend this is. It only
picks the writer (the lowest live rank) and times the writes with the parameter
server's :class:`~trainthrough.engines.sim.persist.Persister`: sync blocks training
for ``bytes / storage_bandwidth``; async blocks for an in-memory snapshot and the
save exists once the simulated write ends. If the writing rank fails before that,
or the group restarts, the save never completes.
"""

from __future__ import annotations

from collections.abc import Callable

from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.dp_group import SimGroup
from trainthrough.engines.sim.persist import Persister
from trainthrough.errors import CheckpointWriteFailed
from trainthrough.events import CheckpointAbandoned, Event
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ft.checkpointer import Checkpointer, SaveReport
from trainthrough.ft.checkpointing import CheckpointPolicy
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.dp_checkpoint import ReplicaCheckpoint, Restored


class SimDPCheckpoints:
    """Saves on the policy's schedule (``checkpointer`` counts them; ``persist.blocked``
    is the stall, abandoned writes' snapshots included), restores on a restart."""

    def __init__(self, group: SimGroup, store: CheckpointStore | None, policy: CheckpointPolicy,
                 clock: VirtualClock, costs: Costs, emit: Callable[[Event], None]) -> None:
        self.g, self.clock, self.costs, self.emit = group, clock, costs, emit
        self.persist = Persister(clock, costs)
        self.saver = ReplicaCheckpoint(store, group.first()) if store is not None else None
        self.checkpointer = Checkpointer(policy, self, emit)

    # -- saving -----------------------------------------------------------------
    def after_step(self, logical: int) -> None:
        """A step was committed: finish a write that is due, then ask the policy."""
        self.persist.flush_due()
        self.checkpointer.after_iteration(logical)

    def save(self, d: CheckpointDecision, iteration: int,
             done: Callable[[SaveReport], None]) -> None:
        """The backend's call: copy the lowest live replica now, write it on the clock."""
        if self.saver is None:
            return  # the run keeps no checkpoints (its policy never decides to save)
        saver, writer = self.saver, self.g.first()
        p = saver.plan(writer, iteration, self.g.cursor, self.g.live)

        def finish(blocked: float) -> None:
            try:
                info = saver.write(p)
            except CheckpointWriteFailed as e:  # reported as gloo's rank 0 reports it
                done(SaveReport(0, p.payload_bytes, blocked, [], [str(e)]))
                return
            done(SaveReport(info.nbytes, p.payload_bytes, blocked, [info.name]))

        self.persist.write(p.payload_bytes, d.asynchronous, finish, owner=writer.rank_id)

    def save_now(self, logical: int) -> int | None:
        """A just-in-time checkpoint of step ``logical`` (the job got its notice): a full,
        synchronous save no policy asked for. Returns its step, None if none was written
        (no store, or the write failed)."""
        if self.saver is None:
            return None
        before = self.checkpointer.count
        self.save(CheckpointDecision(), logical,
                  lambda r: self.checkpointer.saved_now(logical, r, "preempt"))
        return logical if self.checkpointer.count > before else None

    def rank_failed(self, slot: int) -> None:
        """A write in flight from ``slot`` dies with it."""
        if self.persist.drop(owner=slot):
            self.emit(CheckpointAbandoned(rank=slot))

    # -- restoring --------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.saver is not None and self.saver.exists()

    def restore(self, on_corrupt: Callable[[str], None]) -> Restored | None:
        """The newest valid save (read time charged); None: start over from x0.

        A write still in flight is abandoned: every rank restarts, the writer too.
        The policy is asked again about every iteration after the one restored.
        """
        if self.persist.drop():
            self.emit(CheckpointAbandoned())
        r = self.saver.latest(on_corrupt) if self.saver is not None else None
        if r is not None:
            self.clock.advance(self.costs.storage(r.nbytes))
        self.checkpointer.rewind(r.step if r is not None else 0)
        return r
