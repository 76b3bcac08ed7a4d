"""Delivering rank failures to a simulated data-parallel group, and recovering.

The strategy's policy (ft/dp_policies.py) decides; this module acts and charges
the clock: detection (``detection_seconds`` for a crash, the collective
``timeout_seconds`` for a hang), then either a whole-group restart from the
checkpoint (``restart_seconds`` + read time) or a re-formation of the survivors
(``reform_seconds``), after which replacements join once their delay is over.

Each recovery records a perturbation: the distance between the parameters after
recovery and those the failure-free group would hold at that point (the pre-step
state while the interrupted step is outstanding, the full step once it is done).
It is measured by reading the failed rank's memory before discarding it; no
decision depends on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainthrough.dp.allreduce import Contribution, Reduced, allreduce, ring_seconds
from trainthrough.dp.batching import Cursor
from trainthrough.dp.rank import Rank
from trainthrough.engines.result import Recovery, RunResult
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.dp_checkpoints import DPCheckpointer
from trainthrough.engines.sim.dp_group import SimGroup, StepPlan
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.ft.decisions import RecoveryAction, ReplacementDecision
from trainthrough.ft.dp_policies import GroupFailure, GroupRecoveryPolicy, Phase, ReplacementPolicy

Tensors = dict[str, torch.Tensor]


@dataclass
class InFlight:
    """The step a failure interrupted, as far as it got."""

    phase: Phase
    plan: StepPlan | None = None
    contribs: dict[int, list[Contribution]] = field(default_factory=dict)
    reduced: Reduced | None = None
    buckets_done: int = 0
    compute_left: float = 0.0  # seconds of compute the survivors still had to do
    applied: tuple[int, ...] = ()  # slots that applied the step before the failure
    snapshots: dict[int, Tensors] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    """Live ranks struck at one point, and whether any of them hung rather than crashed."""

    ids: tuple[int, ...]
    hang: bool


class SimDPRecovery:
    """Fires due rank failures; carries out recovery decisions; lets replacements join."""

    def __init__(self, group: SimGroup, schedule: FailureSchedule, policy: GroupRecoveryPolicy,
                 replacement: ReplacementPolicy, ckpt: DPCheckpointer, clock: VirtualClock,
                 costs: Costs, result: RunResult, emit: Callable[[dict[str, Any]], None]) -> None:
        self.g, self.schedule, self.policy, self.replacement = group, schedule, policy, replacement
        self.ckpt, self.clock, self.costs, self.result, self.emit = ckpt, clock, costs, result, emit
        self.joins: list[ReplacementDecision] = []
        self.failures = self.reforms = self.joined = self.samples_dropped = 0
        self.smallest = group.size

    def strike(self, point: str, executed: int) -> Hit | None:
        """Fire the failures due at ``point`` (a phase name, or ``boundary``).

        Specs naming this phase fire here once their iteration is reached; specs
        without a phase fire at the first point after their trigger (for ``@iter``
        that is the step boundary, for ``@time`` wherever the clock passed it).
        """
        events = [] if point == "boundary" else self.schedule.due(executed, self.clock.now, point)
        events += self.schedule.due(executed, self.clock.now)
        ids: list[int] = []
        hang = False
        for e in events:
            live = [i for i in e.ids if i in self.g.ranks and i not in ids]
            self.emit({"type": "failure" if live else "failure-skipped", "iteration": executed,
                       "kind": "rank", "ids": list(e.ids), "spec": e.spec, "phase": point,
                       "mode": e.mode, "during_recovery": point == "recovery"})
            if live:
                self.failures += 1
                ids += live
                hang = hang or e.mode == "hang"
        return Hit(tuple(ids), hang) if ids else None

    def recover(self, hit: Hit, fl: InFlight, executed: int, logical: int) -> tuple[bool, int]:
        """Kill the struck ranks and recover.

        Returns:
            (whether the interrupted step got committed, the logical iteration after).
        """
        t0 = self.clock.now
        pre = self.g.ranks[hit.ids[0]].state()  # failed ranks never applied the step
        size_before = len(self.g.ranks)
        failed = list(hit.ids)
        self._kill(hit, executed)
        # Failures in the detection window (phase=recovery, or a time trigger) pile up.
        while more := self.strike("recovery", executed):
            failed += more.ids
            self._kill(more, executed)
        applied = tuple(s for s in fl.applied if s in self.g.ranks)
        d = self.policy.decide(GroupFailure(tuple(failed), len(self.g.ranks), fl.phase,
                                            fl.buckets_done, len(applied),
                                            self.ckpt.has_checkpoint()))
        restored, committed, reference = None, False, pre
        if d.action is RecoveryAction.ROLLBACK_ALL:
            restored = self._restart(size_before, logical)
            logical = restored
        else:
            self.clock.advance(self.costs.m.reform_seconds)
            self.reforms += 1
            self.smallest = min(self.smallest, len(self.g.ranks))
            self.emit({"type": "reform", "iteration": executed, "ranks": self.g.live})
            join = self.replacement.decide(tuple(failed), t0)
            if join is not None:
                self.joins.append(join)
            if d.undo_applied:
                for s in applied:
                    self.g.ranks[s].load(fl.snapshots[s])
        ready = self.clock.now
        if d.complete_step and fl.plan is not None:
            reference = self._complete(fl, failed, applied, pre)
            committed, logical = True, logical + 1
        ref = {k[len("params/"):]: v for k, v in reference.items() if k.startswith("params/")}
        norm = sum(float(((v - ref[n]).double() ** 2).sum())
                   for n, v in self.g.params().items()) ** 0.5
        rec = Recovery(failed=[f"rank{i}" for i in failed], at_iteration=executed,
                       recovery_seconds=ready - t0, perturbation_norm=norm,
                       action=d.action.value, restored_from=restored)
        self.result.recoveries.append(rec)
        self.emit({"type": "recovery", **rec.__dict__, "phase": fl.phase,
                   "logical_iteration": logical, "ranks": self.g.live})
        return committed, logical

    def _kill(self, hit: Hit, executed: int) -> None:
        for s in hit.ids:
            self.g.kill(s)
            self.ckpt.rank_failed(s)
        self.clock.advance(self.costs.m.timeout_seconds if hit.hang else self.costs.detection)
        self.emit({"type": "detection", "iteration": executed,
                   "failed": [f"rank{i}" for i in hit.ids]})

    def _restart(self, size: int, logical: int) -> int:
        """Every rank relaunches (failed ones replaced) from the checkpoint or the start."""
        self.clock.advance(self.costs.restart)
        loaded = self.ckpt.restore(lambda msg: self.emit({"type": "checkpoint-corrupt",
                                                          "message": msg}))
        tensors, restored, cursor = loaded if loaded is not None else (None, 0, Cursor())
        self.g.reset(tensors, cursor)
        self.joins.clear()
        self.result.updates_lost += (logical - restored) * size
        return restored

    def _complete(self, fl: InFlight, failed: list[int], applied: tuple[int, ...],
                  pre: Tensors) -> Tensors:
        """Lossy forward: finish the step with the survivors' shares; return the reference.

        Buckets reduced before the failure keep every rank's share; the rest are
        averaged over the micro-batches of the survivors, which finish their compute
        and reduce them on the smaller ring.
        """
        assert fl.plan is not None
        live = self.g.live
        full = [c for cs in fl.contribs.values() for c in cs]
        red = fl.reduced
        if red is None or not red.complete:
            self.clock.advance(fl.compute_left)
            done = set(red.completed) if red is not None else set()
            mine = [c for s in live for c in fl.contribs[s]]
            into = Reduced(red.flat.clone(), list(red.counts)) if red is not None else None
            red = allreduce(mine, self.g.buckets, mean=self.g.w.aggregate == "mean", into=into)
            for b in self.g.buckets:
                if b.index not in done:
                    self.clock.advance(ring_seconds(4 * b.numel, len(live), self.costs.m.network_bandwidth,
                                                    self.costs.m.network_latency))
            lost = [s for s in failed if s in fl.contribs]
            self.result.updates_lost += len(lost)
            self.samples_dropped += sum(len(fl.contribs[s]) for s in lost) * self.g.micro
        for s in live:
            if s not in applied:
                self.g.ranks[s].apply(red.flat, fl.plan.lr_scale)
        self.result.updates_applied += len(live)
        self.g.cursor = fl.plan.next_cursor
        # The reference: the step the whole group would have taken.
        shadow = Rank.joining(-1, self.g.first())
        shadow.load(pre)
        shadow.apply(allreduce(full, self.g.buckets, mean=self.g.w.aggregate == "mean").flat,
                     fl.plan.lr_scale)
        return shadow.state()

    def join_due(self) -> None:
        """Replacements whose delay is over copy a live rank and the group grows back."""
        due = [j for j in self.joins if j.at_seconds <= self.clock.now]
        if not due:
            return
        self.joins = [j for j in self.joins if j.at_seconds > self.clock.now]
        slots = [s for j in due for s in j.slots if s not in self.g.ranks]
        nbytes = sum(self.g.join(s) for s in slots)
        self.joined += len(slots)
        self.clock.advance(self.costs.network(nbytes) + self.costs.m.reform_seconds)
        self.emit({"type": "rank-joined", "slots": slots, "ranks": self.g.live,
                   "bytes": nbytes})
