"""The simulated collective: every rank of a group in one process, in lock step.

Each rank runs the shared step routine as a coroutine. Every collective operation
and every injection point suspends it with a request; once all running ranks wait,
:class:`LockStep` answers them together, which is what a real group does, minus the
network. It stays deterministic: ranks are resumed in slot order, and an allreduce
sums every micro-batch gradient in micro-batch order whichever rank sent it, so a
step is bit-for-bit the same on N or N-1 ranks (:mod:`trainthrough.dp.allreduce`).

It charges nothing and knows no schedule: the host sees each point and each bucket
through two callbacks (``on_point`` decides whether a failure strikes there and who
learns of it at once; ``on_reduce`` lets the host charge the ring's time).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainthrough.dp.allreduce import Bucket, Contribution, bucket_sum
from trainthrough.dp.collective import PeerLost, Sequential


@dataclass(frozen=True)
class Point:
    name: str


@dataclass(frozen=True)
class Reduce:
    bucket: Bucket
    parts: Sequence[Contribution]
    ballot: float | None = None  # the commit vote travels with the step's last bucket


@dataclass(frozen=True)
class Broadcast:
    tensors: list[torch.Tensor]
    src: int


Request = Point | Reduce | Broadcast


class _Suspend:
    """Awaiting it hands ``request`` to the driver and returns the driver's answer."""

    def __init__(self, request: Request) -> None:
        self.request = request

    def __await__(self) -> Generator[Request, Any, Any]:
        return (yield self.request)


class SimCollective(Sequential):
    """One incarnation of a simulated group of rank slots ``members`` (a bucket is
    reduced when started: the simulated backward has no time to overlap)."""

    def __init__(self, members: Sequence[int]) -> None:
        self.members = list(members)

    async def allreduce(self, parts: Sequence[Contribution], bucket: Bucket) -> torch.Tensor:
        return await _Suspend(Reduce(bucket, tuple(parts)))  # type: ignore[no-any-return]

    async def commit(self, parts: Sequence[Contribution], bucket: Bucket,
                     ballot: float) -> tuple[torch.Tensor, float]:
        return await _Suspend(Reduce(bucket, tuple(parts), ballot))  # type: ignore[no-any-return]

    async def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        await _Suspend(Broadcast(tensors, src))


class SimInjector:
    """Every injection point is a meeting point: the host strikes once for the group."""

    async def at(self, point: str, step: int) -> None:
        await _Suspend(Point(point))


@dataclass(frozen=True)
class Strike:
    """``on_point``'s answer: ``victims`` die here; survivors in ``resume`` carry on
    unaware (they find out at their next collective), the others learn at once."""

    victims: tuple[int, ...]
    resume: frozenset[int] = field(default_factory=frozenset)


Outcome = dict[int, Any]  # slot -> the coroutine's return value, or its PeerLost


class LockStep:
    """Drives one coroutine per rank slot until each has returned or lost its group."""

    def __init__(self, on_point: Callable[[str], Strike | None],
                 on_reduce: Callable[[Bucket, int], None]) -> None:
        self.on_point, self.on_reduce = on_point, on_reduce

    def run(self, coll: SimCollective, coros: dict[int, Coroutine[Any, Any, Any]]) -> Outcome:
        """Run ``coros`` (one per member of ``coll``) to their end.

        Raises:
            RuntimeError: the ranks did not make the same calls (a bug).
            anything else a coroutine raises besides :class:`PeerLost`.
        """
        out: Outcome = {}
        waiting: dict[int, Request] = {}
        try:
            for s in sorted(coros):
                self._resume(s, coros[s], None, None, waiting, out)
            while waiting:
                replies = self._answer(coll, coros, waiting)
                waiting = {}
                for s in sorted(replies):
                    value, err = replies[s]
                    self._resume(s, coros[s], value, err, waiting, out)
        finally:
            for c in coros.values():
                c.close()
        return out

    def _answer(self, coll: SimCollective, coros: dict[int, Coroutine[Any, Any, Any]],
                waiting: dict[int, Request]) -> dict[int, tuple[Any, PeerLost | None]]:
        first = waiting[min(waiting)]
        if any(type(r) is not type(first) or (isinstance(r, Point) and r != first)
               for r in waiting.values()):
            raise RuntimeError(f"simulated ranks out of lock step: {waiting}")
        if isinstance(first, Point):
            strike = self.on_point(first.name)
            if strike is None:
                return {s: (None, None) for s in waiting}
            for v in strike.victims:  # they never return from the point
                coros[v].close()
                waiting.pop(v, None)
            why = f"rank(s) {list(strike.victims)} failed at {first.name}"
            return {s: (None, None if s in strike.resume else PeerLost(why)) for s in waiting}
        if sorted(waiting) != sorted(coll.members):  # somebody is gone: the group is broken
            gone = sorted(set(coll.members) - set(waiting))
            return {s: (None, PeerLost(f"rank(s) {gone} did not take part")) for s in waiting}
        if isinstance(first, Reduce):
            reqs = [r for r in waiting.values() if isinstance(r, Reduce)]
            parts = sorted((p for r in reqs for p in r.parts), key=lambda p: p[0])
            total = bucket_sum(parts, first.bucket)
            self.on_reduce(first.bucket, len(waiting))
            if first.ballot is None:
                return {s: (total, None) for s in waiting}
            tally = sum(r.ballot or 0.0 for r in reqs)
            return {s: ((total, tally), None) for s in waiting}
        src = waiting[coll.members[first.src]]
        assert isinstance(src, Broadcast)
        for r in waiting.values():
            if isinstance(r, Broadcast) and r is not src:
                for mine, theirs in zip(r.tensors, src.tensors):
                    mine.copy_(theirs)
        return {s: (None, None) for s in waiting}

    @staticmethod
    def _resume(slot: int, coro: Coroutine[Any, Any, Any], value: Any, err: PeerLost | None,
                waiting: dict[int, Request], out: Outcome) -> None:
        try:
            waiting[slot] = coro.throw(err) if err is not None else coro.send(value)
        except StopIteration as done:
            out[slot] = done.value
        except PeerLost as e:
            out[slot] = e
