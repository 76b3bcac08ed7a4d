"""What the ray driver does about a death: fail over, or bring a replacement up.

Three steps, each on its own: choosing the victims of a failure (:func:`victims`),
reacting to a death once it is seen (:func:`on_death`: a chain fails over at once;
every death starts its replacement, a :class:`Replacement` in ``Driver.pending``), and
putting a replacement in service once its down time is over (:func:`activate`). A
lost shard's recovery is measured until its first update applied (a :class:`Measuring`
in ``Driver.measuring``, closed by ``Driver.measure``). A replacement that dies before
it served is replaced in turn, keeping the original down time.

Everything goes through the :class:`~.interface.Driver` protocol; what a shard's
recovery does is the strategy's recovery policy, carried out here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from trainthrough.engines.ray.driver.cluster import RayCluster
from trainthrough.engines.ray.driver.members import Member, MemberState, OutageWork
from trainthrough.events import (
    Detection,
    Failover,
    Recovery,
    RecoveryEnded,
    ReplacementLost,
    ReplicaJoin,
    ShardDown,
    ShardUp,
)
from trainthrough.faults.schedule import FailureEvent
from trainthrough.ft.decisions import RecoveryAction
from trainthrough.ft.perturbation import perturbation

if TYPE_CHECKING:
    from trainthrough.engines.ray.driver.interface import Driver


@dataclass(eq=False)
class Replacement:
    """A replacement started for a death, waiting for its down time to end."""

    #: "worker"; "replica" (joins its chain's tail); "shard" (restored or fresh)
    kind: str
    member: Member  #: the replacement (replaced in turn if it dies before serving)
    at: float  #: when its down time ends (``time.perf_counter``)
    dead: Member  #: the member it replaces


@dataclass(frozen=True)
class Measuring:
    """A shard's recovery, waiting for the first update the shard applies after it."""

    handle: Any  #: the shard's actor (its head, after a failover)
    version: int  #: the shard's version when it was recovered
    kill_time: float  #: when the loss struck (``time.perf_counter``)
    record: Recovery  #: completed with its seconds once measured
    work_at_kill: OutageWork | None  #: the workers' outage work at the kill, if struck


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
            # Members already killed whose death is not seen yet are not struck again.
            members = [n for n in c.chains[shard].members if c.members[n].alive]
            if pos < len(members):
                out.append(members[pos])
        elif e.kind == "worker":
            # The newest incarnation: a replacement still waiting for its down time
            # counts (a failure during recovery).
            live = [m for m in c.members.values()
                    if m.kind == "worker" and m.index == i and m.alive]
            out.extend(m.name for m in live[-1:])
    return out


def on_death(eng: Driver, m: Member, iteration: int) -> None:
    """React to a death seen through its failed ``watch`` call (or ZooKeeper)."""
    c = eng.cluster
    now = time.perf_counter()
    m.transition(MemberState.DEAD, at=now)
    kill_time = m.down_since
    struck = m.strike
    eng.emit(Detection(iteration=iteration, member=m.name, kind=m.kind,
                       detection_seconds=now - kill_time))
    pending = next((p for p in eng.pending if p.member is m), None)
    if pending is not None:
        _replace_pending(eng, pending, m, iteration)
        return
    at = kill_time + eng.cfg.recovery_delay
    if m.kind == "worker":
        eng.incarnation[m.index] += 1
        warm = c.start_worker(m.index, start_step=iteration,
                              incarnation=eng.incarnation[m.index])
        eng.pending.append(Replacement("worker", warm, at, m))
        return
    shard = m.index
    if c.mode != "none" and c.close_over(shard, m.name):
        norm, norm_lost = _delta(eng, m, shard)
        record = Recovery(failed=[m.name], at_iteration=iteration, recovery_seconds=0.0,
                          perturbation_norm=norm, perturbation_norm_lost=norm_lost,
                          action="failover")
        eng.emit(Failover(shard=shard, head=c.chains[shard].members[0]))
        head = c.head(shard)
        eng.measuring.append(Measuring(head, _version(head), kill_time, record,
                                       struck.work if struck else None))
        warm = c.add_replica(shard, join=False, since=kill_time)
        eng.pending.append(Replacement("replica", warm, at, m))
        return
    c.chains[shard].members = [n for n in c.chains[shard].members if n != m.name]
    c.coord.leave(f"shard{shard}", m.name)
    eng.emit(ShardDown(shard=shard, iteration=iteration))
    warm = c.add_replica(shard, join=False, since=kill_time)
    eng.pending.append(Replacement("shard", warm, at, m))


def _replace_pending(eng: Driver, p: Replacement, m: Member, iteration: int) -> None:
    """A replacement died before it served (killed during recovery, or it crashed
    starting): start another for the same loss, keeping the original down time."""
    c = eng.cluster
    if m.kind == "worker":
        eng.incarnation[m.index] += 1
        p.member = c.start_worker(m.index, start_step=iteration,
                                  incarnation=eng.incarnation[m.index])
    else:
        p.member = c.add_replica(m.index, join=False, since=m.down_since)
    eng.emit(ReplacementLost(member=m.name, kind=m.kind, replaced_by=p.member.name,
                             for_=p.dead.name))


