"""Data parallel on Ray: the gloo engine's controller, with every rank a Ray actor.

Nothing of the step, the recovery or the protocol is Ray's: the controller
(:class:`~trainthrough.engines.gloo.controller.GlooEngine`), its policies and the rank
session are the gloo engine's; only the way a rank process starts and stops is
(:class:`RayRank`). So a run scales from local Ray to a cluster (``--ray-address``),
with ranks spread over its nodes, and a node lost takes its ranks with it like any
other failure. A rank is a process of its node's :class:`~trainthrough.engines.ray.
actors.rank_host.RankHost` actor (one per node of the run), forked from the zygote
the host started, as a local gloo rank is: a rank or its replacement starts in
milliseconds once its node's host is up, instead of a Ray actor importing torch for
seconds. Each runs ``rank_main`` with its spec as JSON (a workload's step, or a
user's loop imported by reference): nothing is pickled but Ray's own call.

On a cluster it joined (``--ray-address``), a user's file travels with the actors
(Ray's ``working_dir``, :func:`~trainthrough.engines.ray.runtime.shipped`).
Collectives are gloo over TCP (NCCL with a GPU per rank: dp/devices.py); a CUDA
replica's actor asks Ray for its share of a GPU. Addresses (gloo/net.py): on a local Ray,
everything is on 127.0.0.1; on a joined cluster the controller's store listens on this
driver's Ray address (or ``--bind-address``) and each rank's gloo on the interface that
holds its own node's Ray address, which the rank's host reads where it runs.

Placement (placement.py decides, each choice an event ``rank-placed``): the first
ranks round the live nodes, a replacement for a rank lost with its host on the host's
successor (waiting for it, bounded), else the least loaded node. The affinity is hard,
so a node that was chosen is the node it runs on; if that node dies before its host
started the rank there, the rank is placed again.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainthrough.engines.base import RunContext
from trainthrough.engines.gloo.controller import GlooEngine
from trainthrough.engines.gloo.protocol import RankSpec
from trainthrough.engines.ray.actors.rank_host import RankHost
from trainthrough.engines.ray.driver.placement import Placement, RankAt, place
from trainthrough.engines.ray.runtime import ensure_ray_for, shutdown_ray
from trainthrough.engines.result import RunResult
from trainthrough.engines.signals import (
    ProcessIdentity,
    SignalRefused,
    identify,
    send,
    stopped,
)
from trainthrough.events import RankPlaced

#: A replacement on a cluster is placed this long before it may join: time to start its
#: node's host (a new node's: an actor, then a zygote importing torch, 2-5 s measured on
#: a loaded 2-core machine), so it joins warm.
PLACE_LEAD = 3.0
#: Hosts asked to start one rank whose start never happened (its node died before it
#: could, or could not take it) before that counts as the rank's death.
PLACE_TRIES = 3


class RankHosts:
    """The run's :class:`RankHost` actors: one per node, or one per rank where each rank
    asks Ray for its own share of a GPU (Ray hides the GPUs from an actor that asks for
    none, and gives an actor the share it asked for)."""

    def __init__(self) -> None:
        self._on: dict[str, Any] = {}  # node id -> its host
        self._all: list[Any] = []

    def on(self, node: str, gpus: float) -> Any:
        """The host for a rank on ``node`` (started if there is none yet)."""
        if not gpus and node in self._on:
            return self._on[node]
        host = RankHost.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            num_gpus=gpus).remote()
        self._all.append(host)
        if not gpus:
            self._on[node] = host
        return host

    def lost(self, node: str, host: Any) -> None:
        """``host`` never started on ``node``: the next rank placed there gets a new one."""
        if self._on.get(node) is host:
            del self._on[node]

    def end(self) -> None:
        """End every host: each kills the ranks it still runs (bounded: a host on a lost
        or cut-off node answers nothing), then Ray kills it."""
        ray.wait([h.end.remote() for h in self._all], num_returns=len(self._all), timeout=5)
        for h in self._all:
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(h, no_restart=True)
        self._all.clear()
        self._on.clear()


class RayRank:
    """A rank started by its node's host on the node ``place()`` names, at ``start_at``
    (now, or later for a replacement on a cluster: see
    :meth:`RayDataParallel.start_rank`). Until then it is a process not yet
    started: not ended, nothing to signal."""

    def __init__(self, spec: RankSpec, place: Callable[[float, set[str]], str | None],
                 hosts: RankHosts, start_at: float = 0.0) -> None:
        self.spec, self._place, self._hosts, self.start_at = spec, place, hosts, start_at
        self.target: str | None = None
        self.host: Any = None
        self.token = ""
        self.pid: int | None = None
        self.node: str | None = None
        self.ident: ProcessIdentity | None = None
        self._code: int | None = None
        self.why = ""  # Ray's word on why it ended, if it did not end normally
        self.placed = 0  # how many times a host was asked to start it
        self.killed = False  # the controller ended it
        self.never_on: set[str] = set()  # nodes where it never started
        self._started()

    def _started(self) -> bool:
        """Ask the host of the node ``place`` names to start it, if it is time and
        ``place`` names one (it may wait for one: None); whether that was done."""
        if self.host is None and self._code is None and time.time() >= self.start_at:
            target = self._place(time.time() - self.start_at, self.never_on)
            if target is None:
                return False
            # Hard: soft affinity was measured to leave a node empty now and then, and to
            # pass over a node that had just joined. A node that dies before the rank
            # started there is handled in exitcode (placed again).
            self.target, self.placed = target, self.placed + 1
            self.host = self._hosts.on(target, self.spec.run.gpus_per_rank)
            self.token = f"{self.spec.slot}-{uuid.uuid4().hex}"
            self._who = self.host.start.remote(self.token, json.dumps(self.spec.to_dict()))
            self._done = self.host.wait.remote(self.token, self._who)
        return self.host is not None

    def _never_ran(self) -> bool:
        """Its start never happened, and not because we killed it: its host never
        started (its node died, or could not take it), so nothing ran and it may be
        placed again, :data:`PLACE_TRIES` times at most."""
        if self.killed or self.placed >= PLACE_TRIES:
            return False
        ready, _ = ray.wait([self._who], timeout=0)
        if ready:
            try:
                ray.get(self._who)
                return False  # it started: its end is a death like any other
            except ray.exceptions.RayError:
                pass
        return True

    @property
    def exitcode(self) -> int | None:
        if self._code is None and self._started():
            ready, _ = ray.wait([self._done], timeout=0)
            if ready:
                try:
                    self._code = int(ray.get(self._done))
                except ray.exceptions.RayError as e:
                    if self._never_ran():  # its node died first: place it again
                        self._hosts.lost(str(self.target), self.host)
                        self.host = None
                        self.never_on.add(str(self.target))
                        return None
                    died = isinstance(e, ray.exceptions.RayActorError)  # its host, node
                    self._code, self.why = (-9 if died else 1), _first_line(e)
        return self._code

    def join(self, timeout: float | None = None) -> None:
        if self.host is not None:
            ray.wait([self._done], timeout=timeout)

    def _identify(self) -> None:
        """Learn the rank's pid once its host started it; identify it if it is on this
        node."""
        if self.pid is not None or self.host is None:
            return
        ready, _ = ray.wait([self._who], timeout=0)
        if ready:
            with contextlib.suppress(ray.exceptions.RayError, TypeError):
                self.pid, self.node = ray.get(self._who)
                if self.node == ray.get_runtime_context().get_node_id():
                    self.ident = identify(self.pid)

    def close(self) -> None:
        """The rank program ended: learn where it ran, for the result (its host, which
        serves the node's other ranks, ends with the run)."""
        self._identify()

    def resume(self) -> bool:
        """SIGCONT of the identified process on this node (a process on another node is
        not ours to signal: this engine does not claim ``mode=pause``)."""
        if self.exitcode is not None:
            return True
        self._identify()
        if self.ident is None or not stopped(self.ident):
            return False
        with contextlib.suppress(SignalRefused):
            send(self.ident, signal.SIGCONT)
        return True

    def kill(self) -> None:
        """SIGKILL of the identified process on this node, else by its host (one not
        started yet never will be)."""
        self.killed = True
        if self.host is None:
            self._code = -9
            return
        if self.exitcode is not None:
            return
        self._identify()
        if self.ident is not None:
            with contextlib.suppress(SignalRefused):
                send(self.ident)
                return
        with contextlib.suppress(Exception):  # its host already dead is fine
            self.host.kill.remote(self.token)


def _first_line(e: Exception) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()]
    return lines[0][:300] if lines else type(e).__name__


