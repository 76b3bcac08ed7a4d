"""Taking checkpoints in the simulated cluster, synchronously or in the background.

Sync: training blocks while the full state is written (storage time is charged as
blocked time). Async: training blocks only for an in-memory snapshot; the persist
finishes ``bytes / storage_bandwidth`` simulated seconds later, and only then does
the checkpoint exist. A second persist never overlaps the first (it waits, and the
wait is charged as blocked), and a failure abandons a persist still in flight, so
recovery never sees a checkpoint that was not complete before the crash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.cluster import SimCluster
from trainthrough.ft.checkpointing import CheckpointPolicy


class SimCheckpointer:
    """Carries out the checkpoint policy's decisions."""

    def __init__(self, cluster: SimCluster, policy: CheckpointPolicy, clock: VirtualClock,
                 costs: Costs, emit: Callable[[dict[str, Any]], None]) -> None:
        self.c = cluster
        self.policy = policy
        self.clock = clock
        self.costs = costs
        self.emit = emit
        self.count = 0
        self.bytes = 0
        self.blocked = 0.0
        self._pending: tuple[float, int, dict[str, torch.Tensor]] | None = None

    def _meta(self) -> dict[str, Any]:
        return {"layout": self.c.layout.to_dict(), "workload": self.c.workload.name}

    def _persist(self, step: int, tensors: dict[str, torch.Tensor], blocked: float,
                 asynchronous: bool) -> None:
        assert self.c.store is not None
        info = self.c.store.save(step, tensors, self._meta())
        self.count += 1
        self.bytes += info.nbytes
        self.emit({"type": "checkpoint", "iteration": step, "bytes": info.nbytes,
                   "blocked_seconds": blocked, "async": asynchronous, "name": info.name})

    def flush_due(self) -> None:
        """Complete a background persist whose simulated write has finished."""
        if self._pending is not None and self._pending[0] <= self.clock.now:
            _, step, tensors = self._pending
            self._pending = None
            self._persist(step, tensors, 0.0, True)

    def after_iteration(self, logical: int) -> None:
        """Finish a persist that is due, then ask the policy whether to save now."""
        self.flush_due()
        decision = self.policy.decide(logical)
        if decision is None or self.c.store is None:
            return
        tensors = self.c.state_tensors()
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if not decision.asynchronous:
            blocked = self.costs.storage(nbytes)
            self.clock.advance(blocked)
            self.blocked += blocked
            self._persist(logical, tensors, blocked, False)
            return
        wait = 0.0
        if self._pending is not None:  # never two persists at once: wait for the first
            wait = max(0.0, self._pending[0] - self.clock.now)
            self.clock.advance(wait)
            _, step, old = self._pending
            self._pending = None
            self._persist(step, old, wait, True)
        snap = nbytes / self.costs.m.memory_bandwidth
        self.clock.advance(snap)
        self.blocked += wait + snap
        self._pending = (self.clock.now + self.costs.storage(nbytes), logical, tensors)

    def drop_pending(self) -> None:
        """A failure struck: a persist still in flight never completes."""
        if self._pending is not None:
            self.emit({"type": "checkpoint-abandoned", "iteration": self._pending[1]})
            self._pending = None
