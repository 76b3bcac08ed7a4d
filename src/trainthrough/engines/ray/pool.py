"""Warm actors kept between the runs of one driver process (suites, benchmarks, tests).

Starting an actor means starting Python and importing torch: 1-3 s each on this
2-core machine, and a run needs 6-10 of them (about 6 s before the first update,
12 s on a loaded machine). Runs that follow each other on one Ray session take
their actors from this pool instead and start training in a fraction of a second.

Reuse never carries state over: a pooled actor serves again only through its
``reset`` call, which runs the very code its constructor runs (fresh workload, data
partition, parameters, optimizer state, counters, queues), so a run on reused actors
computes what a run on fresh ones computes (tests/test_ray_pool.py checks it bit for
bit). An actor comes back to the pool only if it ended its run cleanly: its
``release`` call stopped its loops and background threads and let its pending
``watch`` return. Killed actors, actors that did not stop, and replicas tied to a
ZooKeeper session are killed instead.

Actors are keyed by what building them needs: their class and, for workers, the
workload reference (the code they import). The pool belongs to one Ray session: a
different session (Ray shut down and started again) empties it, and
:func:`~trainthrough.engines.ray.runtime.shutdown_ray` clears it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from typing import Any

import ray

# Idle actors kept per key (a chain run needs 3 replicas and a spare, a TTF run 4
# workers): more would only hold memory (200-480 MiB per torch actor).
MAX_IDLE = 8
RELEASE_SECONDS = 15.0


class ActorPool:
    """Idle actors by key; counts how many were created and how many reused."""

    def __init__(self) -> None:
        self._idle: dict[Hashable, list[tuple[str, Any]]] = {}
        self._session: tuple[str, str] | None = None
        self.created = self.reused = 0

    def get(self, key: Hashable, create: Callable[[], tuple[str, Any]],
            reset: Callable[[str, Any], Any]) -> tuple[str, Any, Any]:
        """An actor for ``key``: an idle one, ``reset(name, handle)``, else a new one
        from ``create``.

        Returns:
            (its Ray name, its handle, the pending ``reset`` ref or None if new).
        """
        self._check_session()
        idle = self._idle.get(key)
        if idle:
            name, handle = idle.pop()
            self.reused += 1
            return name, handle, reset(name, handle)
        self.created += 1
        name, handle = create()
        return name, handle, None

    def give_back(self, items: list[tuple[Hashable, str, Any, Any]]) -> None:
        """Keep each (key, name, handle, pending ``release`` ref) whose release answered
        True in time; kill the others (and any beyond :data:`MAX_IDLE` per key)."""
        self._check_session()
        for key, name, handle, ref in items:
            try:
                ok = ray.get(ref, timeout=RELEASE_SECONDS) is True
            except (ray.exceptions.RayError, TimeoutError):
                ok = False
            idle = self._idle.setdefault(key, [])
            if ok and len(idle) < MAX_IDLE:
                idle.append((name, handle))
            else:
                _kill(handle)

    def clear(self, kill: bool = True) -> None:
        """Forget every idle actor (``kill``: end their processes too)."""
        for idle in self._idle.values():
            for _, handle in idle:
                if kill:
                    _kill(handle)
        self._idle.clear()

    def idle(self) -> list[Any]:
        """The handles of the idle actors."""
        return [h for v in self._idle.values() for _, h in v]

    def _check_session(self) -> None:
        """Handles are only valid in the Ray session that made them."""
        ctx = ray.get_runtime_context()
        session = (ctx.get_job_id(), ctx.get_node_id())
        if session != self._session:
            self.clear(kill=False)
            self._session = session


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):  # already dead is fine
        ray.kill(handle, no_restart=True)


#: The driver process's pool (one Ray session at a time).
POOL = ActorPool()
