"""What the ray driver does about a death: fail over, or bring a replacement up.

Split from the driver loop so each path reads on its own: choosing victims,
reacting to a death (detection), and putting a replacement in service once its
down time is over (activation).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ray

from trainthrough.engines.ray.cluster import Member, RayCluster
from trainthrough.engines.result import Recovery
from trainthrough.faults.schedule import FailureEvent

if TYPE_CHECKING:
    from trainthrough.engines.ray.engine import RayEngine


def victims(c: RayCluster, e: FailureEvent) -> list[str]:
    """The actor names a failure event kills.

    ``shards=i`` kills the process serving shard i: under chain replication its head,
    or the replica at position ``replica=`` of its chain; ``replicas=k`` kills position
    k of shard 0's chain; ``workers=w`` kills worker w's current incarnation.
    """
    out = []
    for i in e.ids:
        if e.kind in ("shard", "replica"):
            shard, pos = (i, e.replica or 0) if e.kind == "shard" else (0, i)
            members = c.chains[shard].members
            if pos < len(members):
                out.append(members[pos])
        elif e.kind == "worker":
            live = [m for m in c.members.values()
                    if m.kind == "worker" and m.index == i and m.killed_at is None]
            out.extend(m.name for m in live[-1:])
    return out


def on_death(eng: RayEngine, m: Member, iteration: int) -> None:
    """React to a death seen through its failed ``watch`` call."""
    c = eng.c
    now = time.perf_counter()
    kill_time = getattr(m, "kill_time", None) or now
    m.killed_at = m.killed_at or now
    m.watch = None
    eng._emit({"type": "detection", "iteration": iteration, "member": m.name,
               "kind": m.kind, "detect_seconds": now - kill_time})
    at = kill_time + eng.cfg.recovery_delay
    if m.kind == "worker":
        eng.incarnation[m.index] += 1
        warm = c.start_worker(m.index, start_step=iteration,
                              incarnation=eng.incarnation[m.index])
        eng.pending.append({"kind": "worker", "member": warm, "at": at, "dead": m})
        return
    shard = m.index
    if c.mode != "none" and c.close_over(shard, m.name):
        record = Recovery(failed=[m.name], at_iteration=iteration, recovery_seconds=0.0,
                          perturbation_norm=_delta(eng, getattr(m, "before", None)),
                          action="failover")
        eng._emit({"type": "failover", "shard": shard, "head": c.chains[shard].members[0]})
        head = c.head(shard)
        eng.measuring.append({"handle": head, "version": _version(head),
                              "kill_time": kill_time, "record": record,
                              "work_at_kill": getattr(m, "work_at_kill", None)})
        warm = c.add_replica(shard, join=False)
        eng.pending.append({"kind": "replica", "member": warm, "at": at, "dead": m})
        return
    c.chains[shard].members = [n for n in c.chains[shard].members if n != m.name]
    c.coord.leave(f"shard{shard}", m.name)
    eng._emit({"type": "down", "shard": shard, "iteration": iteration})
    warm = c.add_replica(shard, join=False)
    eng.pending.append({"kind": "shard", "member": warm, "at": at, "dead": m})


def activate(eng: RayEngine, p: dict[str, Any], iteration: int, runs: dict[str, Any]) -> None:
    """Put a replacement in service (its down time is over)."""
    c, m, dead = eng.c, p["member"], p["dead"]
    kill_time = getattr(dead, "kill_time", None) or dead.killed_at
    c.activate(m)
    if p["kind"] == "worker":
        runs[m.name] = m.handle.run.remote(eng.max_iter)
        rec = Recovery([dead.name], iteration, time.perf_counter() - kill_time, 0.0,
                       action="restart-worker")
        eng.result.recoveries.append(rec)
        eng._emit({"type": "recovery", **rec.__dict__})
        return
    if p["kind"] == "replica":
        c.join_tail(m)
        eng._emit({"type": "replica-join", "shard": m.index, "member": m.name,
                   "chain": list(c.chains[m.index].members)})
        return
    restored = None
    if eng.strategy.checkpoint != "none":
        restored = ray.get(m.handle.restore.remote(eng.url))
        if eng.strategy.recovery == "rollback-all":
            others = [c.head(i) for i in range(eng.layout.num_shards) if i != m.index]
            ray.get([h.restore.remote(eng.url) for h in others if h is not None])
    if c.mode != "none":
        c.chains[m.index].members = []
        c.join_tail(m)
    else:
        c.join_alone(m)
    eng._emit({"type": "up", "shard": m.index, "iteration": iteration, "restored_from": restored})
    record = Recovery(failed=[dead.name],
                      at_iteration=getattr(dead, "fail_iteration", iteration),
                      recovery_seconds=0.0,
                      perturbation_norm=_delta(eng, getattr(dead, "before", None)),
                      action="restore" if restored is not None else "reinit",
                      restored_from=restored)
    eng.measuring.append({"handle": m.handle, "version": _version(m.handle),
                          "kill_time": kill_time, "record": record,
                          "work_at_kill": getattr(dead, "work_at_kill", None)})


def _version(handle: Any) -> int:
    try:
        return int(ray.get(handle.stats.remote(), timeout=5)["version"])
    except ray.exceptions.RayError:
        return 0


def _delta(eng: RayEngine, before: Any) -> float:
    from trainthrough.engines.ray.engine import perturbation

    return perturbation(before, eng.c.pull())
