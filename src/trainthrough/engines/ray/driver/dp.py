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
replica's actor asks Ray for its share of a GPU. The controller's store listens on 127.0.0.1
(rank processes on other machines cannot reach it): this engine joins clusters whose
nodes share this host, such as ``ray start`` nodes started here.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import replace

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainthrough.engines.gloo.controller import GlooEngine
from trainthrough.engines.gloo.protocol import RankSpec
from trainthrough.engines.ray.runtime import ensure_ray_for, shutdown_ray
from trainthrough.engines.result import RunResult
from trainthrough.engines.signals import ProcessIdentity, SignalRefused, identify, send


@ray.remote(num_cpus=0, max_restarts=0)
class RankActor:
    """One rank process hosted by Ray (it runs the rank program once, then is killed)."""

    def whoami(self) -> tuple[int, str]:
        """(pid, node id): the driver signals this process only if it is on its node."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(self, spec_json: str) -> int:
        from trainthrough.engines.gloo.rank_main import main

        return main(json.loads(spec_json))


class RayRank:
    """A rank started as a :class:`RankActor`, on the node :func:`_node_for` picks."""

    def __init__(self, spec: RankSpec) -> None:
        # The first ranks go exactly where they are put (soft affinity was measured to
        # leave a node empty now and then); later ones may go anywhere their node is not.
        place = NodeAffinitySchedulingStrategy(_node_for(int(spec["slot"])),
                                               soft=spec["mode"] != "fresh")
        # A CUDA replica asks Ray for its share of a GPU: Ray hides the GPUs from an
        # actor that asks for none (CUDA_VISIBLE_DEVICES is emptied).
        self.actor = RankActor.options(  # type: ignore[attr-defined]
            scheduling_strategy=place, num_gpus=float(spec.get("gpus_per_rank", 0.0))).remote()
        self._who = self.actor.whoami.remote()
        self._done = self.actor.run.remote(json.dumps(spec))
        self.pid: int | None = None
        self.node: str | None = None
        self.ident: ProcessIdentity | None = None
        self._code: int | None = None
        self.why = ""  # Ray's word on why it ended, if it did not end normally

    @property
    def exitcode(self) -> int | None:
        if self._code is None:
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
        ray.wait([self._done], timeout=timeout)

    def _identify(self) -> None:
        """Learn the actor's pid once it answered; identify it if it is on this node."""
        if self.pid is not None:
            return
        ready, _ = ray.wait([self._who], timeout=0)
        if ready:
            with contextlib.suppress(ray.exceptions.RayError):
                self.pid, self.node = ray.get(self._who)
                if self.node == ray.get_runtime_context().get_node_id():
                    self.ident = identify(self.pid)

    def close(self) -> None:
        """The rank program ended: free its actor (it would idle on a cluster we joined)."""
        self._identify()  # where it ran, for the result
        with contextlib.suppress(Exception):  # already dead is fine
            ray.kill(self.actor, no_restart=True)

    def kill(self) -> None:
        """SIGKILL of the identified process on this node, else ``ray.kill`` of the actor."""
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


def _node_for(slot: int) -> str:
    """Ranks go round the live nodes by slot (slot i on node i mod n, nodes in id
    order): every node gets ranks, which Ray's best-effort SPREAD did not always do."""
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    return nodes[slot % len(nodes)]


class RayDataParallel(GlooEngine):
    """``--engine ray --paradigm dp``: the gloo controller with ranks on Ray actors."""

    launch = RayRank

    def run(self) -> RunResult:
        started, ref = ensure_ray_for(self.program or self.cfg.workload, self.cfg.ray_address)
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
