"""The data-parallel step, written once for every host, and the points it names.

A step, as one rank sees it (call order, each ``inj.at`` an injection point):

1. ``boundary``: nothing of the step done yet;
2. gradients of the first half of its micro-batches, ``forward``, the second half,
   ``backward``;
3. for each bucket ``K`` in order: ``allreduce:K``, then the bucket's allreduce; the
   last one carries the commit vote as one more element (:meth:`Collective.commit`),
   so a step costs one collective per bucket and no more (one by default);
4. the step is committed once that collective completed: every member contributed
   its whole share. ``update``: apply the averaged gradient.

The update comes after the commit, as torchft's ``should_commit`` comes before the
optimizer step: an uncommitted step never touched the replica, so recovery never
undoes anything and no strategy copies the replica before every update. A failure at
``update`` strikes a rank after the group committed: the survivors apply the step
and find the loss at their next collective, a failure between steps for them
(:func:`group_phase`).

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
from trainthrough.dp.rank import Replica
from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec

# The injection points of a step, in order ("allreduce" stands for allreduce:K).
POINTS = ("boundary", "forward", "backward", "allreduce", "update")


@dataclass(frozen=True)
class StepSpec:
    """What is fixed for a run: the buckets, mean or sum."""

    buckets: tuple[Bucket, ...]
    mean: bool  # divide by the micro-batches that contributed (workload aggregate "mean")


@dataclass
class InFlight:
    """One rank's attempt at logical step ``logical``, as far as it got."""

    batch: StepBatch
    logical: int
    reduced: torch.Tensor  # the buckets' results; which hold one is ``done``, never the values
    done: list[bool] = field(default_factory=list)  # per bucket: its result is in ``reduced``
    contribs: list[Contribution] = field(default_factory=list)
    phase: str = "boundary"  # the last point passed
    buckets_done: int = 0
    committed: bool = False  # the last bucket, and with it the vote, completed

    @classmethod
    def begin(cls, batch: StepBatch, logical: int, numel: int,
              device: torch.device | None = None) -> InFlight:
        """A fresh record; ``reduced`` lives on the replica's ``device`` (default CPU)."""
        return cls(batch, logical, torch.zeros(numel, device=device))

    def reduce_into(self, bucket: Bucket, total: torch.Tensor, count: int, mean: bool) -> None:
        """Store a bucket's sum (divided by the ``count`` micro-batches if ``mean``)."""
        self.reduced[bucket.start:bucket.stop] = total / count if mean else total
        self.done += [False] * (bucket.index + 1 - len(self.done))
        self.done[bucket.index] = True

    def whole(self, spec: StepSpec) -> torch.Tensor:
        """The reduced vector, once every bucket of ``spec`` holds its result.

        Which buckets are reduced is kept apart from the values: a user's NaN or inf
        gradient is a value (a scaler skips that step), never a missing bucket.

        Raises:
            RuntimeError: a bucket was not reduced (a bug in the caller).
        """
        missing = [b.index for b in spec.buckets
                   if b.index >= len(self.done) or not self.done[b.index]]
        if missing:
            raise RuntimeError(f"refusing to apply a gradient with unreduced buckets {missing}")
        return self.reduced


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
        PeerLost: located at the phase and buckets ``fl`` records (never after the
            commit: the update is local).
    """
    try:
        return await _step(rank, fl, coll, inj, spec, step, ballot)
    except PeerLost as e:
        raise e.located(fl.phase, fl.buckets_done) from None


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
    *first, last = spec.buckets
    for b in first:
        await inj.at(f"allreduce:{b.index}", step)
        fl.reduce_into(b, await coll.allreduce(fl.contribs, b), count, spec.mean)
        fl.buckets_done = b.index + 1
    await inj.at(f"allreduce:{last.index}", step)
    total, tally = await coll.commit(fl.contribs, last, ballot())
    fl.reduce_into(last, total, count, spec.mean)
    fl.buckets_done, fl.committed = last.index + 1, True
    fl.phase = "update"
    await inj.at("update", step)
    rank.apply(fl.whole(spec), fl.batch.lr_scale)
    return tally


def group_phase(point: str) -> str:
    """Where a failure at step point ``point`` leaves the group's step in flight, for
    the recovery policy: after the commit (``update``) nothing is in flight, as
    between two steps (``boundary``); ``allreduce:K`` is the allreduce phase."""
    phase = point.partition(":")[0]
    return "boundary" if phase == "update" else phase


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
                raise UserError(f"failure spec {s.text!r}: the allreduce has {buckets} "
                                f"bucket{'s' * (buckets > 1)} (allreduce_buckets), so K in "
                                f"allreduce:K goes from 0 to {buckets - 1}")
        elif p not in phases or p in ("", "allreduce"):
            usable = [x.replace("allreduce", "allreduce:K") for x in (*POINTS, *sorted(phases))
                      if x in phases and x not in ("", "boundary")]
            raise UserError(f"failure spec {s.text!r}: phase {p} is not a data-parallel "
                            f"injection point of the {engine} engine; use "
                            f"{', '.join(dict.fromkeys(usable))}")
