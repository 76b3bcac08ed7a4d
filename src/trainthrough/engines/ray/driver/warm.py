"""Warm actors kept on a Ray cluster between drivers, leased so no two runs share one.

A driver that joins a running cluster (``--ray-address``) would otherwise start every
actor anew: a Python process importing torch, seconds each. With ``--keep-warm
SECONDS`` a run leaves the actors that ended it cleanly (released, as the in-driver
pool does: pool.py) on the cluster as *detached* actors in the ``trainthrough``
namespace, and any later driver on that cluster leases them and ``reset``s them
before use, exactly as the in-driver pool reuses its own.

The policy, so that nothing runs that nobody asked to keep:

* Only runs given ``--keep-warm`` leave actors behind; each idle actor ends after
  that many idle seconds (every time it is given back its clock starts again).
* A run without ``--keep-warm`` still leases idle warm actors that exist, and gives
  them back when it ends (someone asked to keep them); the actors it had to create
  itself are ordinary ones and end with it.
* One detached :class:`WarmPool` actor holds the idle actors and the leases, and does
  every hand-out: its calls run one at a time, so an actor is leased to one driver
  at most. A lease lives as long as its driver: the driver hands the pool an object
  it owns, and when getting it fails with ``OwnerDiedError`` the driver is gone
  (crashed or killed); whatever it still held is killed (its state is unknown, so it
  is never reused). The pool ends itself once it holds nothing, no lease is open and
  nobody has called it for :data:`EMPTY_SECONDS`.
* ``trainthrough release --ray-address ADDR`` ends every idle warm actor at once, and
  every leased one as soon as its run gives it back.

What is shared: shard replicas and the registry (trainthrough's own code) and workers
of a built-in workload, each keyed by a fingerprint of trainthrough's source files,
so a driver running edited code never gets an actor that imported the old code.
Workers of a user's workload (a reference) are kept only within one driver: a later
driver may bring an edited file, and a shipped working directory is per job.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import ray

import trainthrough
from trainthrough.engines.ray import NAMESPACE

POOL_NAME = "trainthrough-warm-pool"
#: Idle warm actors kept per key (as pool.MAX_IDLE); more would only hold memory.
MAX_IDLE = 8
REAP_SECONDS = 1.0
#: An empty pool (no lease, nothing idle) ends itself once nobody has called it for
#: this long: a pool just started for a driver must live until that driver's first
#: call, which a loaded machine delays by seconds (the reaper's 1 s ended new pools
#: before their first lease twice in one full suite).
EMPTY_SECONDS = 5.0

Entry = tuple[str, Any]  # (actor name, handle)


class _Idle(NamedTuple):
    """An idle warm actor."""

    name: str
    handle: Any
    keep: float  #: idle seconds it is kept
    since: float  #: idle since (``time.monotonic``)


class _Held(NamedTuple):
    """A warm actor leased to a driver."""

    handle: Any
    keep: float  #: idle seconds it is kept once given back


class _Lease(NamedTuple):
    """A driver's lease: its liveness token and what it holds, by name."""

    token: Any  #: an object the driver owns (getting it fails once the driver is gone)
    held: dict[str, _Held]


