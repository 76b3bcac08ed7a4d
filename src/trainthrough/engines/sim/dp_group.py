"""The ranks of one simulated data-parallel run, and what a step trains on.

N rank slots, the live ones holding a :class:`~trainthrough.dp.rank.Rank`; a failed
slot is empty until a replacement joins it. The group also owns the data cursor, so
the global batch of a step follows from the cursor and the elastic decision alone
(a checkpoint saves the cursor; a rolled-back step simply does not advance it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainthrough.dp.allreduce import Contribution, FlatLayout, make_buckets
from trainthrough.dp.batching import (
    Cursor,
    MicroBatch,
    SampleStream,
    assign,
    micro_size,
    split_micro,
)
from trainthrough.dp.rank import Rank
from trainthrough.errors import UserError
from trainthrough.ft.dp_policies import ElasticPolicy
from trainthrough.workloads.base import OptimizerSpec, Params, Workload

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class StepPlan:
    """One step's work: each live slot's micro-batches, the lr multiplier, the next cursor."""

    share: dict[int, list[MicroBatch]]
    lr_scale: float
    next_cursor: Cursor

    @property
    def most_micro(self) -> int:
        """Micro-batches on the busiest rank (it sets the step's compute time)."""
        return max(len(m) for m in self.share.values())


class SimGroup:
    """Rank slots ``0..size-1`` of one run, the live ranks and the sample cursor."""

    def __init__(self, workload: Workload, spec: OptimizerSpec, x0: Params, size: int,
                 seed: int, buckets: int, elastic: ElasticPolicy) -> None:
        n = workload.sample_count()
        if n is None:
            raise UserError(f"workload {workload.name} does not support data-parallel training "
                            "(it has no compute_update_on); use --paradigm ps, or mlr, cnn "
                            "or a TorchWorkload")
        self.w, self.spec, self.seed, self.size = workload, spec, seed, size
        self.x0 = {k: v.clone() for k, v in x0.items()}
        self.ranks: dict[int, Rank] = {i: Rank(i, workload, spec, x0, seed) for i in range(size)}
        self.layout = FlatLayout(x0)
        if not 1 <= buckets <= self.layout.numel:
            raise UserError(f"allreduce-buckets must be between 1 and the {self.layout.numel} "
                            f"parameters of {workload.name} (got {buckets})")
        self.buckets = make_buckets(self.layout.numel, buckets)
        self.stream = SampleStream(n, seed)
        self.cursor = Cursor()
        self.micro = micro_size(workload.batch_size)
        self.elastic = elastic
        self.grad_bytes = 4 * self.layout.numel  # float32 gradients on the wire
        # Fail now, not at the first step, on a global batch larger than the data.
        self.stream.take(self.cursor, elastic.decide(size).global_batch)

    # -- membership -------------------------------------------------------------
    @property
    def live(self) -> list[int]:
        """Live slots in rank order (the order the ring and the update follow)."""
        return sorted(self.ranks)

    def first(self) -> Rank:
        """The lowest live rank: donor for joiners, writer of checkpoints."""
        return self.ranks[self.live[0]]

    def kill(self, slot: int) -> Rank:
        """Slot ``slot`` fails: its replica is gone (returned for measurement only)."""
        return self.ranks.pop(slot)

    def join(self, slot: int) -> int:
        """A replacement joins ``slot`` with a copy of a live rank; returns bytes copied."""
        donor = self.first()
        self.ranks[slot] = Rank.joining(slot, donor)
        return donor.state_bytes

    def reset(self, tensors: Tensors | None, cursor: Cursor) -> None:
        """Every slot restarts from ``tensors`` (a checkpoint) or the initial parameters."""
        self.ranks = {i: Rank(i, self.w, self.spec, self.x0, self.seed) for i in range(self.size)}
        if tensors is not None:
            for r in self.ranks.values():
                r.load(tensors)
        self.cursor = cursor

    # -- a step -----------------------------------------------------------------
    def plan(self) -> StepPlan:
        """What the live ranks train on now (elastic policy, then contiguous shares)."""
        live = self.live
        d = self.elastic.decide(len(live))
        rows, nxt = self.stream.take(self.cursor, d.global_batch)
        micro = split_micro(rows, self.micro)
        share = {s: [micro[j] for j in r] for s, r in zip(live, assign(len(micro), len(live)))}
        return StepPlan(share, d.lr_scale, nxt)

    def compute(self, plan: StepPlan, step: int) -> dict[int, list[Contribution]]:
        """Every planned rank's micro-batch gradients."""
        return {s: self.ranks[s].gradients(step, mb) for s, mb in plan.share.items()}

    def micro_seconds(self, step_seconds: float) -> float:
        """Compute time of one micro-batch, given that of a full per-rank batch."""
        return step_seconds * self.micro / self.w.batch_size

    def params(self) -> Params:
        return self.first().params
