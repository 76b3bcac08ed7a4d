"""Data parallel on Ray: the gloo engine's controller, with every rank a Ray actor.

Nothing of the step, the recovery or the protocol is Ray's: the controller
(:class:`~trainthrough.engines.gloo.controller.GlooEngine`), its policies and the rank
session are the gloo engine's; only the way a rank process starts and stops is
(:class:`RayRank`). So a run scales from local Ray to a cluster (``--ray-address``),
with ranks spread over its nodes, and a node lost takes its ranks with it like any
other failure. Each actor runs ``rank_main`` with its spec as JSON (a workload's step,
or a user's loop imported by reference): nothing is pickled but Ray's own call.

On a cluster it joined (``--ray-address``), a user's file travels with the actors
(Ray's ``working_dir``, :func:`~trainthrough.engines.ray.runtime.shipped`).
Collectives are gloo over TCP (NCCL with a GPU per rank: dp/devices.py); a CUDA
replica's actor asks Ray for its share of a GPU. Addresses (gloo/net.py): on a local Ray,
everything is on 127.0.0.1; on a joined cluster the controller's store listens on this
driver's Ray address (or ``--bind-address``) and each rank's gloo on the interface that
holds its own node's Ray address, which the actor reads where it runs.

Placement: the first ranks go round the live nodes by slot; a replacement goes to the
live node that hosts the fewest of this run's live ranks, preferring one where none of
them died (a node that joined after a host was lost gets the group back).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainthrough.engines.base import RunContext
from trainthrough.engines.gloo.controller import GlooEngine
from trainthrough.engines.gloo.protocol import RankSpec
from trainthrough.engines.ray.runtime import ensure_ray_for, shutdown_ray
from trainthrough.engines.result import RunResult
from trainthrough.engines.signals import ProcessIdentity, SignalRefused, identify, send

#: A replacement on a cluster is placed this long before it may join: time to start its
#: actor and import torch (2-5 s measured on a loaded 2-core machine), so it joins warm.
PLACE_LEAD = 3.0


@ray.remote(num_cpus=0, max_restarts=0)
class RankActor:
    """One rank process hosted by Ray (it runs the rank program once, then is killed)."""

    def whoami(self) -> tuple[int, str]:
        """(pid, node id): the driver signals this process only if it is on its node."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(self, spec_json: str) -> int:
        from trainthrough.engines.gloo.rank_main import main

        spec = json.loads(spec_json)
        if spec.get("net") is not None and spec["net"].get("cluster"):
            # This node's address on the cluster: gloo binds to the interface holding it.
            spec["net"]["node_ip"] = ray.util.get_node_ip_address()
        return main(spec)


