"""What a data-parallel step needs from its host: a collective and an injector.

The step routine (:mod:`trainthrough.dp.step`) is written once and hosted twice:
``sim`` supplies a simulated collective that runs every rank in one process in
lock step (:mod:`trainthrough.dp.simulated`), the ``gloo`` engine a real process
group. Failures are injected by the host at the points the step names
(:class:`Injector`), never by a second copy of the step: ``sim`` takes ranks down
in-process, a gloo rank SIGKILLs or SIGSTOPs itself (torchft's
``FakeProcessGroupWrapper`` / ``EventInjector`` idea).

Every operation is ``async``: a host that blocks (gloo) never suspends and runs a
step with :func:`run_blocking`; the simulated host suspends a rank at each
operation until every rank has reached it. Whatever the host, a lost peer surfaces
as one error type, :class:`PeerLost`, raised to every surviving member.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar

import torch

from trainthrough.dp.allreduce import Bucket, Contribution

T = TypeVar("T")


class PeerLost(Exception):
    """A member of the group failed or hung: the step stopped at ``phase``.

    ``buckets_done``: allreduce buckets this member completed. Collectives raise it
    with the message only; the step routine, which knows how far it got, re-raises
    it located (:meth:`located`). Plain fields only, so it pickles across processes.
    """

    def __init__(self, message: str, phase: str = "boundary", buckets_done: int = 0,
                 t: float | None = None) -> None:
        super().__init__(f"{phase}: {message}")
        self.message, self.phase, self.buckets_done = message, phase, buckets_done
        self.t = time.time() if t is None else t  # when it surfaced (detection time)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PeerLost, (self.message, self.phase, self.buckets_done, self.t))

    def located(self, phase: str, buckets_done: int) -> PeerLost:
        """The same loss, stamped with where the step stood."""
        return PeerLost(self.message, phase, buckets_done, self.t)


class Collective(Protocol):
    """The group operations of one incarnation of a data-parallel group.

    Call order (every member makes the same calls; :mod:`trainthrough.dp.step` and
    :mod:`trainthrough.dp.repair` make them):

    1. the host forms the group;
    2. if a replacement joins: one :meth:`allreduce` (who holds state), then
       :meth:`broadcast` from the first holder;
    3. lossy-forward completion only: :meth:`allreduce` for the buckets left;
    4. per step: for buckets ``0 .. B-2`` in order, :meth:`start` then :meth:`wait`
       (at most one bucket started and not waited for: bucket K starts after K-1's
       wait), then :meth:`commit` for the last one.

    A host whose operations block (:attr:`overlaps`) may be asked to :meth:`start` a
    bucket from inside the backward, as its gradients become ready (DDP's bucket
    hooks): the reduction then runs while the backward goes on. The others reduce when
    started, one bucket after the other (:class:`Sequential`).

    Any operation raises :class:`PeerLost` once a member is gone; the group is then
    unusable and the host forms a new one of the survivors.
    """

    members: list[int]  # rank slots of the group, in rank order
    #: :meth:`start` may be called from inside the backward (it never suspends) and
    #: returns before the reduction is done.
    overlaps: bool

    async def start(self, parts: Sequence[Contribution], bucket: Bucket) -> Any:
        """Begin :meth:`allreduce` of ``bucket``: ``parts`` are read before it returns
        (the caller may change them afterwards); the handle goes to :meth:`wait`."""
        ...

    async def wait(self, handle: Any) -> torch.Tensor:
        """The sum a :meth:`start` began (a new tensor the caller owns)."""
        ...

    async def allreduce(self, parts: Sequence[Contribution], bucket: Bucket) -> torch.Tensor:
        """The sum over every member's ``parts`` of elements ``bucket`` (not the mean).

        ``parts`` are this member's micro-batch gradients (flat, whole length); the
        host decides the summation order (``sim``: all micro-batches in index order,
        bit-for-bit independent of the split; gloo: locally in order, then the ranks).
        """
        ...

    async def commit(self, parts: Sequence[Contribution], bucket: Bucket,
                     ballot: float) -> tuple[torch.Tensor, float]:
        """:meth:`allreduce` of the step's last bucket carrying the commit vote in the
        same collective: the bucket's sum and the sum of every member's ``ballot``.
        Completing it commits the step: every member contributed its whole share."""
        ...

    async def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with member ``src``'s (same shapes)."""
        ...


class Sequential:
    """Default :meth:`Collective.start` and :meth:`Collective.wait` for a host that
    reduces a bucket when it is started (the simulated one): no overlap."""

    overlaps = False

    async def allreduce(self, parts: Sequence[Contribution], bucket: Bucket) -> torch.Tensor:
        raise NotImplementedError

    async def start(self, parts: Sequence[Contribution], bucket: Bucket) -> Any:
        return await self.allreduce(parts, bucket)

    async def wait(self, handle: Any) -> torch.Tensor:
        return handle  # type: ignore[no-any-return]


class Injector(Protocol):
    """Delivers scheduled failures at the points a step names.

    Called by the step routine at each point, in the order of
    :data:`trainthrough.dp.step.POINTS` (``allreduce:K`` once per bucket), with
    ``step`` = the attempts executed before this one (what ``@iter=`` triggers count).
    Returns if nothing is due. What a due failure does is the host's: the victim
    never returns from the call; a host that sees the failure at once (``sim``) may
    raise :class:`PeerLost` in the survivors here.
    """

    async def at(self, point: str, step: int) -> None: ...


class NoFailures:
    """An injector that never fires (failure-free runs and tests)."""

    async def at(self, point: str, step: int) -> None:
        return None


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run a step on a host whose operations block (never suspend); its result.

    Raises:
        whatever the step raises (:class:`PeerLost` when the group broke);
        RuntimeError: the coroutine suspended (it awaited a simulated operation).
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a blocking host ran a step that suspended")