_NO_LEASE = _Lease(None, {})


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)  # type: ignore[call-overload]
class WarmPool:
    """Idle warm actors by key and the leases of the drivers using them.

    Every method runs under ``self._lock`` (:meth:`_call`): one hand-out at a time (the
    reaper thread runs beside the calls).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[_Idle]] = {}  # by key
        self._leases: dict[str, _Lease] = {}  # by lease id
        self._doomed: set[str] = set()  # leased when a release came: end when given back
        self.reaped = 0
        self._called = time.monotonic()  # the last call (:meth:`_call`)
        threading.Thread(target=self._reap_loop, daemon=True, name="warm-reaper").start()

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """Every call: under the lock, and stamped (an empty pool ends itself only
        :data:`EMPTY_SECONDS` after the last one)."""
        with self._lock:
            self._called = time.monotonic()
            yield

    def open(self, lease: str, token: list[Any]) -> None:
        """Start a lease; ``token[0]``: an object the driver owns (its liveness)."""
        with self._call():
            self._leases.setdefault(lease, _Lease(token[0], {}))

    def take(self, lease: str, key: Hashable) -> Entry | None:
        """An idle actor for ``key``, now leased to ``lease`` (None: none idle)."""
        with self._call():
            if lease not in self._leases:
                return None
            idle = self._idle.get(key)
            if not idle:
                return None
            e = idle.pop()
            self._leases[lease].held[e.name] = _Held(e.handle, e.keep)
            return e.name, e.handle

    def hold(self, lease: str, name: str, handle: Any, keep: float) -> bool:
        """A warm actor the driver just created, held by its lease from the start, so
        that it is killed if the driver dies before giving it back (False: no such
        lease, the driver should not keep it)."""
        with self._call():
            if lease not in self._leases:
                return False
            self._leases[lease].held[name] = _Held(handle, keep)
            return True

    def give(self, lease: str, key: Hashable, name: str, handle: Any,
             keep: float | None) -> bool:
        """Take back a released actor (``keep``: idle seconds; None: as it had).

        Returns:
            False if it was not kept (pool released, or full): it has been killed.
        """
        with self._call():
            held = self._leases.get(lease, _NO_LEASE).held.pop(name, None)
            keep = keep if keep is not None else (held.keep if held is not None else None)
            idle = self._idle.setdefault(key, [])
            if name in self._doomed or keep is None or len(idle) >= MAX_IDLE:
                self._doomed.discard(name)
                _kill(handle)
                return False
            idle.append(_Idle(name, handle, keep, time.monotonic()))
            return True

    def forget(self, lease: str, name: str) -> None:
        """The driver killed (or lost) a leased actor: not held any more."""
        with self._call():
            self._leases.get(lease, _NO_LEASE).held.pop(name, None)

    def close(self, lease: str) -> int:
        """End a lease: what it still holds is killed. Returns how many."""
        with self._call():
            held = self._leases.pop(lease, _NO_LEASE).held
            for h in held.values():
                _kill(h.handle)
            self._doomed.difference_update(held)
            return len(held)

    def release(self) -> tuple[int, int]:
        """End every idle actor now; leased ones end when given back.

        Returns:
            (idle actors ended, actors still leased).
        """
        with self._call():
            self._doomed.update(n for lease in self._leases.values() for n in lease.held)
            n = sum(len(v) for v in self._idle.values())
            for idle in self._idle.values():
                for e in idle:
                    _kill(e.handle)
            self._idle.clear()
            return n, sum(len(lease.held) for lease in self._leases.values())

    def status(self) -> dict[str, int]:
        with self._call():
            return {"idle": sum(len(v) for v in self._idle.values()),
                    "leases": len(self._leases),
                    "leased": sum(len(lease.held) for lease in self._leases.values()),
                    "reaped": self.reaped}

    # -- the reaper: expired idle actors, dead drivers' leases, an empty pool --------
    def _reap_loop(self) -> None:
        while True:
            time.sleep(REAP_SECONDS)
            with contextlib.suppress(Exception):  # never let the reaper die
                if self._reap():
                    # Nothing held, nobody attached: the pool itself goes.
                    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def _reap(self) -> bool:
        with self._lock:
            tokens = {lease: held.token for lease, held in self._leases.items()}
        gone = [lease for lease, token in tokens.items() if not _owner_alive(token)]
        with self._lock:
            for lease in gone:
                for h in self._leases.pop(lease, _NO_LEASE).held.values():
                    _kill(h.handle)
                    self.reaped += 1
            now = time.monotonic()
            for key, idle in self._idle.items():
                keep = [e for e in idle if now - e.since < e.keep]
                for e in idle:
                    if e not in keep:
                        _kill(e.handle)
                        self.reaped += 1
                self._idle[key] = keep
            return (not self._leases and not any(self._idle.values())
                    and now - self._called > EMPTY_SECONDS)


def _owner_alive(token: Any) -> bool:
    """Whether the driver that owns ``token`` is still there."""
    try:
        ray.get(token, timeout=5)
        return True
    except ray.exceptions.OwnerDiedError:
        return False
    except Exception:  # a slow answer is not a death
        return True


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):  # already dead is fine
        ray.kill(handle, no_restart=True)


def find_pool() -> Any | None:
    """The cluster's warm pool, if there is one."""
    try:
        return ray.get_actor(POOL_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


#: How long :func:`pool_handle` waits for a dead pool's name to be given up.
NAME_FREED_SECONDS = 30.0


def pool_handle() -> Any:
    """The cluster's warm pool, started if there is none, and alive when returned.

    Ray may still resolve the name of a pool that is ending (one that ended itself
    once empty, or was killed) to that dead actor, for a moment after its death
    (ray-project/ray#44083: ``get_if_exists`` returned the old instance; seen here
    once in a full suite): its first call then fails. So the pool answers before it is
    handed out, and a dead one is asked for again until its name is free.

    Raises:
        TimeoutError: the name stayed taken by a dead pool for :data:`NAME_FREED_SECONDS`.
    """
    end = time.monotonic() + NAME_FREED_SECONDS
    while True:
        pool = WarmPool.options(  # type: ignore[attr-defined]
            name=POOL_NAME, namespace=NAMESPACE, get_if_exists=True,
            lifetime="detached").remote()
        try:
            ray.get(pool.status.remote(), timeout=NAME_FREED_SECONDS)
            return pool
        except ray.exceptions.RayActorError:
            if time.monotonic() > end:
                raise TimeoutError(f"Ray still names a dead {POOL_NAME} after "
                                   f"{NAME_FREED_SECONDS:g} s") from None
            time.sleep(0.2)


_FINGERPRINT: list[str] = []


def code_fingerprint() -> str:
    """A hash of trainthrough's source files as this process sees them on disk."""
    if not _FINGERPRINT:
        root = Path(trainthrough.__file__).resolve().parent  # wherever this module is
        h = hashlib.sha256()
        for p in sorted(root.rglob("*.py")):
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
        _FINGERPRINT.append(h.hexdigest()[:16])
    return _FINGERPRINT[0]


def release(address: str) -> str:
    """End the warm actors kept on the cluster at ``address`` (this process must be
    connected to it); what happened, in words."""
    pool = find_pool()
    if pool is None:
        return f"no warm actors on {address}"
    idle, leased = ray.get(pool.release.remote(), timeout=60)
    more = f"; {leased} in use end when their runs finish" if leased else ""
    return f"ended {idle} warm actor{'s' if idle != 1 else ''} on {address}{more}"