class RayRank:
    """A rank started as a :class:`RankActor` on the node ``place()`` names, at
    ``start_at`` (now, or later for a replacement on a cluster: see
    :meth:`RayDataParallel.start_rank_actor`). Until then it is a process not yet
    started: not ended, nothing to signal."""

    def __init__(self, spec: RankSpec, place: Callable[[], str], start_at: float = 0.0) -> None:
        self.spec, self._place, self.start_at = spec, place, start_at
        self.target: str | None = None
        self.actor: Any = None
        self.pid: int | None = None
        self.node: str | None = None
        self.ident: ProcessIdentity | None = None
        self._code: int | None = None
        self.why = ""  # Ray's word on why it ended, if it did not end normally
        self._started()

    def _started(self) -> bool:
        """Start the actor if it is time (once); whether it has started."""
        if self.actor is None and self._code is None and time.time() >= self.start_at:
            # The first ranks go exactly where they are put (soft affinity was measured
            # to leave a node empty now and then); later ones may go anywhere their node
            # is not.
            self.target = self._place()
            place = NodeAffinitySchedulingStrategy(self.target,
                                                   soft=self.spec["mode"] != "fresh")
            # A CUDA replica asks Ray for its share of a GPU: Ray hides the GPUs from
            # an actor that asks for none (CUDA_VISIBLE_DEVICES is emptied).
            self.actor = RankActor.options(  # type: ignore[attr-defined]
                scheduling_strategy=place,
                num_gpus=float(self.spec.get("gpus_per_rank", 0.0))).remote()
            self._who = self.actor.whoami.remote()
            self._done = self.actor.run.remote(json.dumps(self.spec))
        return self.actor is not None

    @property
    def exitcode(self) -> int | None:
        if self._code is None and self._started():
            ready, _ = ray.wait([self._done], timeout=0)
            if ready:
                try:
                    self._code = int(ray.get(self._done))
                except ray.exceptions.RayActorError as e:
                    self._code, self.why = -9, _first_line(e)  # the process (or node) died
                except ray.exceptions.RayError as e:
                    self._code, self.why = 1, _first_line(e)
        return self._code

    def join(self, timeout: float | None = None) -> None:
        if self.actor is not None:
            ray.wait([self._done], timeout=timeout)

    def _identify(self) -> None:
        """Learn the actor's pid once it answered; identify it if it is on this node."""
        if self.pid is not None or self.actor is None:
            return
        ready, _ = ray.wait([self._who], timeout=0)
        if ready:
            with contextlib.suppress(ray.exceptions.RayError):
                self.pid, self.node = ray.get(self._who)
                if self.node == ray.get_runtime_context().get_node_id():
                    self.ident = identify(self.pid)

    def close(self) -> None:
        """The rank program ended: free its actor (it would idle on a cluster we joined)."""
        if self.actor is None:
            return
        self._identify()  # where it ran, for the result
        with contextlib.suppress(Exception):  # already dead is fine
            ray.kill(self.actor, no_restart=True)

    def kill(self) -> None:
        """SIGKILL of the identified process on this node, else ``ray.kill`` of the actor
        (one not started yet never will be)."""
        if self.actor is None:
            self._code = -9
            return
        if self.exitcode is not None:
            return
        self._identify()
        if self.ident is not None:
            with contextlib.suppress(SignalRefused):
                send(self.ident)
                return
        with contextlib.suppress(Exception):  # already dead is fine
            ray.kill(self.actor, no_restart=True)


def _first_line(e: Exception) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()]
    return lines[0][:300] if lines else type(e).__name__


def _live_nodes() -> list[str]:
    return sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])


class RayDataParallel(GlooEngine):
    """``--engine ray --paradigm dp``: the gloo controller with ranks on Ray actors."""

    def __init__(self, ctx: RunContext) -> None:
        self.launch = self.start_rank_actor
        super().__init__(ctx)

    def start_rank_actor(self, spec: RankSpec) -> RayRank:
        """A rank actor; a replacement on a cluster is placed :data:`PLACE_LEAD` seconds
        before it may join (``recovery_delay`` after the failure), not at once: a node
        that joined meanwhile (a lost host's successor) can then get it."""
        slot, mode = int(spec["slot"]), str(spec["mode"])
        delay = 0.0
        if mode == "join" and self.cfg.ray_address:
            delay = max(0.0, self.cfg.recovery_delay - PLACE_LEAD)
        return RayRank(spec, lambda: self.place(slot, mode), time.time() + delay)

    def place(self, slot: int, mode: str) -> str:
        """The node for a rank: the first ones round the live nodes by slot (slot i on
        node i mod n, in id order: every node gets ranks, which Ray's best-effort SPREAD
        did not always do); a later one on the live node with the fewest of this run's
        live ranks, one where none died first, then id order."""
        nodes = _live_nodes()
        if mode == "fresh":
            return nodes[slot % len(nodes)]
        live: dict[str, int] = dict.fromkeys(nodes, 0)
        died: set[str] = set()
        for p in self.procs.started:
            if not isinstance(p.process, RayRank) or p.process.actor is None:
                continue  # not placed yet (asking it would start it, placing it here)
            target = str(p.process.target)
            if p.exitcode is None and target in live:
                live[target] += 1
            elif p.exitcode is not None and p.exitcode < 0:
                died.add(target)
        return min(nodes, key=lambda n: (live[n], n in died, nodes.index(n)))

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