def activate(eng: Driver, p: Replacement, iteration: int, runs: dict[str, Any]) -> bool:
    """Put a ready replacement in service (its down time is over).

    Returns:
        False if it could not be done now (a peer it needs died meanwhile): the
        replacement stays pending and is tried again after that death is handled.
    """
    c, m, dead = eng.cluster, p.member, p.dead
    kill_time, struck = dead.down_since, dead.strike
    if p.kind == "worker":
        m.transition(MemberState.SERVING)
        if eng.bsp is None:  # bulk-synchronous workers compute when the driver asks
            runs[m.name] = m.handle.run.remote(eng.max_iter)
        rec = Recovery([dead.name], iteration, time.perf_counter() - kill_time, 0.0,
                       action="restart-worker")
        eng.result.recoveries.append(rec)
        eng.emit(RecoveryEnded(recovery=rec))
        return True
    if p.kind == "replica":
        # A replica copies its state from the chain's tail: while the whole chain is
        # lost it waits for the shard to be restored first (joining an empty chain
        # would make a fresh replica with initial values serve the shard).
        if not c.chains[m.index].members or not c.join_tail(m):
            return False
        m.transition(MemberState.SERVING)
        eng.emit(ReplicaJoin(shard=m.index, member=m.name,
                             chain=list(c.chains[m.index].members)))
        return True
    # The strategy's recovery policy decides; this only carries the decision out.
    decision = eng.recovery_policy.decide((m.index,), eng.checkpointer.count > 0)
    restored, copies = None, None
    try:
        if decision.action in (RecoveryAction.RESTORE_LOST, RecoveryAction.WORKER_COPY) \
                and decision.from_checkpoint:
            restored = eng.saves.restore([m.handle])
        if decision.action is RecoveryAction.WORKER_COPY:
            copies = _from_workers(eng, m, dead, restored is not None)
        elif decision.action is RecoveryAction.ROLLBACK_ALL:
            heads = [m.handle if i == m.index else c.head(i)
                     for i in range(eng.layout.num_shards)]
            restored = eng.saves.restore([h for h in heads if h is not None])
    except (ray.exceptions.RayError, TimeoutError):
        return False  # the replacement (or a peer) died restoring: its death is handled next
    lost = None
    if c.mode != "none":
        # The whole chain was lost: what the workers had acknowledged and the restored
        # state lacks is counted now, before the shard serves (later pushes would hide it).
        try:
            lost = eng.chain_wiped(m.index, m.handle, restored)
        except ray.exceptions.RayError:
            return False  # the replacement died: its death is handled next
    if decision.rewind:
        eng.rewind(restored or 0, iteration)
    if c.mode != "none":
        c.chains[m.index].members = []
        if not c.join_tail(m):
            return False
    else:
        c.join_alone(m)
    m.transition(MemberState.SERVING)
    eng.emit(ShardUp(shard=m.index, iteration=iteration, restored_from=restored,
                     acknowledged_lost=lost))
    norm, norm_lost = _delta(eng, dead, m.index)
    record = Recovery(failed=[dead.name],
                      at_iteration=struck.iteration if struck is not None else iteration,
                      recovery_seconds=0.0, perturbation_norm=norm, perturbation_norm_lost=norm_lost,
                      action=decision.action.value if restored is not None or
                      decision.rewind or copies is not None else "reinit",
                      restored_from=restored, worker_copy=copies)
    eng.measuring.append(Measuring(m.handle, _version(m.handle), kill_time, record,
                                   struck.work if struck else None))
    return True


def _from_workers(eng: Driver, m: Member, dead: Member,
                  from_checkpoint: bool) -> dict[str, Any]:
    """Worker-copy: ask every live worker which version of the shard it holds, then
    the freshest holder for the shard's rows and, for a bulk-synchronous replay, every
    holder of that version for its push slice. Rows and pushes go from worker to shard
    by reference, not through the driver; the transfer is counted in the run's extras.
    """
    c = eng.cluster
    workers = sorted((w for w in c.members.values() if w.kind == "worker" and w.serving),
                     key=lambda w: w.index)
    versions = ray.get([w.handle.copy_version.remote(m.index) for w in workers], timeout=30)
    held = [(w, v) for w, v in zip(workers, versions) if v is not None]
    lost_version = dead.strike.version if dead.strike is not None else None
    replay = lost_version is not None
    replies = []
    if held:
        top = max(v for _, v in held)
        fresh = next(w for w, v in held if v == top)  # the lowest id, as sim picks
        replies = [w.handle.copy_rows.remote(m.index, w is fresh, replay)
                   for w, v in held if w is fresh or (replay and v == top)]
    n = eng.cfg.workers
    divide_by = n if eng.aggregate == "mean" else 1
    out: dict[str, Any] = ray.get(m.handle.recover_from_workers.remote(
        from_checkpoint, lost_version, n, divide_by, len(workers), *replies),
        timeout=60)
    extras = eng.result.extras
    for k in ("messages", "bytes"):
        extras[f"worker_copy_{k}"] = extras.get(f"worker_copy_{k}", 0) + int(out[k] or 0)
    return out


def _version(handle: Any) -> int:
    try:
        return int(ray.get(handle.stats.remote(), timeout=5)["version"])
    except ray.exceptions.RayError:
        return 0


def _delta(eng: Driver, dead: Member, shard: int) -> tuple[float, float]:
    """The recovery's perturbation (from the parameters before ``dead`` was struck;
    None if it died on its own), and its part on the lost shard's rows."""
    before = dead.strike.before if dead.strike is not None else None
    return perturbation(before, eng.cluster.pull(), eng.layout.rows_mask((shard,)))
