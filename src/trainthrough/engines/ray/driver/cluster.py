"""The actors of one run on Ray: shard chains, workers, their processes and death watches.

It creates, kills and replaces actors and rewires chains as :mod:`trainthrough.ft.chain`
decides. It owns no training logic. Each actor is a
:class:`~trainthrough.engines.ray.driver.members.Member`, whose state changes only
through its ``transition`` (members.py lists the life cycle).

Nothing here blocks on an actor that is still starting (importing torch takes
seconds on a loaded machine): a new actor's identity (pid, node) and any set-up
calls are pending refs that :meth:`RayCluster.ready` checks without waiting, and its
death watch is armed at creation, so a replacement that dies before it ever served is
seen like any other death. A kill goes through :func:`trainthrough.engines.signals.send`
(only a live, identified descendant of this process) and otherwise through
``ray.kill``, which targets the actor itself: never a pid that is 0 or unknown.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from trainthrough.config import RunConfig
from trainthrough.coord.ray import RayCoordinator
from trainthrough.engines.ray.actors.reports import Pulled, WorkerSettings
from trainthrough.engines.ray.driver.members import Member, MemberState
from trainthrough.engines.ray.driver.pool import POOL
from trainthrough.engines.signals import SignalRefused, identify, send
from trainthrough.errors import RunStalled
from trainthrough.ft.chain import on_death, on_join, successors
from trainthrough.ft.strategy import Strategy
from trainthrough.ps.layout import Layout
from trainthrough.workloads.base import OptimizerSpec, Params

if TYPE_CHECKING:
    from trainthrough.engines.ray.chain.zk_membership import ZooKeeperMembership

# ZooKeeper session timeout for replicas: a SIGKILLed replica's node vanishes this
# long after the kill; detection costs it.
ZK_SESSION_SECONDS = 2.0
# A replica's registration makes a few ZooKeeper calls, each bounded by the
# coordinator's 5 s connect timeout.
ZK_JOIN_SECONDS = 30.0
# Start-up of an actor (Python and torch imports) on a loaded machine: 6-12 s measured.
START_SECONDS = 300.0
PULL_SECONDS = 30.0
# The tail's copy of its state into a replacement: the tail holds its lock meanwhile
# (the newcomer must miss no push), so the tail gives up first, then the driver.
ATTACH_SECONDS = 20.0


@dataclass
class Chain:
    """A shard's replicas in chain order (head first)."""

    shard: int
    members: list[str] = field(default_factory=list)


