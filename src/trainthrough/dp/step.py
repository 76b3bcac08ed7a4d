"""The data-parallel step, written once for every host, and the points it names.

A step, as one rank sees it (call order, each ``inj.at`` an injection point):

1. ``boundary``: nothing of the step done yet;
2. gradients of the first half of its micro-batches, ``forward``, the second half,
   ``backward``;
3. for each bucket ``K`` in order: ``allreduce:K``, then the bucket's allreduce; the
   last one carries the commit vote as one more element (:meth:`Collective.commit`),
   so a step costs one collective per bucket and no more. On a host whose collective
   overlaps, buckets before the last start from inside the backward of the last
   micro-batch, as their gradients become ready (DDP's bucket hooks): ``backward``
   and ``allreduce:K`` are then passed there, in the same order (:class:`_Reduction`);
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
from typing import Any

import torch

from trainthrough.dp.allreduce import Bucket, Grads
from trainthrough.dp.batching import StepBatch
from trainthrough.dp.collective import Collective, Injector, PeerLost, run_blocking
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
    """One rank's attempt at logical step ``logical``, as far as it got.

    ``grads`` holds this rank's gradients; ``reduced`` the buckets' results: in a
    summed ``grads`` it is ``grads.flat`` itself, so a bucket's result replaces this
    rank's share in place and the gradient costs one flat vector (DDP's buckets as
    ``.grad`` views). Which buckets hold a result is ``done``, never the values. The
    result of the last bucket reduced is kept apart (``_pending``) until the next one
    completes: peers may have reduced one bucket fewer when a failure strikes, and
    this rank's share of that bucket must still be there (:meth:`rewind`).
    """

    batch: StepBatch
    logical: int
    grads: Grads
    reduced: torch.Tensor
    done: list[bool] = field(default_factory=list)  # per bucket: its result is in ``reduced``
    phase: str = "boundary"  # the last point passed
    buckets_done: int = 0
    committed: bool = False  # the last bucket, and with it the vote, completed
    _pending: tuple[Bucket, torch.Tensor, int] | None = None  # the newest sum, not yet written

    @classmethod
    def begin(cls, batch: StepBatch, logical: int, grads: Grads) -> InFlight:
        """A fresh record over ``grads`` (a replica's :meth:`~trainthrough.dp.rank.Replica.new_grads`)."""
        reduced = grads.flat if grads.flat is not None else torch.zeros(grads.numel,
                                                                        device=grads.device)
        return cls(batch, logical, grads, reduced)

    def reduce_into(self, bucket: Bucket, total: torch.Tensor, count: int, mean: bool) -> None:
        """Take a bucket's sum (divided by the ``count`` micro-batches if ``mean``);
        ``total`` is read, never changed (a simulated group hands every member the same)."""
        self._flush()
        self._pending = (bucket, total, count if mean else 1)
        self.done += [False] * (bucket.index + 1 - len(self.done))
        self.done[bucket.index] = True

    def rewind(self, done: int) -> None:
        """The group agreed that buckets ``[0, done)`` hold a result (the fewest any
        survivor reduced): a result this rank has beyond them is dropped, and those
        buckets hold its own share again.

        Raises:
            RuntimeError: a result beyond ``done`` was written over this rank's share
                already (at most one bucket is in flight, so peers are never two behind).
        """
        held = self._pending[0].index if self._pending is not None else None
        if held is not None and held < done:
            self._flush()
        self._pending = None
        written = [i for i, d in enumerate(self.done) if d and i >= done and i != held]
        self.done = self.done[:done]
        if written and self.grads.flat is not None:
            raise RuntimeError(f"buckets {written} were reduced in place beyond the {done} "
                               "the group agreed on")

    def _flush(self) -> None:
        if self._pending is not None:
            b, total, count = self._pending
            torch.div(total, count, out=self.reduced[b.start:b.stop])
            self._pending = None

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
        self._flush()
        return self.reduced


class _Reduction:
    """A step's buckets, started in order as their gradients are ready.

    Bucket ``K`` starts once bucket ``K-1`` completed here and the point
    ``allreduce:K`` passed, so a failure at ``allreduce:K`` finds buckets ``[0, K)``
    reduced by every member and nothing of ``K`` sent by the victim, whether the
    buckets start during the backward (a host that :attr:`~.Collective.overlaps`,
    fed by the replica's :data:`~trainthrough.dp.rank.Ready` calls) or after it.
    The point ``backward`` comes before bucket 0 starts. The last bucket carries the
    vote and starts once the backward is over (:meth:`finish`).
    """

    def __init__(self, fl: InFlight, coll: Collective, inj: Injector, spec: StepSpec,
                 step: int) -> None:
        self.fl, self.coll, self.inj, self.spec, self.step = fl, coll, inj, spec, step
        self.left = [b.numel for b in spec.buckets]  # elements not ready yet
        self.next = 0  # the next bucket to start
        self.flight: tuple[Bucket, Any] | None = None
        self.count = fl.batch.micro_count

    def ready(self, start: int, stop: int) -> None:
        """Elements ``[start, stop)`` hold this rank's whole share (from the backward):
        start every bucket now complete, in order, but the last."""
        for b in self.spec.buckets:
            if b.start < stop and start < b.stop:
                self.left[b.index] -= min(stop, b.stop) - max(start, b.start)
        run_blocking(self._start_ready(everything=False))

    async def _start_ready(self, everything: bool) -> None:
        last = len(self.spec.buckets) - 1
        while self.next < last and (everything or self.left[self.next] <= 0):
            await self._start(self.spec.buckets[self.next])

    async def _start(self, b: Bucket) -> None:
        if b.index == 0:
            await self.inj.at("backward", self.step)
            self.fl.phase = "allreduce"
        await self._land()
        await self.inj.at(f"allreduce:{b.index}", self.step)
        self.flight = (b, await self.coll.start(self.fl.grads.contributions(), b))
        self.next = b.index + 1

    async def _land(self) -> None:
        if self.flight is not None:
            b, handle = self.flight
            self.flight = None
            self.fl.reduce_into(b, await self.coll.wait(handle), self.count, self.spec.mean)
            self.fl.buckets_done = b.index + 1

    async def finish(self, ballot: Callable[[], float]) -> float:
        """The buckets not started yet, then the last with the vote; the vote's sum."""
        fl, last = self.fl, self.spec.buckets[-1]
        await self._start_ready(everything=True)
        if last.index == 0:
            await self.inj.at("backward", self.step)
            fl.phase = "allreduce"
        await self._land()
        await self.inj.at(f"allreduce:{last.index}", self.step)
        total, tally = await self.coll.commit(fl.grads.contributions(), last, ballot())
        fl.reduce_into(last, total, self.count, self.spec.mean)
        fl.buckets_done, fl.committed = last.index + 1, True
        return tally


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
    rank.gradients(fl.logical, mine[:half], fl.grads)
    await inj.at("forward", step)
    fl.phase = "backward"
    red = _Reduction(fl, coll, inj, spec, step)
    # On a host that overlaps, buckets start from inside the last backward.
    rank.gradients(fl.logical, mine[half:], fl.grads, red.ready if coll.overlaps else None)
    tally = await red.finish(ballot)
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


def check_points(specs: list[FailureSpec], buckets: int | None, phases: Collection[str],
                 engine: str) -> None:
    """Refuse failure specs naming a point this host cannot strike at.

    Args:
        phases: the host's declared failure phases (its ``CAPABILITIES``): ``""``
            between steps, step points (``allreduce`` for every ``allreduce:K``) and
            host points such as ``recovery``.
        buckets: the run's bucket count B (``K`` goes from 0 to B-1); None: not known
            before the ranks build the model (buckets sized by bytes), so only
            ``allreduce:0`` surely exists.

    Raises:
        UserError: naming the spec and the phases to use instead.
    """
    for s in specs:
        p = s.phase
        if p is None:
            continue
        if p.startswith("allreduce:") and "allreduce" in phases:
            k = int(p[len("allreduce:"):])
            if buckets is None and k > 0:
                raise UserError(f"failure spec {s.text!r}: the allreduce's buckets are sized "
                                "by bytes from the model, which only the ranks build; name "
                                "their count with allreduce_buckets (--allreduce-buckets) to "
                                f"strike at bucket {k}")
            if buckets is not None and k >= buckets:
                raise UserError(f"failure spec {s.text!r}: the allreduce has {buckets} "
                                f"bucket{'s' * (buckets > 1)} (allreduce_buckets), so K in "
                                f"allreduce:K goes from 0 to {buckets - 1}")
        elif p not in phases or p in ("", "allreduce"):
            usable = [x.replace("allreduce", "allreduce:K") for x in (*POINTS, *sorted(phases))
                      if x in phases and x not in ("", "boundary")]
            raise UserError(f"failure spec {s.text!r}: phase {p} is not a data-parallel "
                            f"injection point of the {engine} engine; use "
                            f"{', '.join(dict.fromkeys(usable))}")
