"""Where a worker's calls to each shard go: the run's registry, asked as seldom as can be.

For each shard a worker keeps a :class:`Route`: the replica that takes its pushes (a
chain's head) and the one that serves its pulls (a synchronous chain's tail, else the
head), as the registry listed them. A route is kept until a call along it fails
(:meth:`ShardRoutes.forget`) or the driver says the shard changed
(:meth:`ShardRoutes.changed`). A shard the registry lists no live replica for is
asked about again at most every ``RECHECK`` seconds, so a worker that computes through
an outage spends it computing, not asking; an announcement from the driver makes the
next lookup ask at once.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import ray

# While a shard is down its replacement is announced by the driver (``shard_changed``);
# the registry is still polled this often in case an announcement is missed.
RECHECK = 1.0


class Route(NamedTuple):
    """Where a worker sends a shard's pushes and reads its parameters."""

    write: Any  #: the replica that takes pushes (a chain's head)
    read: Any  #: the replica that serves pulls (a synchronous chain's tail, else the head)


class ShardRoutes:
    """One worker's routes, by shard; ``read_from``: "tail" or "head"."""

    def __init__(self, registry: Any, read_from: str) -> None:
        self.registry, self.read_from = registry, read_from
        self._routes: dict[int, Route] = {}
        self._recheck: dict[int, float] = {}  # shard -> when to ask the registry again

    def get(self, i: int) -> Route | None:
        """Shard ``i``'s route (None: the registry lists no live replica of it now,
        or was asked less than ``RECHECK`` seconds ago)."""
        cached = self._routes.get(i)
        if cached:
            return cached
        now = time.perf_counter()
        if now < self._recheck.get(i, 0.0):
            return None
        self._recheck[i] = now + RECHECK
        _, members = ray.get(self.registry.members.remote(f"shard{i}"))
        if not members:
            return None
        try:
            write = ray.get_actor(members[0])
            read = ray.get_actor(members[-1] if self.read_from == "tail" else members[0])
        except ValueError:  # a replica named in the registry died before we got it
            return None
        self._routes[i] = Route(write, read)
        return self._routes[i]

    def forget(self, i: int) -> None:
        """A call along shard ``i``'s route failed: look it up again on next use."""
        self._routes.pop(i, None)

    def changed(self, i: int) -> None:
        """The driver says who serves shard ``i`` changed: ask the registry at once."""
        self._routes.pop(i, None)
        self._recheck[i] = 0.0
