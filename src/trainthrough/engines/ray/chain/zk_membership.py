"""ZooKeeper membership of a Ray run's chains: ZooKeeper suspects, Ray confirms.

A replica's ephemeral znode vanishing means its ZooKeeper session ended: the process
died (what detection is for), or the session expired while the process lived on (the
server, or the whole loaded machine, paused longer than the session timeout). The
second is no death: one pause of the server can expire every replica's session at
once, and taking that for deaths would restart every shard from its initial values
(acknowledged updates gone) while the live replicas ran on outside every chain. And a
notification can be lost (the driver's own session expired with it), so ZooKeeper's
silence must not leave a death unhandled. So:

* a serving replica missing from ZooKeeper's list (its znode vanished, or it expired
  before the driver's watch began) is a suspect. Ray already reported the process
  dead: a death. Else it is asked for its pid, waiting at most ``PING_SECONDS``: an
  answer means only the session flapped, and the replica joins again in its new
  session (retried every ``RETRY_SECONDS`` while ZooKeeper does not answer), keeping
  its chain place; no answer means it hangs: it is killed (fenced: a replica the
  chain goes on without must not serve) and its death handled;
* a death Ray reported is handled after ``GRACE_SECONDS`` even if ZooKeeper never
  reports it: detection waits for ZooKeeper (its session timeout is the detection
  cost this coordinator models), but never forever;
* a ZooKeeper that stays unreachable for ``OUTAGE_SECONDS`` ends the run with that
  reason (:class:`~trainthrough.errors.RunStalled`) rather than a run that can
  never register its replicas.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from trainthrough.coord.base import CoordinatorError
from trainthrough.errors import RunStalled
from trainthrough.events import Event, Fenced, ZookeeperAbsent, ZookeeperRejoined, ZookeeperSilent

if TYPE_CHECKING:
    from trainthrough.engines.ray.driver.cluster import RayCluster
    from trainthrough.engines.ray.driver.members import Member

PING_SECONDS = 2.0
GRACE_SECONDS = 6.0  # 3x the replicas' session timeout (cluster.ZK_SESSION_SECONDS)
RETRY_SECONDS = 1.0
OUTAGE_SECONDS = 60.0


class ZooKeeperMembership:
    """The driver's side of ZooKeeper membership; :meth:`step` runs at every tick."""

    def __init__(self, c: RayCluster, emit: Callable[[Event], None]) -> None:
        self.c, self.emit = c, emit
        self._lock = threading.Lock()  # the watch callbacks run on kazoo's thread
        self._latest: dict[int, list[str]] = {}  # shard -> members ZooKeeper listed last
        self._ray_dead: dict[str, float] = {}  # name -> when Ray reported the death
        self._rejoin_at: dict[str, float] = {}  # name -> next attempt
        self._joining: dict[str, Any] = {}  # name -> pending join_coordinator ref
        self._first: set[str] = set()  # whose pending join is their first (a replacement)
        self._failing_since: float | None = None  # first failed join since the last success
        self._last_error = ""
        self._watch_retry = 0.0
        self._unwatched = list(range(c.layout.num_shards))
        self._watch(time.perf_counter())

    def _watch(self, now: float) -> None:
        """Arm the watch of each shard's chain not watched yet (retried at later steps
        while ZooKeeper does not answer)."""
        for i in list(self._unwatched):

            def on_change(members: list[str], i: int = i) -> None:
                with self._lock:
                    self._latest[i] = list(members)

            try:  # calls back now with the current members, then on every change and
                # after the driver's own session is re-established (kazoo re-arms it)
                self.c.zk.watch(f"shard{i}", on_change)
            except CoordinatorError as e:
                self._failed(now, str(e))
                return
            self._unwatched.remove(i)
            self._failing_since = None

    def ray_death(self, m: Member) -> None:
        """Ray saw ``m`` (a serving replica) die; ZooKeeper should report it soon."""
        self._ray_dead.setdefault(m.name, time.perf_counter())

    def rejoin(self, name: str) -> None:
        """``name`` is not (or no longer) registered: join it (again) at the next step."""
        self._rejoin_at.setdefault(name, 0.0)

    def joining(self, name: str, ref: Any) -> None:
        """``name``'s registration is under way (``ref``): collected at a later step."""
        self._joining[name] = ref
        self._first.add(name)

    def _serving(self, name: str) -> Member | None:
        m = self.c.members.get(name)
        if m is None or not m.in_service or name not in self.c.chains[m.index].members:
            return None
        return m

    def step(self) -> list[Member]:
        """Serving replicas to handle as dead now (fenced if need be); rejoins started
        and collected.

        Raises:
            RunStalled: ZooKeeper refused every registration for ``OUTAGE_SECONDS``.
        """
        now = time.perf_counter()
        with self._lock:  # each list once: what changed since the last step
            fresh, self._latest = self._latest, {}
        dead: list[Member] = []
        suspects: list[Member] = []
        for i, listed in fresh.items():
            # A serving replica ZooKeeper does not list, unless its registration is
            # under way: its session ended (or it expired before this watch began).
            for name in list(self.c.chains[i].members):
                m = self._serving(name)
                if (m is None or name in listed or name in self._joining
                        or name in self._rejoin_at):
                    continue
                if name in self._ray_dead or not m.alive:
                    self._ray_dead.pop(name, None)
                    dead.append(m)
                else:
                    suspects.append(m)
        dead += self._confirm(suspects, now)
        for name, seen in list(self._ray_dead.items()):
            m = self._serving(name)
            if m is None:
                del self._ray_dead[name]
            elif now - seen >= GRACE_SECONDS:
                del self._ray_dead[name]
                self.emit(ZookeeperSilent(member=name, shard=m.index, waited_seconds=now - seen))
                dead.append(m)
        if self._unwatched and now >= self._watch_retry:
            self._watch_retry = now + RETRY_SECONDS
            self._watch(now)
        self._rejoins(now)
        return dead

    def _confirm(self, suspects: list[Member], now: float) -> list[Member]:
        """Ask each suspect for its pid (one bounded wait for all): live ones rejoin,
        dead ones are returned, silent ones killed and returned."""
        if not suspects:
            return []
        refs = {m.handle.pid.remote(): m for m in suspects}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=PING_SECONDS)
        dead = []
        for ref, m in refs.items():
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayError:
                    dead.append(m)  # it died meanwhile (its watch tells the same)
                    continue
                self.emit(ZookeeperAbsent(member=m.name, shard=m.index, action="rejoin"))
                self.rejoin(m.name)
                continue
            self.c.kill(m.name)  # it hangs: fenced, since the chain goes on without it
            self.emit(Fenced(member=m.name, shard=m.index,
                             reason=f"ZooKeeper lost it and it did not answer within "
                                    f"{PING_SECONDS:g} s"))
            dead.append(m)
        return dead

    def _failed(self, now: float, error: str) -> None:
        self._last_error = (error.strip().splitlines() or [""])[-1][:300]
        self._failing_since = self._failing_since or now

    def _rejoins(self, now: float) -> None:
        for name, ref in list(self._joining.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue  # every ZooKeeper call in it is bounded: it ends
            del self._joining[name]
            try:
                if ray.get(ref) and name not in self._first:
                    self.emit(ZookeeperRejoined(member=name))
                self._first.discard(name)
                self._failing_since = None
            except ray.exceptions.RayActorError:
                pass  # it died: Ray (and ZooKeeper, if it was registered) report it
            except ray.exceptions.RayError as e:
                self._failed(now, str(e))
                self._rejoin_at[name] = now + RETRY_SECONDS
        for name, at in list(self._rejoin_at.items()):
            m = self.c.members.get(name)
            if m is None or not m.alive:
                del self._rejoin_at[name]
            elif at <= now and name not in self._joining:
                del self._rejoin_at[name]
                self._joining[name] = self.c.join_zookeeper(m)
        owed = self._unwatched or self._rejoin_at or self._joining
        if not owed:
            self._failing_since = None
        elif self._failing_since is not None and now - self._failing_since > OUTAGE_SECONDS:
            raise RunStalled(
                f"ZooKeeper at {self.c.cfg.zookeeper_hosts} failed every call for "
                f"{now - self._failing_since:.0f} s (last: {self._last_error}); "
                "check the server (or pass --zookeeper-hosts of a healthy one)")