class RayCluster:
    """Creates and tracks the actors of one run."""

    def __init__(self, cfg: RunConfig, strategy: Strategy, layout: Layout, x0: Params,
                 spec: OptimizerSpec, aggregate: str = "mean") -> None:
        from trainthrough.engines.ray.actors.shard_actor import ShardActor
        from trainthrough.engines.ray.actors.worker_actor import WorkerActor

        self._shard_cls, self._worker_cls = ShardActor, WorkerActor
        self.cfg, self.strategy, self.layout, self.spec = cfg, strategy, layout, spec
        self.x0_parts = layout.split(x0)
        self.prefix = f"tt-{uuid.uuid4().hex[:8]}"
        # On a cluster we joined, the nodes chains are spread over (the driver's last);
        # None on a local Ray (one node: Ray places everything).
        self.nodes = _spread_nodes() if cfg.ray_address else None
        self.coord = self._registry()
        self.mode = {"chain-sync": "sync", "chain-async": "async"}.get(strategy.replication, "none")
        self.replicas = cfg.replicas if self.mode != "none" else 1
        # What every worker is told; a worker's own push is 1/N of a mean-aggregated step.
        self.worker_settings = WorkerSettings(
            outage="buffer" if strategy.outage == "buffer" else "wait",
            merge_rule=cfg.merge_rule, merge_threshold=cfg.merge_threshold,
            backlog=cfg.backlog, read_from="tail" if self.mode == "sync" else "head",
            scale=1.0 / cfg.workers if aggregate == "mean" else 1.0,
            keep_copies=strategy.recovery == "worker-copy")
        self.members: dict[str, Member] = {}
        self.zk: Any = None
        self.membership: ZooKeeperMembership | None = None  # set by the driver once serving
        if cfg.coordinator == "zookeeper":
            from trainthrough.coord.zookeeper import ZooKeeperCoordinator

            self.zk = ZooKeeperCoordinator(cfg.zookeeper_hosts or "", namespace=f"/{self.prefix}",
                                           session_timeout=ZK_SESSION_SECONDS)
        self.chains = [Chain(i) for i in range(layout.num_shards)]
        self._serial = 0
        for i in range(layout.num_shards):
            for _ in range(self.replicas):
                self.add_replica(i, join=True)
            self._rewire(i)
        self.spares: list[Member] = [self._new_shard_actor(0, "spare", MemberState.SPARE)]
        for w in range(cfg.workers):
            self.start_worker(w)
        # Wait until every actor answers (actor start includes importing torch).
        for m in self.members.values():
            self.activate(m)

    # -- creation ---------------------------------------------------------------
    def _name(self, what: str) -> str:
        self._serial += 1
        return f"{self.prefix}-{what}-{self._serial}"

    def _registry(self) -> RayCoordinator:
        """The run's registry: a pooled one, emptied, or a new one."""
        def create(options: dict[str, Any]) -> tuple[str, Any]:
            name = f"{self.prefix}-registry"
            return name, RayCoordinator(name, options={**options, **self._on_driver()}).handle()

        name, h, reset = POOL.get(("registry",), create, lambda n, h: h.reset.remote())
        if reset is not None:
            ray.get(reset)  # before any join: a threaded actor does not keep call order
        return RayCoordinator(name, handle=h)

    def _new_shard_actor(self, shard: int, what: str,
                         state: MemberState = MemberState.STARTING,
                         hard: bool = True) -> Member:
        args = (shard, self.layout.shards[shard], self.spec,
                {n: v.clone() for n, v in self.x0_parts[shard].items()})

        position = len(self.chains[shard].members) if state is MemberState.STARTING \
            and hasattr(self, "chains") else None

        def create(options: dict[str, Any]) -> tuple[str, Any]:
            name = self._name(what)
            return name, self._shard_cls.options(  # type: ignore[attr-defined]
                name=name, **options, **self._spread(position, hard)).remote(
                    *args, name, self.cfg.max_lag)

        name, h, reset = POOL.get(("shard",), create,
                                  lambda n, h: h.reset.remote(*args, n, self.cfg.max_lag))
        if reset is not None:
            # Waited for now: a threaded actor does not keep call order, and the chain
            # calls that follow (``set_successor``) must come after the reset.
            ray.get(reset)
        return _armed(Member("shard", shard, name, h, state, pool_key=("shard",)))

    def _on_driver(self) -> dict[str, Any]:
        """Actor options that keep an actor on the driver's node (on a cluster we
        joined): what the run cannot lose with another host (the registry)."""
        if self.nodes is None:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False)}

    def _spread(self, position: int | None, hard: bool) -> dict[str, Any]:
        """Actor options for the chain member (or worker) at ``position`` (0: the head,
        or worker 0): the nodes in turn, the driver's last, so a chain of R >= 2 spans
        hosts and its head is not on the driver's host; spares (None) on the driver's
        node. ``hard`` for the first
        chains and spares (soft affinity was seen to put a tail on the head's host: both
        were lost with it); soft for a replacement, whose node may be gone meanwhile."""
        if self.nodes is None:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = (self.nodes[-1] if position is None
                else self.nodes[position % len(self.nodes)])
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=not hard)}

    def add_replica(self, shard: int, join: bool, since: float | None = None) -> Member:
        """A replica of ``shard`` (joined to the chain now or later).

        Replacements come from a warm spare when one is ready (a process that has
        already started Python and imported torch, which takes seconds here), and a
        new spare is started in the background for the next failure (``since``: when
        the failure this replaces struck, for :meth:`refilled`; now if not given).
        """
        if join or not self.spares:
            m = self._new_shard_actor(shard, f"s{shard}", hard=join)
        else:
            m = self.spares.pop(0)
            # Not waited for here: activation waits until ``become`` has finished.
            m.setup.append(m.handle.become.remote(
                shard, self.layout.shards[shard],
                {n: v.clone() for n, v in self.x0_parts[shard].items()}))
            m.index = shard
            m.transition(MemberState.STARTING)
            self.spares.append(self._new_shard_actor(0, "spare", MemberState.SPARE))
            self.spares[-1].refill_since = time.perf_counter() if since is None else since
        self.members[m.name] = m
        if join:
            self.chains[shard].members.append(m.name)
            self._register(m)
        return m

    def refilled(self) -> list[tuple[Member, float]]:
        """The spares started after a failure that are ready now (never blocks), each
        with the seconds since that failure, reported once. A failure soon after
        another waits for this spare, so these seconds are what advise's calibration
        needs (lab/advise/calibrate.py); a spare taken before it was ready is reported
        when it is, as a member."""
        out = []
        for m in list(self.members.values()) + self.spares:
            if m.refill_since is not None and m.alive and self.ready(m):
                out.append((m, time.perf_counter() - m.refill_since))
                m.refill_since = None
        return out

    def announce(self, shard: int) -> None:
        """Tell live workers that shard ``shard`` is served by someone new."""
        for w in self.members.values():
            if w.kind == "worker" and w.alive:
                w.handle.shard_changed.remote(shard)

    def _register(self, m: Member) -> None:
        """Publish a replica: the Ray registry (workers look handles up there) and, with
        ZooKeeper, the replica's own ephemeral node (deaths are then seen through it)."""
        self.coord.join(f"shard{m.index}", m.name)
        self.announce(m.index)
        if self.zk is None:
            return
        ref = self.join_zookeeper(m)
        if self.membership is not None:  # serving: never wait on ZooKeeper here
            self.membership.joining(m.name, ref)
            return
        try:  # start-up: every replica is registered before training starts
            ray.get(ref, timeout=ZK_JOIN_SECONDS)
        except ray.exceptions.RayError as e:
            why = str(e).strip().splitlines()[-1][:300]
            raise RunStalled(f"replica {m.name} could not join ZooKeeper at "
                             f"{self.cfg.zookeeper_hosts} within {ZK_JOIN_SECONDS:g} s: "
                             f"{why}") from None

    def join_zookeeper(self, m: Member) -> Any:
        """Ask replica ``m`` to join its chain in ZooKeeper (again, if its session
        expired); the ref answers True if it joined, False if it already was a member."""
        return m.handle.join_coordinator.remote(self.cfg.zookeeper_hosts, f"/{self.prefix}",
                                                f"shard{m.index}", ZK_SESSION_SECONDS)

    def start_worker(self, w: int, start_step: int = 0, incarnation: int = 0) -> Member:
        args = (w, self.cfg.workload, self.cfg.workload_options, self.cfg.seed,
                self.cfg.workers, self.layout, self.coord.handle(), self.worker_settings,
                start_step, incarnation)

        def create(options: dict[str, Any]) -> tuple[str, Any]:
            name = self._name(f"w{w}")
            # Round the nodes as chain members go (they ask Ray for no CPU, so Ray
            # would pile them on the driver's node); hard for the first workers, soft
            # for a replacement, whose node may be gone.
            return name, self._worker_cls.options(  # type: ignore[attr-defined]
                name=name, **options, **self._spread(w, incarnation == 0)).remote(*args)

        key = ("worker", self.cfg.workload)
        name, h, reset = POOL.get(key, create, lambda n, h: h.reset.remote(*args))
        m = _armed(Member("worker", w, name, h, MemberState.STARTING, pool_key=key))
        if reset is not None:
            m.setup.append(reset)  # it serves (``run``) only once reset: see ``ready``
        self.members[name] = m
        return m

    def ready(self, m: Member) -> bool:
        """Whether ``m`` has started and finished its set-up (never blocks).

        On the first positive answer its process is identified: on this node, by
        pid and start time, so a later kill reaches exactly this process.
        """
        refs = ([m.whoami] if m.whoami is not None else []) + m.setup
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            if len(done) < len(refs):
                return False
            try:
                ray.get(refs)
            except ray.exceptions.RayError:
                return False  # it died starting: its watch reports the death
            if m.whoami is not None:
                pid, node = ray.get(m.whoami)
                if node == ray.get_runtime_context().get_node_id():
                    m.proc = identify(pid)
            m.whoami, m.setup = None, []
        return True

    def activate(self, m: Member) -> None:
        """Wait until ``m`` is up (start-up only; later callers check :meth:`ready`)."""
        try:
            ray.get([m.whoami, *m.setup] if m.whoami is not None else m.setup,
                    timeout=START_SECONDS)
        except ray.exceptions.GetTimeoutError:
            raise RunStalled(f"actor {m.name} did not start within {START_SECONDS:g} s "
                             "(is the Ray cluster out of memory or processes?)") from None
        self.ready(m)
        m.transition(MemberState.SERVING)

    # -- chains -----------------------------------------------------------------
    def _rewire(self, shard: int) -> None:
        names = tuple(self.chains[shard].members)
        for name, succ in successors(names).items():
            self._set_successor(name, succ)

    def _set_successor(self, name: str, succ: str | None) -> None:
        """Point ``name`` at ``succ``. A member that died meanwhile is skipped: its own
        death is detected next and rewires the chain again."""
        h = self.members[succ].handle if succ else None
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.members[name].handle.set_successor.remote(h, self.mode), timeout=10)

    def head(self, shard: int) -> Any | None:
        ms = self.chains[shard].members
        return self.members[ms[0]].handle if ms else None

    def reader(self, shard: int) -> Any | None:
        ms = self.chains[shard].members
        if not ms:
            return None
        return self.members[ms[-1] if self.mode == "sync" else ms[0]].handle

    def close_over(self, shard: int, dead: str) -> bool:
        """Remove a dead replica from its chain; False if the chain is now empty."""
        change = on_death(tuple(self.chains[shard].members), {dead})
        self.chains[shard].members = list(change.members)
        self.coord.leave(f"shard{shard}", dead)
        for name, succ in change.rewire:
            self._set_successor(name, succ)
        if change.promoted_head is not None and self.mode != "none":
            # Before any worker hears of it: the head it replaces may only be cut off,
            # and its forwards must be refused from now on (ChainLink.lead).
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(self.members[change.promoted_head].handle.lead.remote(), timeout=10)
        self.announce(shard)
        return not change.lost_all

    def join_tail(self, m: Member) -> bool:
        """A replacement copies state from the tail and joins after it.

        Returns:
            False if the tail (or the newcomer) died during the copy: nothing changed,
            and the caller tries again once that death has been handled.
        """
        chain = self.chains[m.index]
        change = on_join(tuple(chain.members), m.name)
        if chain.members:
            tail = self.members[chain.members[-1]]
            if not tail.alive:
                return False  # killed, death not seen yet: join behind its successor later
            try:
                ray.get(tail.handle.attach_tail.remote(m.handle, self.mode, ATTACH_SECONDS),
                        timeout=ATTACH_SECONDS + 10)
            except (ray.exceptions.RayError, TimeoutError):
                return False
        chain.members = list(change.members)
        self._register(m)
        return True

    def join_alone(self, m: Member) -> None:
        """A restarted shard (no replication) takes its place in the registry."""
        self.chains[m.index].members = [m.name]
        self._register(m)

    # -- failures ---------------------------------------------------------------
    def kill(self, name: str) -> float:
        """Kill one of this run's actors: SIGKILL of its identified process on this node,
        else ``ray.kill`` of the actor (another node, or not identified yet)."""
        m = self.members[name]
        m.transition(MemberState.KILLED)
        delivered = False
        if m.proc is not None:
            with contextlib.suppress(SignalRefused):
                send(m.proc)
                delivered = True  # or it had already died: either way it is gone
        if not delivered:
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(m.handle, no_restart=True)
        return m.down_since

    def pull(self) -> Params | None:
        """Current parameters from the read replicas (None if a shard has none live)."""
        readers = [self.reader(i) for i in range(self.layout.num_shards)]
        live = [r for r in readers if r is not None]
        if len(live) < len(readers):
            return None
        try:  # bounded: a reader that hangs is a failure, seen by its watch or ZooKeeper
            parts: list[Pulled] = ray.get([r.pull.remote() for r in live], timeout=PULL_SECONDS)
        except ray.exceptions.RayError:
            return None
        return self.layout.assemble([p.params for p in parts])

    def shutdown(self, reuse: bool = True) -> None:
        """End the run's actors: those that ended it cleanly go back to the pool
        (``reuse``; they are released first), the others are killed."""
        back: list[tuple[Hashable, str, Any, Any]] = []
        kill: list[Any] = []
        for m in list(self.members.values()) + self.spares:
            if reuse and m.alive and m.pool_key:
                back.append((m.pool_key, m.name, m.handle, m.handle.release.remote()))
            else:
                kill.append(m.handle)
        if reuse:
            back.append((("registry",), self.coord.name, self.coord.handle(),
                         self.coord.handle().release.remote()))
        else:
            kill.append(self.coord.handle())
        for h in kill:
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(h, no_restart=True)
        POOL.give_back(back)
        if self.zk is not None:
            self.zk.close()


def _spread_nodes() -> list[str]:
    """The live nodes in id order, the driver's moved last."""
    own = ray.get_runtime_context().get_node_id()
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    return [n for n in nodes if n != own] + [n for n in nodes if n == own]


def seen_dead(m: Member, watch: Any) -> bool:
    """Whether ``m``'s ``watch`` call, ended, says it died. Ray ends it with
    ``ActorUnavailableError`` when only the connection to the actor broke (its host cut
    off, then healed: measured on two network namespaces, the calls of a worker that
    lived on all failed so): that is no death, and a replacement beside a worker still
    pushing would train its partition twice. Its watch is armed again; if its node is
    really gone, Ray reports the death once it drops the node."""
    try:
        ray.get(watch, timeout=0)
    except ray.exceptions.ActorUnavailableError:
        m.watch = m.handle.watch.remote()
        return False
    except ray.exceptions.RayError:
        pass
    return True


def _armed(m: Member) -> Member:
    """Ask a new actor who it is and arm its death watch (both run once it is up)."""
    m.whoami = m.handle.whoami.remote()
    m.watch = m.handle.watch.remote()
    return m
