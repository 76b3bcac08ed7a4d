"""Carrying out failures and recovery decisions in the simulated cluster.

The strategy's recovery policy decides; this module acts, charges the virtual
clock and measures the perturbation ``delta = x_restored - x_before_failure``
that SCAR's analysis is about.
"""

from __future__ import annotations

from collections.abc import Callable

from trainthrough.engines.sim.checkpoints import SimCheckpointer
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.cluster import SimCluster
from trainthrough.events import (
    CheckpointCorrupt,
    Detection,
    Event,
    Failure,
    Recovery,
    RecoveryEnded,
)
from trainthrough.faults.schedule import FailureEvent, FailureSchedule
from trainthrough.ft.decisions import RecoveryAction
from trainthrough.ft.perturbation import perturbation
from trainthrough.ft.recovery import RecoveryPolicy
from trainthrough.ft.worker_copy import load_rebuilt, rebuild, record, replay
from trainthrough.workloads.base import Params


class SimRecovery:
    """Delivers due failures and recovers from them."""

    def __init__(self, cluster: SimCluster, schedule: FailureSchedule, policy: RecoveryPolicy,
                 checkpointer: SimCheckpointer, clock: VirtualClock, costs: Costs,
                 emit: Callable[[Event], None], replay_rounds: bool = False) -> None:
        """``replay_rounds``: worker-copy recovery re-applies the round its copies
        missed (bulk-synchronous only; see ft/worker_copy.py's ``replay``)."""
        self.c = cluster
        self.replay_rounds = replay_rounds
        self.checkpointer = checkpointer
        self.schedule = schedule
        self.policy = policy
        self.clock = clock
        self.costs = costs
        self.emit = emit
        self.failures = 0
        self._restarting: set[int] = set()
        self.before: tuple[Params, float] = ({}, 0.0)

    def deliver(self, executed: int, logical: int) -> tuple[int, Recovery | None, int]:
        """Fire the failures due now and recover.

        Returns:
            (logical iteration after recovery, the recovery record or None,
             worker pushes whose effect was undone).
        """
        events = self.schedule.due(executed, self.clock.now)
        if not events:
            return logical, None, 0
        t_fail = self.clock.now
        before = self.c.snapshot()
        versions = self.c.versions()  # what each shard had applied when it was lost
        self.before = (before, t_fail)  # the state the failure struck, for its evaluation
        lost: set[int] = set()
        failed: list[str] = []
        # Struck workers restart once recovery is done: a replacement pulls what the
        # shards then hold, not a lost shard's wiped rows (lda builds its state from them).
        self._restarting = set()
        self._strike(events, executed, lost, failed)
        self.clock.advance(self.costs.detection)
        self.emit(Detection(iteration=executed, failed=list(failed)))
        # A replacement takes restart_seconds to come up; failures due in that window
        # (phase=recovery, or a time trigger inside it) strike before recovery ends.
        self.clock.advance(self.costs.restart)
        while more := (self.schedule.due(executed, self.clock.now, phase="recovery")
                       + self.schedule.due(executed, self.clock.now)):
            self._strike(more, executed, lost, failed, during_recovery=True)
            self.clock.advance(self.costs.detection + self.costs.restart)
        decision = self.policy.decide(tuple(sorted(lost)), self.checkpointer.has_checkpoint())
        restored_from, undone, copies = None, 0, None
        new_logical = logical
        if decision.action is RecoveryAction.REINIT or (
                decision.action is RecoveryAction.WORKER_COPY and not decision.from_checkpoint):
            for i in decision.shards:
                self.c.reinit(i)
        elif decision.action in (RecoveryAction.ROLLBACK_ALL, RecoveryAction.RESTORE_LOST,
                                 RecoveryAction.WORKER_COPY):
            targets = (list(range(len(self.c.shards)))
                       if decision.action is RecoveryAction.ROLLBACK_ALL else list(decision.shards))
            restored_from = self.checkpointer.restore(
                targets, lambda msg: self.emit(CheckpointCorrupt(message=msg)))
            restored_from = restored_from or 0
            if decision.rewind:
                undone = (logical - restored_from) * len(self.c.workers)
                new_logical = restored_from
        if decision.action is RecoveryAction.WORKER_COPY:
            copies = self._from_copies(decision.shards, versions, restored_from is not None)
        for w in sorted(self._restarting):
            self.c.restart_worker(w)
        norm, norm_lost = perturbation(before, self.c.params(),
                                       self.c.shard_rows_mask(tuple(sorted(lost))))
        rec = Recovery(failed=failed, at_iteration=executed,
                       recovery_seconds=self.clock.now - t_fail,
                       perturbation_norm=norm, perturbation_norm_lost=norm_lost,
                       action=decision.action.value, restored_from=restored_from,
                       worker_copy=copies)
        self.emit(RecoveryEnded(recovery=rec, logical_iteration=new_logical))
        return new_logical, rec, undone

    def _from_copies(self, lost: tuple[int, ...], versions: tuple[int, ...],
                     from_checkpoint: bool) -> dict[str, int | None]:
        """Overwrite the lost shards' rows that live workers hold with their freshest
        copy (a worker lost meanwhile was restarted and holds none); charge the
        transfer to the clock as network bytes."""
        held = [wk.copy for wk in self.c.workers if wk.copy is not None]
        n = len(self.c.workers)
        divide_by = n if self.c.workload.aggregate == "mean" else 1
        rebuilt, lags, replayed = [], [], []
        for i in lost:
            r = rebuild(i, self.c.layout.shards[i], held)
            load_rebuilt(self.c.shards[i], r)
            rebuilt.append(r)
            lags.append(None if r.version is None else versions[i] - r.version)
            if self.replay_rounds and replay(self.c.shards[i], r, held, versions[i], n,
                                             divide_by):
                replayed.append(i)
        out = record(lost, rebuilt, from_checkpoint, lags, replayed, held, n)
        self.clock.advance(self.costs.network(int(out["bytes"] or 0),
                                              requests=int(out["messages"] or 0) // 2))
        return out

    def _strike(self, events: list[FailureEvent], executed: int, lost: set[int],
                failed: list[str], during_recovery: bool = False) -> None:
        for e in events:
            self.failures += 1
            for i in e.ids:
                if e.kind == "shard":
                    lost.add(i)
                    self.c.wipe(i)
                elif e.kind == "worker":
                    self.c.workers[i].copy = None  # its memory is gone now
                    self._restarting.add(i)
                failed.append(f"{e.kind}{i}")
            self.emit(Failure(iteration=executed, kind=e.kind, ids=list(e.ids), spec=e.spec,
                              during_recovery=during_recovery))
