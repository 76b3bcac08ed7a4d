"""The ``sim`` host of the parameter-server checkpointer: shards' saves on a virtual clock.

What is saved and how it is restored is :mod:`trainthrough.ft.shard_checkpoint` (one
per shard, the same code the Ray shard actors run); when to save and the accounting is
:class:`~trainthrough.ft.checkpointer.Checkpointer`. This module only times the writes:
sync blocks training for ``bytes / storage_bandwidth``; async blocks for an in-memory
snapshot and the save exists ``bytes / storage_bandwidth`` later (never two at once; a
failure abandons a write in flight, so recovery never sees a save that was not complete
before the crash). A restore charges the bytes it read.
"""

from __future__ import annotations

from collections.abc import Callable

from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.cluster import SimCluster
from trainthrough.engines.sim.persist import Persister
from trainthrough.errors import CheckpointWriteFailed
from trainthrough.events import CheckpointAbandoned
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ft.checkpointer import Checkpointer, Emit, SaveReport
from trainthrough.ft.checkpointing import CheckpointPolicy
from trainthrough.ft.decisions import CheckpointDecision
from trainthrough.ft.shard_checkpoint import ShardCheckpoint, restore_together


class SimShardSaves:
    """Save backend: every shard's :class:`ShardCheckpoint`, timed by a :class:`Persister`."""

    def __init__(self, cluster: SimCluster, store: CheckpointStore, clock: VirtualClock,
                 costs: Costs, seed: int) -> None:
        self.c, self.clock, self.costs = cluster, clock, costs
        self.savers = [ShardCheckpoint(s, x0, store, seed)
                       for s, x0 in zip(cluster.shards, cluster.x0_parts)]
        self.persist = Persister(clock, costs)

    def save(self, d: CheckpointDecision, iteration: int,
             done: Callable[[SaveReport], None]) -> None:
        plans = [(s, p) for s in self.savers if (p := s.plan(d, iteration)) is not None]
        if not plans:
            return  # no shard has credit for a row yet
        payload = sum(p.payload_bytes for _, p in plans)

        def finish(blocked: float) -> None:
            infos, errors = [], []
            for s, p in plans:
                try:
                    infos.append(s.write(p))
                except CheckpointWriteFailed as e:  # reported as Ray's shards report it
                    errors.append(str(e))
            done(SaveReport(sum(i.nbytes for i in infos), payload, blocked,
                            [i.name for i in infos], errors))

        self.persist.write(payload, d.asynchronous, finish)


class SimCheckpointer:
    """The engine's view: save on the policy's schedule, restore shards on a failure."""

    def __init__(self, cluster: SimCluster, policy: CheckpointPolicy, clock: VirtualClock,
                 costs: Costs, emit: Emit, seed: int = 0) -> None:
        self.c, self.clock, self.costs = cluster, clock, costs
        self.backend = (SimShardSaves(cluster, cluster.store, clock, costs, seed)
                        if cluster.store is not None else None)
        self.checkpointer = Checkpointer(policy, self.backend or _NoSaves(), emit)

    # -- saving -----------------------------------------------------------------
    @property
    def blocked(self) -> float:
        """Seconds training stalled for saves (the persister's: it includes writes a
        failure abandoned, which the checkpointer never counts)."""
        return self.backend.persist.blocked if self.backend else 0.0

    def flush_due(self) -> None:
        if self.backend is not None:
            self.backend.persist.flush_due()

    def after_iteration(self, logical: int) -> None:
        """Finish a write that is due, then let the policy decide about ``logical``."""
        self.flush_due()
        self.checkpointer.after_iteration(logical)

    def drop_pending(self) -> None:
        """A failure struck: a write still in flight never completes."""
        if self.backend is not None and self.backend.persist.drop():
            self.checkpointer.emit(CheckpointAbandoned())

    # -- restoring --------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.backend is not None and any(s.has_checkpoint() for s in self.backend.savers)

    def restore(self, shard_ids: list[int], on_corrupt: Callable[[str], None]) -> int | None:
        """Restore ``shard_ids`` from their saves; return the iteration restored to.

        Several shards restored together land on one common step
        (:func:`~trainthrough.ft.shard_checkpoint.restore_together`). Charges the
        bytes read.
        """
        if self.backend is None:
            return None
        savers = [self.backend.savers[i] for i in shard_ids]
        read = 0

        def restore(indices: list[int], at_most: int | None) -> list[int | None]:
            nonlocal read
            steps = [savers[i].restore(on_corrupt, at_most=at_most) for i in indices]
            read += sum(savers[i].read_bytes for i in indices)
            return steps

        steps = restore_together(restore, len(savers),
                                 any(s.store.list(s.prio_tag) for s in savers))
        self.clock.advance(self.costs.storage(read))
        valid = [st for st in steps if st is not None]
        return max(valid) if valid else None


class _NoSaves:
    def save(self, d: CheckpointDecision, iteration: int,
             done: Callable[[SaveReport], None]) -> None:
        return None
