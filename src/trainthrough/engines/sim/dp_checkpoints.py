"""Checkpoints of a simulated data-parallel group: one replica, written by one rank.

Every live rank holds the same state, so a checkpoint is the lowest live rank's
parameters and optimizer state (safetensors through :class:`CheckpointStore`) plus
the data cursor in the manifest, which is what a restart needs to replay the same
batches. Sync: training blocks for ``bytes / storage_bandwidth``. Async: it blocks
only for an in-memory snapshot and the checkpoint exists once the simulated write
ends; if the writing rank fails before that, the checkpoint never completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainthrough.dp.batching import Cursor
from trainthrough.dp.rank import Rank
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.dp_group import SimGroup
from trainthrough.engines.sim.persist import Persister
from trainthrough.ft.checkpoint import CheckpointStore, require_ints
from trainthrough.ft.checkpointing import CheckpointPolicy

Tensors = dict[str, torch.Tensor]


class DPCheckpointer:
    """Carries out the checkpoint policy for a group; restores what it saved."""

    def __init__(self, group: SimGroup, store: CheckpointStore | None, policy: CheckpointPolicy,
                 clock: VirtualClock, costs: Costs, emit: Callable[[dict[str, Any]], None]) -> None:
        self.g, self.store, self.policy = group, store, policy
        self.clock, self.costs, self.emit = clock, costs, emit
        self.count = 0
        self.bytes = 0
        self.persist = Persister(clock, costs)

    @property
    def blocked(self) -> float:
        return self.persist.blocked

    def flush_due(self) -> None:
        """Complete a background write whose simulated time is up."""
        self.persist.flush_due()

    def after_step(self, logical: int) -> None:
        """Ask the policy after a committed step; save if it says so."""
        self.flush_due()
        decision = self.policy.decide(logical)
        if decision is None or self.store is None:
            return
        writer = self.g.first()
        tensors = writer.state()
        c = self.g.cursor
        meta = {"iteration": logical, "epoch": c.epoch, "offset": c.offset,
                "ranks": self.g.live, "workload": self.g.w.name}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())

        def finish(blocked: float = 0.0) -> None:
            info = self.store.save(logical, tensors, meta)  # type: ignore[union-attr]
            self.count += 1
            self.bytes += info.nbytes
            self.emit({"type": "checkpoint", "iteration": logical, "bytes": info.nbytes,
                       "blocked_seconds": blocked, "async": decision.asynchronous,
                       "rank": writer.rank_id, "name": info.name})

        self.persist.write(nbytes, decision.asynchronous, finish, owner=writer.rank_id)

    def rank_failed(self, slot: int) -> None:
        """A write in flight from ``slot`` dies with it."""
        if self.persist.drop(owner=slot):
            self.emit({"type": "checkpoint-abandoned", "rank": slot})

    def has_checkpoint(self) -> bool:
        return self.store is not None and bool(self.store.list())

    def restore(self, on_corrupt: Callable[[str], None]) -> tuple[Tensors, int, Cursor] | None:
        """The newest valid checkpoint: tensors, iteration and data cursor (read time charged).

        A write still in flight is abandoned: every rank restarts, the writer too.
        """
        if self.persist.drop():
            self.emit({"type": "checkpoint-abandoned"})
        if self.store is None:
            return None
        # Exactly a fresh replica's tensors, and the cursor fields: anything else is a
        # corrupt checkpoint, reported and skipped for the one before it.
        like = Rank(0, self.g.w, self.g.spec, self.g.x0, self.g.seed).state()
        loaded = self.store.load_latest(on_corrupt=on_corrupt, like=like,
                                        check=require_ints("epoch", "offset"))
        if loaded is None:
            return None
        tensors, info = loaded
        self.clock.advance(self.costs.storage(info.nbytes))
        cursor = Cursor(info.meta["epoch"], info.meta["offset"])
        return tensors, info.step, cursor
