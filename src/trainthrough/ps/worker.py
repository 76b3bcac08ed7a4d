"""One parameter-server worker: its data partition, its local state, its clock.

A worker is a thin holder around the workload's ``compute_update``; what makes it a
component is that it can fail (losing ``state``) and that it counts its pushes with
a sequence number, so a server can drop a re-delivered push.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from trainthrough.workloads.base import Params, Workload


def step_seed(run_seed: int, worker_id: int, step: int) -> int:
    """The sampling seed of a worker at a logical step (same on a replayed step)."""
    return (run_seed * 1_000_003 + worker_id * 7_919 + step * 104_729) % (2**63 - 1)


@dataclass(frozen=True)
class WorkerCopy:
    """What one worker last pulled.

    ``params``: full-shape tensors (rows not pulled may hold anything); ``versions``:
    each shard's version at the pull (the number of updates it had applied);
    ``held``: per parameter, a boolean mask of the rows pulled (None: every row);
    ``pushed``: the update the worker computed from it, split per shard (None: not
    pushed yet, or not kept). Tensors are read-only: nothing changes them once kept.
    """

    worker: int
    versions: tuple[int, ...]
    params: Params
    held: Params | None = None
    pushed: list[Params] | None = None

    def holds(self, name: str) -> torch.Tensor | None:
        """The row mask of ``name`` (None: every row)."""
        return None if self.held is None else self.held.get(name)


class Worker:
    """Computes updates for one data partition."""

    def __init__(self, worker_id: int, workload: Workload, data: Any, run_seed: int) -> None:
        self.worker_id = worker_id
        self.workload = workload
        self.data = data
        self.run_seed = run_seed
        self.state: Any = None
        self.clock = 0  # logical steps completed (SSP uses it)
        self.seq = 0  # pushes sent, for de-duplication of re-delivered pushes
        # The parameters last pulled, kept for worker-copy recovery (None: not kept,
        # or lost with the worker's memory).
        self.copy: WorkerCopy | None = None

    def start(self, params: Params, incarnation: int = 0) -> None:
        """(Re)build local state, e.g. after a crash: everything in memory is gone."""
        self.copy = None
        gen = torch.Generator().manual_seed(step_seed(self.run_seed, self.worker_id, -1 - incarnation))
        self.state = self.workload.init_worker_state(self.worker_id, self.data, params, gen)

    def compute(self, params: Params, step: int) -> Params:
        """The update for logical step ``step`` from ``params``."""
        seed = step_seed(self.run_seed, self.worker_id, step)
        update = self.workload.compute_update(params, self.data, self.state, step, seed)
        self.seq += 1
        return update

    def keep(self, params: Params, versions: tuple[int, ...],
             held: Params | None = None) -> None:
        """Keep the parameters just pulled (not copied: the caller hands over tensors
        no one changes) with each shard's version at the pull."""
        self.copy = WorkerCopy(self.worker_id, versions, params, held)

    def keep_push(self, parts: list[Params]) -> None:
        """Keep the push (per shard) just computed from the kept copy: a bulk-synchronous
        recovery replays the round from it (ft/worker_copy.py's ``replay``)."""
        if self.copy is not None:
            self.copy = replace(self.copy, pushed=parts)
