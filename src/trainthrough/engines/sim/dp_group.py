"""The ranks of one simulated data-parallel run, and what a step trains on.

N rank slots, the live ones holding a :class:`~trainthrough.dp.rank.Rank`; a failed
slot is empty until a replacement joins it. The group also owns the data cursor, so
the global batch of a step follows from the cursor and the elastic decision alone
(a checkpoint saves the cursor; a rolled-back step simply does not advance it).
Every rank runs the shared step (:mod:`trainthrough.dp.step`) as a coroutine;
:meth:`SimGroup.drive` runs them together on a simulated collective.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import torch

from trainthrough.dp.allreduce import FlatLayout, plan_buckets
from trainthrough.dp.batching import Cursor, SampleStream, StepBatch, micro_size, plan_batch
from trainthrough.dp.rank import Rank, Replica
from trainthrough.dp.repair import share_state
from trainthrough.dp.simulated import LockStep, Outcome, SimCollective
from trainthrough.errors import UserError
from trainthrough.ft.dp_policies import ElasticPolicy
from trainthrough.workloads.base import OptimizerSpec, Params, Workload

Tensors = dict[str, torch.Tensor]
RankTask = Callable[[Any, SimCollective], Coroutine[Any, Any, Any]]
Wrap = Callable[[Rank], Replica]


class SimGroup:
    """Rank slots ``0..size-1`` of one run, the live ranks and the sample cursor."""

    def __init__(self, workload: Workload, spec: OptimizerSpec, x0: Params, size: int,
                 seed: int, buckets: int | None, elastic: ElasticPolicy,
                 micro_batches: int = 1,
                 wrap: Wrap | None = None) -> None:
        n = workload.sample_count()
        if n is None:
            raise UserError(f"workload {workload.name} does not support data-parallel training "
                            "(it has no compute_update_on); use --paradigm ps, or mlr, cnn "
                            "or a TorchWorkload")
        self.w, self.spec, self.seed, self.size = workload, spec, seed, size
        self.x0 = {k: v.clone() for k, v in x0.items()}
        # What a slot holds: a Rank, or a Rank wrapped with relaxed sync's outer state.
        self._wrap: Wrap = wrap or (lambda r: r)
        self.ranks: dict[int, Replica] = {i: self._new(i) for i in range(size)}
        self.layout = FlatLayout(x0)
        if buckets is not None and not 1 <= buckets <= self.layout.numel:
            raise UserError(f"allreduce-buckets must be between 1 and the {self.layout.numel} "
                            f"parameters of {workload.name} (got {buckets})")
        self.buckets = plan_buckets(self.layout.numel, buckets)
        self.stream = SampleStream(n, seed)
        self.cursor = Cursor()
        self.micro = micro_size(workload.batch_size, micro_batches)
        self.elastic = elastic
        # Fail now, not at the first step, on a global batch larger than the data.
        self.stream.take(self.cursor, elastic.decide(size).global_batch)

    def _new(self, slot: int) -> Replica:
        return self._wrap(Rank(slot, self.w, self.spec, self.x0, self.seed))

    # -- membership -------------------------------------------------------------
    @property
    def live(self) -> list[int]:
        """Live slots in rank order (the order the ring and the update follow)."""
        return sorted(self.ranks)

    def first(self) -> Replica:
        """The lowest live rank: donor for joiners, writer of checkpoints."""
        return self.ranks[self.live[0]]

    def kill(self, slot: int) -> Replica:
        """Slot ``slot`` fails: its replica is gone (returned for measurement only)."""
        return self.ranks.pop(slot)

    def join(self, slots: list[int]) -> int:
        """Replacements join ``slots``: every member runs the shared state transfer
        (a live rank's replica is broadcast). Returns the bytes sent to the joiners."""
        nbytes = self.first().state_bytes * len(slots)
        for s in slots:
            self.ranks[s] = self._new(s)
        quiet = LockStep(on_point=lambda _: None, on_reduce=lambda _b, _n: None)
        self.drive(quiet, lambda r, c: share_state(r, c, [], holder=r.rank_id not in slots))
        return nbytes

    def reset(self, tensors: Tensors | None, cursor: Cursor) -> None:
        """Every slot restarts from ``tensors`` (a checkpoint) or the initial parameters."""
        self.ranks = {i: self._new(i) for i in range(self.size)}
        if tensors is not None:
            for r in self.ranks.values():
                r.load(tensors)
        self.cursor = cursor

    # -- a step -----------------------------------------------------------------
    def plan(self) -> StepBatch:
        """What the live ranks train on now (elastic policy, then contiguous shares)."""
        live = self.live
        d = self.elastic.decide(len(live))
        return plan_batch(self.stream, self.cursor, d.global_batch, d.lr_scale, live, self.micro)

    def drive(self, lockstep: LockStep, task: RankTask) -> Outcome:
        """Run ``task`` on every live rank together, on a fresh simulated group."""
        coll = SimCollective(self.live)
        return lockstep.run(coll, {s: task(self.ranks[s], coll) for s in coll.members})

    def micro_seconds(self, step_seconds: float) -> float:
        """Compute time of one micro-batch, given that of a full per-rank batch."""
        return step_seconds * self.micro / self.w.batch_size

    def compute_seconds(self, batch: StepBatch, step_seconds: float) -> float:
        """Compute time of a step: the busiest rank's micro-batches."""
        return self.micro_seconds(step_seconds) * batch.most_micro

    def params(self) -> Params:
        return self.first().params
