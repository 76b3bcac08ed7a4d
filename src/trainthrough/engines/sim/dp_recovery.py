"""Delivering rank failures to a simulated data-parallel group, and recovering.

The strategy's policy (ft/dp_policies.py) decides; this module acts and charges
the clock: detection (``detection_seconds`` for a crash, the collective
``timeout_seconds`` for a hang or a long pause, nothing more for a straggler: its
deadline was the wait), then either a whole-group restart from the
checkpoint (``restart_seconds`` + read time) or a re-formation of the survivors
(``reform_seconds``), after which replacements join once their delay is over.

Each recovery records a perturbation (:mod:`trainthrough.dp.reference`, measured by
:func:`~trainthrough.ft.perturbation.perturbation`, as on gloo): the distance between
the parameters after recovery and those the failure-free group would hold at that
point. The pre-step replica is read from the failed rank's memory before it is
discarded (a restart needs it: no survivor may be left); the full step of lossy
forward is computed by the survivors on a simulated collective that charges no time.
No decision depends on it.

A notice, a pause and a slow-down are handed to :class:`~.dp_kinds.SimKinds`, which
says whether the rank is lost now (a pause past the collective timeout, a notice run
out, a straggler past the deadline) or what the group pays instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainthrough.dp.batching import Cursor
from trainthrough.dp.reference import failure_free
from trainthrough.dp.repair import complete
from trainthrough.dp.simulated import LockStep
from trainthrough.dp.step import InFlight, StepSpec, group_phase
from trainthrough.engines.result import RunResult
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.dp_checkpoints import SimDPCheckpoints
from trainthrough.engines.sim.dp_group import SimGroup
from trainthrough.engines.sim.dp_kinds import SimKinds
from trainthrough.errors import Preempted
from trainthrough.events import (
    CheckpointCorrupt,
    Detection,
    Drained,
    Event,
    Failure,
    FailureSkipped,
    JobPreempted,
    RankJoined,
    Recovery,
    RecoveryEnded,
    Reform,
)
from trainthrough.faults.schedule import FailureSchedule
from trainthrough.ft.decisions import RecoveryAction, ReplacementDecision
from trainthrough.ft.dp_policies import GroupFailure, GroupRecoveryPolicy, Phase, ReplacementPolicy
from trainthrough.ft.perturbation import perturbation

Tensors = dict[str, torch.Tensor]
# Measuring is not training: the survivors' extra reduction charges no simulated time.
_QUIET = LockStep(on_point=lambda _: None, on_reduce=lambda _b, _n: None)


@dataclass(frozen=True)
class Hit:
    """Live ranks struck at one point, and how long their peers take to find out
    (a crash: ``detection_seconds``; silent, a hang or a long pause: the collective
    timeout; a straggler: 0, the deadline it missed was the wait), fenced if silent."""

    ids: tuple[int, ...]
    detect: float
    silent: tuple[int, ...] = ()  #: hung or paused, alive maybe: fenced (``no-report``)
    late: tuple[int, ...] = ()  #: past the straggler deadline: fenced (``straggler``)

    def __add__(self, other: Hit) -> Hit:
        return Hit(self.ids + other.ids, max(self.detect, other.detect),
                   self.silent + other.silent, self.late + other.late)


class SimDPRecovery:
    """Fires due rank failures; carries out recovery decisions; lets replacements join."""

    def __init__(self, group: SimGroup, schedule: FailureSchedule, policy: GroupRecoveryPolicy,
                 replacement: ReplacementPolicy, ckpt: SimDPCheckpoints, clock: VirtualClock,
                 costs: Costs, result: RunResult, emit: Callable[[Event], None],
                 step: tuple[LockStep, StepSpec], kinds: SimKinds) -> None:
        self.kinds = kinds
        self.g, self.schedule, self.policy, self.replacement = group, schedule, policy, replacement
        self.ckpt, self.clock, self.costs, self.result, self.emit = ckpt, clock, costs, result, emit
        # The engine's lock-step driver (it charges the ring) and the step's spec,
        # for the survivors' lossy-forward completion.
        self.lockstep, self.spec = step
        self.joins: list[ReplacementDecision] = []
        self.failures = self.reforms = self.joined = self.samples_dropped = 0
        self.smallest = group.size

    def strike(self, point: str, executed: int, logical: int = -1) -> Hit | None:
        """Fire the failures due at ``point`` (a phase name, or ``boundary``); ``logical``:
        the steps committed so far (a notice says it).

        Specs naming this phase fire here once their iteration is reached; specs
        without a phase fire at the first point after their trigger (for ``@iter``
        that is the step boundary, for ``@time`` wherever the clock passed it). A rank
        whose notice ran out by now is struck too, as a crash.
        """
        events = [] if point == "boundary" else self.schedule.due(executed, self.clock.now, point)
        events += self.schedule.due(executed, self.clock.now)
        crashed = self.kinds.expired(self.g.live)
        silent: list[int] = []
        for e in events:
            live = [i for i in e.ids if i in self.g.ranks and i not in crashed + silent]
            self.emit((Failure if live else FailureSkipped)(
                iteration=executed, kind="rank", ids=list(e.ids), spec=e.spec, phase=point,
                mode=e.mode, during_recovery=point == "recovery"))
            if live:
                self.failures += 1
            if e.mode == "crash":
                crashed += live
            elif e.mode == "hang":
                silent += live
            else:  # a notice, a pause, a slow-down: lost now only if a long pause
                silent += [s for s in live if self.kinds.deliver(e, s, logical)]
        if silent:  # found at the collective timeout, the crashes with them
            return Hit(tuple(crashed + silent), self.costs.m.timeout_seconds, tuple(silent))
        return Hit(tuple(crashed), self.costs.detection) if crashed else None

    def recover(self, hit: Hit, point: str, fls: dict[int, InFlight], executed: int,
                logical: int) -> tuple[bool, int]:
        """Kill the struck ranks and recover the attempt they interrupted at ``point``.

        ``fls``: every rank's record of the attempt (the victims' too). At ``update``
        the group had committed it (the engine counted it) and the survivors applied it.

        Returns:
            (whether the interrupted step got committed here, the logical iteration after).
        """
        t0 = self.clock.now
        # What the failure-free group holds now: the failed replica holds the last
        # committed step (never touched again), unless the group committed this one.
        pre = ({n: v.clone() for n, v in self.g.params().items()} if point == "update"
               else self.g.ranks[hit.ids[0]].params)
        size_before = len(self.g.ranks)
        failed = list(hit.ids)
        self._kill(hit, executed)
        # Failures in the detection window (phase=recovery, or a time trigger) pile up.
        while more := self.strike("recovery", executed):
            failed += more.ids
            self._kill(more, executed)
        phase: Phase = group_phase(point)  # type: ignore[assignment]
        done = fls[hit.ids[0]].buckets_done  # every rank got as far (lock step)
        d = self.policy.decide(GroupFailure(tuple(failed), len(self.g.ranks), phase, done,
                                            self.ckpt.has_checkpoint()))
        restored, committed = None, False
        if d.action is RecoveryAction.ROLLBACK_ALL:
            restored = self._restart(size_before, logical)
            logical = restored
        else:
            self.clock.advance(self.costs.m.reform_seconds)
            self.reforms += 1
            self.smallest = min(self.smallest, len(self.g.ranks))
            self.emit(Reform(iteration=executed, ranks=self.g.live))
            join = self.replacement.decide(tuple(failed), t0)
            if join is not None:
                self.joins.append(join)
        ready = self.clock.now
        reference = pre  # the interrupted step is outstanding (or discarded)
        if d.complete_step:
            full = self._complete(fls, failed, point)
            reference = full if full is not None else self.g.params()
            committed, logical = True, logical + 1
        norm, _ = perturbation(reference, self.g.params())
        rec = Recovery(failed=[f"rank{i}" for i in failed], at_iteration=executed,
                       recovery_seconds=ready - t0, perturbation_norm=norm,
                       action=d.action.value, restored_from=restored)
        self.result.recoveries.append(rec)
        self.emit(RecoveryEnded(recovery=rec, phase=point.partition(":")[0],
                                logical_iteration=logical, ranks=self.g.live))
        return committed, logical

    def _kill(self, hit: Hit, executed: int) -> None:
        for s in hit.ids:
            self.g.kill(s)
            self.ckpt.rank_failed(s)
        self.kinds.gone(hit.ids)
        self.clock.advance(hit.detect)
        self.kinds.fence(hit.silent, hit.late)  # presumed failed, alive maybe: fenced out
        self.emit(Detection(iteration=executed, failed=[f"rank{i}" for i in hit.ids]))

    def _restart(self, size: int, logical: int) -> int:
        """Every rank relaunches (failed ones replaced) from the checkpoint or the start."""
        self.clock.advance(self.costs.restart)
        r = self.ckpt.restore(lambda msg: self.emit(CheckpointCorrupt(message=msg)))
        restored = r.step if r is not None else 0
        self.g.reset(r.tensors if r is not None else None, r.cursor if r is not None else Cursor())
        self.kinds.joined(self.g.live)  # every slot a fresh process
        self.joins.clear()
        self.result.updates_lost += (logical - restored) * size
        return restored

    def _complete(self, fls: dict[int, InFlight], failed: list[int],
                  point: str) -> Tensors | None:
        """Lossy forward: the survivors finish the step (:func:`~trainthrough.dp.repair.complete`);
        returns the step the whole group would have taken (None: the same one).

        Buckets reduced before the failure keep every rank's share; the survivors
        finish their compute and reduce the rest on the smaller ring.
        """
        fl, spec, g = fls[failed[0]], self.spec, self.g
        batch, done = fl.batch, fl.buckets_done
        if done < len(spec.buckets):
            if point == "forward":  # the survivors had two thirds of their compute left
                self.clock.advance(g.compute_seconds(batch, self.costs.compute) * 2 / 3)
            lost = [s for s in failed if s in batch.share]
            self.result.updates_lost += len(lost)
            self.samples_dropped += sum(len(batch.share[s]) for s in lost) * g.micro
        ref = g.drive(_QUIET, lambda r, c: failure_free(r, fls[r.rank_id], c, spec, done))
        out = g.drive(self.lockstep, lambda r, c: complete(r, fls[r.rank_id], c, spec, done))
        if any(isinstance(x, BaseException) for x in (*ref.values(), *out.values())):
            raise RuntimeError(f"lossy-forward completion failed in sim: {ref} {out}")
        self.result.updates_applied += len(g.live)
        g.cursor = batch.next_cursor
        return ref[g.live[0]]  # type: ignore[no-any-return]

    def drain(self, executed: int, logical: int) -> None:
        """Members with a notice leave at this step boundary, step ``logical`` committed
        with them: nothing is rolled back or redone. The others re-form without them
        (the elastic policy sizes their batch from the next step on) and replacements
        join as after a loss (:class:`ReplacementPolicy`). If nobody would be left, the
        job stops as gloo's does: a just-in-time checkpoint, then :class:`Preempted`.

        Raises:
            Preempted: every member had a notice.
        """
        leaving = self.kinds.leaving(self.g.live)
        if not leaving:
            return
        if len(leaving) == len(self.g.ranks):
            given = min(self.kinds.notices[s][0] - self.kinds.notices[s][1] for s in leaving)
            saved = self.ckpt.save_now(logical)
            self.emit(JobPreempted(logical=logical, saved=saved,
                                   seconds=round(self.clock.now - given, 6)))
            raise Preempted("every rank of the run got its preemption notice")
        for s in leaving:
            self.g.kill(s)
        self.kinds.gone(leaving)
        self.kinds.drained += len(leaving)
        self.clock.advance(self.costs.m.reform_seconds)
        self.smallest = min(self.smallest, len(self.g.ranks))
        self.emit(Drained(slots=leaving, logical=logical, ranks=self.g.live))
        join = self.replacement.decide(tuple(leaving), self.clock.now)
        if join is not None:
            self.joins.append(join)

    def join_due(self) -> None:
        """Replacements whose delay is over copy a live rank and the group grows back."""
        due = [j for j in self.joins if j.at_seconds <= self.clock.now]
        if not due:
            return
        self.joins = [j for j in self.joins if j.at_seconds > self.clock.now]
        slots = [s for j in due for s in j.slots if s not in self.g.ranks]
        nbytes = self.g.join(slots) if slots else 0
        self.kinds.joined(slots)
        self.joined += len(slots)
        self.clock.advance(self.costs.network(nbytes) + self.costs.m.reform_seconds)
        self.emit(RankJoined(slots=slots, ranks=self.g.live, bytes=nbytes))