def _live_nodes() -> list[str]:
    return sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])


class RayDataParallel(GlooEngine):
    """``--engine ray --paradigm dp``: the gloo controller with ranks on Ray actors."""

    takes_notice = False  # an actor's SIGTERM is Ray's (see the ray package's CAPABILITIES)

    def __init__(self, ctx: RunContext) -> None:
        self.launch = self.start_rank
        self.known: set[str] = set()  # the live nodes when the first ranks were placed
        self.hosts = RankHosts()
        super().__init__(ctx)

    def start_rank(self, spec: RankSpec) -> RayRank:
        """A rank actor; a replacement on a cluster is placed :data:`PLACE_LEAD` seconds
        before it may join (``recovery_delay`` after the failure), not at once: a node
        that joined meanwhile (a lost host's successor) can then get it."""
        slot, mode = spec.slot, spec.mode
        delay = 0.0
        if mode == "join" and self.cfg.ray_address:
            delay = max(0.0, self.cfg.recovery_delay - PLACE_LEAD)
        return RayRank(spec, lambda waited, avoid: self.place(slot, mode, waited, avoid),
                       self.hosts, time.time() + delay)

    def place(self, slot: int, mode: str, waited: float, avoid: set[str]) -> str | None:
        """The node for a rank (None: not yet, wait for one), recorded as an event. A
        replacement still waiting when the run stops is never placed (it is killed)."""
        if mode == "join" and self.stopping:
            return None
        p = self.placement(slot, mode, waited, avoid)
        if p is not None and self.cfg.ray_address:  # a local Ray has one node: no news
            self.emit(RankPlaced(slot=slot, mode=mode, node=p.node, address=p.address,
                                 why=p.why, waited_seconds=round(waited, 3)))
        return None if p is None else p.node

    def placement(self, slot: int, mode: str, waited: float,
                  avoid: set[str]) -> Placement | None:
        """Where a rank goes (placement.py decides; ``waited``: seconds since it could
        first have been placed; ``avoid``: nodes where its actor never started). None
        while a replacement waits for a node."""
        alive = {n["NodeID"]: str(n.get("NodeManagerAddress", "")) for n in ray.nodes()
                 if n["Alive"]}
        if mode == "fresh":
            self.known.update(alive)
        placed = [(p, str(p.process.target)) for p in self.procs.started
                  # not placed yet: asking it would start it, placing it here
                  if isinstance(p.process, RayRank) and p.process.host is not None]
        ranks = [RankAt(node, p.exitcode is None, p.exitcode is not None and p.exitcode < 0)
                 for p, node in placed]
        home = next((node for p, node in reversed(placed) if p.slot == slot), None)
        if home in avoid:
            home = None
        return place(slot, mode, alive, self.known, ranks, waited, home)

    def cluster_ip(self) -> str | None:
        """This driver's Ray address on a cluster it joined (None on a local Ray)."""
        return ray.util.get_node_ip_address() if self.cfg.ray_address else None

    def run(self) -> RunResult:
        started, ref = ensure_ray_for(self.program or self.cfg.workload, self.cfg.ray_address,
                                      node_ip=self.cfg.bind_address)
        if self.program is not None:  # as the actors see it (a cluster we join: shipped)
            self.program = ref
        else:
            self.cfg = replace(self.cfg, workload=ref)
        try:
            return super().run()
        finally:
            self.hosts.end()
            if started:
                shutdown_ray()

    def _finish(self) -> RunResult:
        r = super()._finish()
        # Where each rank process ran: slot -> the node ids of its incarnations.
        nodes: dict[str, list[str | None]] = {}
        for p in self.procs.started:
            nodes.setdefault(str(p.slot), []).append(getattr(p.process, "node", None))
        r.extras["rank_nodes"] = nodes
        return r
