"""The host of a data-parallel run's rank processes on one Ray node.

A rank is not an actor of its own: an actor is a Python process that imports torch,
seconds of CPU each, for every rank and every replacement. One :class:`RankHost` per
node of a run (per rank where each rank asks Ray for its own GPU share) starts the
node's ranks the way the gloo engine starts local ones (``engines/gloo/procs.py``
``local_launch``: forked from a zygote that imported torch once, or ``python -m``
with ``TRAINTHROUGH_RANK_START=exec``), so a rank or its replacement starts in
milliseconds once its node's host is up, and a rank process holds no Ray of its own.

Each rank is known by a token the driver chooses, so a kill that reaches the host
before the rank's start (calls run on the host's threads, in no set order) is kept
and the start refused. A host that dies (its node lost, or killed) takes the answer
of every pending ``wait`` with it: the driver reads that as its ranks' deaths.
"""

from __future__ import annotations

import contextlib
import json
import threading

import ray

from trainthrough.engines.gloo.procs import Child, local_launch
from trainthrough.engines.gloo.protocol import RankSpec

#: Ranks one host serves at once (each waits on a thread of its own).
MAX_RANKS = 256


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=MAX_RANKS)  # type: ignore[call-overload]
class RankHost:
    """Starts, waits for, signals and ends the rank processes of one run on its node."""

    def __init__(self) -> None:
        self._launch = local_launch()  # the zygote starts now, importing torch meanwhile
        self._ranks: dict[str, Child] = {}
        self._killed: set[str] = set()
        self._lock = threading.Lock()

    def start(self, token: str, spec_json: str) -> tuple[int, str] | None:
        """Start the rank ``token`` runs; (its pid, this node's id), or None if it was
        killed before it could start."""
        spec = RankSpec.from_dict(json.loads(spec_json))
        net = spec.run.net
        if net is not None and net.get("cluster"):
            # This node's address on the cluster: gloo binds to the interface holding it.
            net["node_ip"] = ray.util.get_node_ip_address()
        with self._lock:
            if token in self._killed:
                return None
            child = self._launch(spec)
            self._ranks[token] = child
        return int(child.pid or 0), str(ray.get_runtime_context().get_node_id())

    def wait(self, token: str, started: tuple[int, str] | None) -> int:
        """Block until the rank ``token`` ended; its exit code (-N: killed by signal N;
        -9 for one killed before it started). ``started``: what :meth:`start` answered
        (the driver passes its reference, so Ray runs this only after the start)."""
        del started
        with self._lock:
            child = self._ranks.get(token)
        if child is None:
            return -9
        child.join(None)
        code = child.exitcode
        child.close()
        return -9 if code is None else code

    def kill(self, token: str) -> None:
        """SIGKILL of the rank ``token`` (only the process this host started), or a
        refusal of its start if it has not started yet."""
        with self._lock:
            child = self._ranks.get(token)
            if child is None:
                self._killed.add(token)
                return
        child.kill()

    def end(self) -> None:
        """Kill every rank still running: the run is over (a rank cut off from its
        controller would otherwise live until its next call to the store)."""
        with self._lock:
            children = list(self._ranks.values())
        for child in children:
            with contextlib.suppress(Exception):
                if child.exitcode is None:
                    child.kill()
