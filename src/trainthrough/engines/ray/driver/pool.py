"""Warm actors kept between the runs of one driver process (suites, benchmarks, tests).

Starting an actor means starting Python and importing torch, seconds each, and a run
needs 6-10 of them. Runs that follow each other on one Ray session take
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

On a cluster it joined, the pool also leases from the cluster's warm pool (warm.py):
actors kept by earlier drivers that asked for it (``--keep-warm``), reset the same way;
with ``keep`` set, the actors it creates are detached ones that go back there.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Hashable
from typing import Any

import ray

from trainthrough.engines.ray.driver import warm

# Idle actors kept per key (a chain run needs 3 replicas and a spare, a TTF run 4
# workers): more would only hold memory (200-480 MiB per torch actor).
MAX_IDLE = 8
RELEASE_SECONDS = 15.0


class ActorPool:
    """Idle actors by key; counts how many were created, reused and leased."""

    def __init__(self) -> None:
        self._idle: dict[Hashable, list[tuple[str, Any]]] = {}
        self._session: tuple[str, str] | None = None
        self.created = self.reused = self.leased = 0
        self._warm: Any = None  # the cluster's warm pool, while attached
        self._lease = ""
        self._keep: float | None = None
        self._detached: set[str] = set()  # names of the warm (detached) actors we hold
        self._token: Any = None  # the object whose owner (us) keeps the lease alive

    @property
    def attached(self) -> bool:
        return self._warm is not None

    def attach(self, keep: float | None) -> None:
        """Lease from the cluster's warm pool (if there is one, or ``keep`` starts it);
        ``keep``: idle seconds the actors this driver gives back are kept (None: the
        ones it creates end with it). Only in trainthrough's namespace, where every
        actor of every driver finds the others by name."""
        self._check_session()
        if ray.get_runtime_context().namespace != warm.NAMESPACE:
            return
        self._keep = keep
        if self._warm is not None:
            return
        pool = warm.pool_handle() if keep is not None else warm.find_pool()
        if pool is None:
            return
        lease = uuid.uuid4().hex
        # An object this driver owns: the pool sees the lease end when getting it fails.
        token = ray.put(b"")
        try:
            ray.get(pool.open.remote(lease, [token]), timeout=30)
        except (ray.exceptions.RayError, TimeoutError):
            if keep is None:
                return  # it ended itself meanwhile: nothing warm to lease
            pool = warm.pool_handle()
            ray.get(pool.open.remote(lease, [token]), timeout=30)
        self._warm, self._lease, self._token = pool, lease, token

    def detach(self) -> None:
        """End the lease: the pool kills what it still lends us (runs give back first)."""
        if self._warm is not None:
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                ray.get(self._warm.close.remote(self._lease), timeout=30)
        self._warm, self._lease, self._keep = None, "", None
        self._detached.clear()

    def get(self, key: Hashable, create: Callable[[dict[str, Any]], tuple[str, Any]],
            reset: Callable[[str, Any], Any]) -> tuple[str, Any, Any]:
        """An actor for ``key``: an idle one, ``reset(name, handle)``; else one leased
        from the cluster's warm pool, reset too; else a new one from ``create``, given
        the extra actor options (detached when this driver keeps actors warm).

        Returns:
            (its Ray name, its handle, the pending ``reset`` ref or None if new).
        """
        self._check_session()
        idle = self._idle.get(key)
        if idle:
            name, handle = idle.pop()
            self.reused += 1
            return name, handle, reset(name, handle)
        shared = _shared_key(key)
        if self._warm is not None and shared is not None:
            try:
                got = ray.get(self._warm.take.remote(self._lease, shared), timeout=30)
            except (ray.exceptions.RayError, TimeoutError):
                got = None
            if got is not None:
                name, handle = got
                self._detached.add(name)
                self.reused += 1
                self.leased += 1
                return name, handle, reset(name, handle)
        self.created += 1
        detached = self._warm is not None and self._keep is not None and shared is not None
        name, handle = create({"lifetime": "detached"} if detached else {})
        if detached:
            self._detached.add(name)
            # Detached actors outlive us: the lease holds it from now on, so it is
            # killed if this driver dies before giving it back.
            try:
                held = ray.get(self._warm.hold.remote(self._lease, name, handle, self._keep),
                               timeout=30)
            except (ray.exceptions.RayError, TimeoutError):
                held = False
            if not held:  # the pool is gone (killed by hand): an ordinary actor then
                _kill(handle)
                self._detached.discard(name)
                self._warm = None
                name, handle = create({})
        return name, handle, None

    def give_back(self, items: list[tuple[Hashable, str, Any, Any]]) -> None:
        """Keep each (key, name, handle, pending ``release`` ref) whose release answered
        True in time (a warm one goes back to the cluster's pool); kill the others (and
        any beyond :data:`MAX_IDLE` per key)."""
        self._check_session()
        for key, name, handle, ref in items:
            try:
                ok = ray.get(ref, timeout=RELEASE_SECONDS) is True
            except (ray.exceptions.RayError, TimeoutError):
                ok = False
            if name in self._detached:
                self._give_warm(key, name, handle, ok)
                continue
            idle = self._idle.setdefault(key, [])
            if ok and len(idle) < MAX_IDLE:
                idle.append((name, handle))
            else:
                _kill(handle)

    def _give_warm(self, key: Hashable, name: str, handle: Any, ok: bool) -> None:
        self._detached.discard(name)
        if self._warm is not None:  # else the pool went away under us (see ``get``)
            try:
                if ok:
                    ray.get(self._warm.give.remote(self._lease, _shared_key(key), name,
                                                   handle, self._keep), timeout=30)
                    return
                self._warm.forget.remote(self._lease, name)
            except (ray.exceptions.RayError, TimeoutError):
                pass
        _kill(handle)  # not reusable, or the pool is gone: a detached actor never lingers

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
            self._warm, self._lease, self._keep = None, "", None
            self._detached.clear()
            self._session = session


def _shared_key(key: Hashable) -> Hashable | None:
    """The cluster-wide key of an actor kind (None: kept within this driver only):
    trainthrough's own actors and workers of a built-in workload, tagged with the code
    this driver runs (warm.py says why references stay out)."""
    from trainthrough.workloads import WORKLOADS

    if not isinstance(key, tuple) or not key:
        return None
    if key[0] in ("shard", "registry") or (key[0] == "worker" and key[1] in WORKLOADS):
        return (warm.code_fingerprint(), *key)
    return None


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):  # already dead is fine
        ray.kill(handle, no_restart=True)


#: The driver process's pool (one Ray session at a time).
POOL = ActorPool()
