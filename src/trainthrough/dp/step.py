"""The data-parallel step, written once for every host, and the points it names.

A step, as one rank sees it (call order, each ``inj.at`` an injection point):

1. ``boundary``: nothing of the step done yet;
2. gradients of the first half of its micro-batches, ``forward``, the second half,
   ``backward``;
3. for each bucket ``K`` in order: ``allreduce:K``, then the bucket's allreduce;
4. a copy of the replica if the strategy must be able to undo the update;
   ``update``; apply the averaged gradient;
5. the commit vote. The step is committed once the vote succeeded; the host then
   advances the cursor and counts it.

The :class:`InFlight` record is filled in as the step goes, so when a peer is lost
(:class:`~trainthrough.dp.collective.PeerLost`, raised located) it says exactly how
far this rank got: that is what recovery (:mod:`trainthrough.dp.repair`) works
with. The step takes the collective and the injector as arguments: ``sim`` and
gloo host it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from trainthrough.dp.allreduce import Bucket, Contribution
from trainthrough.dp.batching import StepBatch
from trainthrough.dp.collective import Collective, Injector, PeerLost
from trainthrough.dp.rank import Replica, Tensors
from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec

# The injection points of a step, in order ("allreduce" stands for allreduce:K).
POINTS = ("boundary", "forward", "backward", "allreduce", "update")


@dataclass(frozen=True)
class StepSpec:
    """What is fixed for a run: the buckets, mean or sum, whether to snapshot."""

    buckets: tuple[Bucket, ...]
    mean: bool  # divide by the micro-batches that contributed (workload aggregate "mean")
    snapshot: bool  # copy the replica before each update (policy needs_step_snapshot)


@dataclass
class InFlight:
    """One rank's attempt at logical step ``logical``, as far as it got."""

    batch: StepBatch
    logical: int
    reduced: torch.Tensor  # NaN in every bucket not reduced yet
    contribs: list[Contribution] = field(default_factory=list)
    phase: str = "boundary"  # the last point passed
    buckets_done: int = 0
    applied: bool = False
    snapshot: Tensors | None = None

    @classmethod
    def begin(cls, batch: StepBatch, logical: int, numel: int) -> InFlight:
        return cls(batch, logical, torch.full((numel,), float("nan")))

    def reduce_into(self, bucket: Bucket, total: torch.Tensor, count: int, mean: bool) -> None:
        """Store a bucket's sum (divided by the ``count`` micro-batches if ``mean``)."""
        self.reduced[bucket.start:bucket.stop] = total / count if mean else total


async def train_step(rank: Replica, fl: InFlight, coll: Collective, inj: Injector,
                     spec: StepSpec, step: int,
                     ballot: Callable[[], float] = lambda: 0.0) -> float:
    """Run one step of ``rank`` on ``fl.batch`` (see the module docstring for the order).

    Args:
        rank: this rank's replica; ``fl``: a fresh :meth:`InFlight.begin` record.
        coll, inj: the host's group and failure injector.
        step: attempts executed before this one (what failure triggers count).
        ballot: this rank's value in the commit vote, read just before it (gloo:
            the controller's request counter on the first member).

    Returns:
        The vote's sum. The caller commits: cursor to ``fl.batch.next_cursor``.

    Raises:
        PeerLost: located at the phase, buckets and update state ``fl`` records.
    """
    try:
        return await _step(rank, fl, coll, inj, spec, step, ballot)
    except PeerLost as e:
        raise e.located(fl.phase, fl.buckets_done, fl.applied) from None


async def _step(rank: Replica, fl: InFlight, coll: Collective, inj: Injector, spec: StepSpec,
                step: int, ballot: Callable[[], float]) -> float:
    await inj.at("boundary", step)
    mine = fl.batch.share[rank.rank_id]
    half = len(mine) // 2
    fl.phase = "forward"
    fl.contribs = rank.gradients(fl.logical, mine[:half])
    await inj.at("forward", step)
    fl.phase = "backward"
    fl.contribs += rank.gradients(fl.logical, mine[half:])
    await inj.at("backward", step)
    fl.phase = "allreduce"
    count = fl.batch.micro_count
    for b in spec.buckets:
        await inj.at(f"allreduce:{b.index}", step)
        fl.reduce_into(b, await coll.allreduce(fl.contribs, b), count, spec.mean)
        fl.buckets_done = b.index + 1
    if spec.snapshot:  # to undo an update a failure cuts short
        fl.snapshot = rank.state()
    fl.phase = "update"
    await inj.at("update", step)
    rank.apply(fl.reduced, fl.batch.lr_scale)
    fl.applied = True
    return await coll.vote(ballot())


def check_points(specs: list[FailureSpec], buckets: int, phases: Collection[str],
                 engine: str) -> None:
    """Refuse failure specs naming a point this host cannot strike at.

    Args:
        phases: the host's declared failure phases (its ``CAPABILITIES``): ``""``
            between steps, step points (``allreduce`` for every ``allreduce:K``) and
            host points such as ``recovery``.
        buckets: the run's bucket count B (``K`` goes from 0 to B-1).

    Raises:
        UserError: naming the spec and the phases to use instead.
    """
    for s in specs:
        p = s.phase
        if p is None:
            continue
        if p.startswith("allreduce:") and "allreduce" in phases:
            if int(p[len("allreduce:"):]) >= buckets:
                raise UserError(f"failure spec {s.text!r}: the allreduce has {buckets} buckets, "
                                f"so K in allreduce:K goes from 0 to {buckets - 1}")
        elif p not in phases or p in ("", "allreduce"):
            usable = [x.replace("allreduce", "allreduce:K") for x in (*POINTS, *sorted(phases))
                      if x in phases and x not in ("", "boundary")]
            raise UserError(f"failure spec {s.text!r}: phase {p} is not a data-parallel "
                            f"injection point of the {engine} engine; use "
                            f"{', '.join(dict.fromkeys(usable))}")
