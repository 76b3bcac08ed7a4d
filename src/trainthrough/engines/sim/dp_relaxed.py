"""Hosting relaxed synchronization (LocalSGD, DiLoCo, streaming DiLoCo) in ``sim``.

The routines are the shared ones (:mod:`trainthrough.dp.relaxed`); this host runs them
in lock step, charges the virtual clock and delivers failures:

- an inner step charges the busiest replica's compute, at ``inner``; nothing else (no
  collective). A failure at ``boundary`` or ``inner`` takes the replica down and the
  survivors go on unaware: its local steps since its last outer step and its share
  of this step's batch are lost;
- an outer step charges one ring allreduce of its fragment. The survivors find a
  loss at its collective: they wait for the rest of the detection (a crash) or the
  collective timeout (a hang) counted from the failure, re-form, and run the outer
  step without the lost replicas (struck at ``outer``: run again, nobody applied it);
- replacements join only at an outer boundary, right after an outer step, with the
  global parameters and the outer momentum (part of the replica's state);
- a replica with a preemption notice leaves there too, once an outer step has
  synchronized every fragment (every replica then holds the same model): it takes no
  local step along, nothing is dropped or redone (``drained``).

Each recovery's perturbation is the lost replicas' share of the outer average:
``||local - global|| / members``, measured when they are lost. After every outer step
the host checks that the members agree bit for bit on the fragment (``replicas_identical``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trainthrough.dp.batching import Cursor, MicroBatch
from trainthrough.dp.collective import PeerLost
from trainthrough.dp.rank import Replica
from trainthrough.dp.relaxed import RelaxedReplica, SyncSpec, inner_step, outer_step
from trainthrough.dp.simulated import LockStep, SimInjector, Strike
from trainthrough.dp.step import InFlight, StepSpec
from trainthrough.engines.result import RunResult
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.dp_group import SimGroup
from trainthrough.engines.sim.dp_recovery import Hit, SimDPRecovery
from trainthrough.events import Detection, Event, Recovery, RecoveryEnded, Reform
from trainthrough.ft.decisions import RecoveryAction
from trainthrough.ft.dp_policies import GroupFailure, GroupRecoveryPolicy, Phase
from trainthrough.workloads.base import Params


@dataclass
class _Lost:
    """Replicas lost since the last outer step, not yet found by the survivors."""

    ids: list[int] = field(default_factory=list)
    found_at: float = 0.0  # when the survivors' collective would report it
    phase: str = "inner"
    norm: float = 0.0  # the lost share of the outer average (a perturbation)
    at_iteration: int = 0


class SimRelaxed:
    """Runs relaxed-sync steps for :class:`~trainthrough.engines.sim.dp_engine.SimDPEngine`."""

    def __init__(self, group: SimGroup, sync: SyncSpec, spec: StepSpec,
                 recovery: SimDPRecovery, policy: GroupRecoveryPolicy, clock: VirtualClock,
                 costs: Costs, result: RunResult, emit: Callable[[Event], None],
                 on_reduce: Callable[..., None], disruption: Callable[[int], None]) -> None:
        self.g, self.sync, self.spec, self.rec, self.policy = group, sync, spec, recovery, policy
        self.clock, self.costs, self.result, self.emit = clock, costs, result, emit
        self.disruption = disruption
        self.lockstep = LockStep(self._point, on_reduce)
        self.injector = SimInjector()
        self.executed = self._logical = 0
        self._compute = 0.0
        self._hits: list[tuple[Hit, str]] = []
        self.lost = _Lost()
        self.outer_steps = self.outer_retries = 0
        self.identical = True
        self.local_steps_lost: list[int] = []
        self.outer_bytes = 0
        # Samples each live replica trained on since its last outer step: committed to
        # the model once that step is over, lost with the replica before it.
        self.pending: dict[int, int] = {}
        self.committed = 0

    @staticmethod
    def wrap(sync: SyncSpec) -> Callable[[Replica], Replica]:
        return lambda r: RelaxedReplica(r, sync)

    def params(self) -> Params:
        """The parameters of the last outer step (every member agrees on them)."""
        first = self.g.first()
        assert isinstance(first, RelaxedReplica)
        return first.synced_params()

    # -- one step -------------------------------------------------------------------
    def attempt(self, executed: int, logical: int) -> int:
        """One inner step of every live replica, then the outer steps due; the logical
        iteration after it (the step counts for the survivors whatever struck)."""
        g = self.g
        self.executed, self._logical = executed, logical
        batch = g.plan()
        # The slowest replica sets an inner step's pace (a slow one is waited for at
        # the outer step: the same total).
        self._compute = max(self.rec.kinds.arrivals(
            batch, g.micro_seconds(self.costs.compute)).values())
        fls = {s: InFlight.begin(batch, logical, g.ranks[s].new_grads(separate=True))
               for s in g.live}
        self._hits = []
        g.drive(self.lockstep, lambda r, c: inner_step(r, fls[r.rank_id], self.injector,
                                                       self.spec, executed))
        for hit, point in self._hits:
            self._lose(hit, point, batch.share)
        applied = len(g.live)
        self.result.updates_applied += applied
        for s in g.live:
            self.pending[s] = self.pending.get(s, 0) + len(batch.share.get(s, ())) * g.micro
        g.cursor = batch.next_cursor
        logical += 1
        if not g.ranks:  # nobody left to carry the model: a restart, as the policy says
            return self._restart()
        due = self.sync.due(logical)
        for f in due:
            self._outer(f)
            if not g.ranks:  # the last ones were lost while it re-formed
                return self._restart()
        if due:
            if self.sync.fragments - 1 in due:  # every fragment in sync: drains leave
                self.rec.drain(self.executed, logical)
            self.rec.join_due()  # replacements join at an outer boundary only
        return logical

    def _lose(self, hit: Hit, point: str, share: dict[int, list[MicroBatch]]) -> None:
        """Take the struck replicas down; the survivors will find out at the next collective."""
        self.disruption(self.executed)
        n = len(self.g.ranks)
        lost = self.lost
        if not lost.ids:
            lost.phase, lost.at_iteration, lost.norm = point, self.executed, 0.0
        lost.found_at = max(lost.found_at, self.clock.now + hit.detect)
        self.rec.kinds.gone(hit.ids)
        self.rec.kinds.fence(hit.silent, hit.late)
        for s in hit.ids:
            lost.norm = float(torch.hypot(torch.tensor(lost.norm),
                                          torch.tensor(self._drop(s, share, n))))
            lost.ids.append(s)

    def _drop(self, slot: int, share: dict[int, list[MicroBatch]], members: int) -> float:
        """Replica ``slot`` is gone with its local steps and its share of this step;
        returns its share of the outer average, ``||local - global|| / members``."""
        r = self.g.ranks[slot]
        assert isinstance(r, RelaxedReplica)
        norm = float(torch.linalg.vector_norm(r.flat.flatten(r.params) - r.global_)) / members
        self.local_steps_lost.append(r.since_sync)
        self.result.updates_lost += r.since_sync
        self.rec.samples_dropped += len(share.get(slot, ())) * self.g.micro
        self.pending.pop(slot, None)
        self.g.kill(slot)
        return norm

    def _outer(self, fragment: int) -> None:
        """Run fragment ``fragment``'s outer step until it completes on the survivors."""
        while True:
            if self.lost.ids:
                self._reform()
                if not self.g.ranks:
                    return
            self._hits = []
            out = self.g.drive(self.lockstep, lambda r, c: outer_step(
                r, c, self.injector, fragment, self.executed))
            for hit, point in self._hits:
                self._lose(hit, point, {})
            if not any(isinstance(x, PeerLost) for x in out.values()):
                break
            self.outer_retries += 1
        self.outer_steps += 1
        self._check_identical(fragment)
        if fragment == self.sync.fragments - 1:  # every fragment synchronized once more
            self.committed += sum(self.pending.values())
            self.pending = {s: 0 for s in self.g.live}

    def _reform(self) -> None:
        """The survivors found the loss at the outer collective: wait out its detection,
        re-form without the lost replicas (one recovery record for all of them)."""
        lost, self.lost = self.lost, _Lost()
        t0 = self.clock.now
        self.clock.advance(max(0.0, lost.found_at - t0))
        failed = list(lost.ids)
        self.emit(Detection(iteration=self.executed, failed=[f"rank{i}" for i in failed]))
        while more := self.rec.strike("recovery", self.executed):  # during the detection
            n = len(self.g.ranks)
            for s in more.ids:
                lost.norm = float(torch.hypot(torch.tensor(lost.norm),
                                              torch.tensor(self._drop(s, {}, n))))
            failed += more.ids
            self.rec.kinds.gone(more.ids)
            self.rec.kinds.fence(more.silent, more.late)
            self.clock.advance(more.detect)
        phase: Phase = "outer" if lost.phase == "outer" else "inner"
        d = self.policy.decide(GroupFailure(tuple(failed), len(self.g.ranks), phase))
        if d.action is RecoveryAction.ROLLBACK_ALL:
            return  # attempt() restarts an empty group
        self.clock.advance(self.costs.m.reform_seconds)
        self.rec.reforms += 1
        self.rec.smallest = min(self.rec.smallest, len(self.g.ranks))
        self.emit(Reform(iteration=self.executed, ranks=self.g.live))
        join = self.rec.replacement.decide(tuple(failed), t0)
        if join is not None:
            self.rec.joins.append(join)
        rec = Recovery(failed=[f"rank{i}" for i in failed], at_iteration=lost.at_iteration,
                       recovery_seconds=self.clock.now - t0, perturbation_norm=lost.norm,
                       action=d.action.value, restored_from=None)
        self.result.recoveries.append(rec)
        self.emit(RecoveryEnded(recovery=rec, phase=lost.phase, logical_iteration=None,
                                ranks=self.g.live))

    def _restart(self) -> int:
        """Every replica was lost: all slots start again from the initial parameters."""
        self.clock.advance(self.costs.restart)
        self.g.reset(None, Cursor())
        self.rec.kinds.joined(self.g.live)
        self.lost = _Lost()
        self.committed, self.pending = 0, {}
        self.rec.joins.clear()
        return 0

    def samples_committed(self) -> int:
        """Samples in the model: synchronized, or held by a live replica (the next outer
        step takes them in)."""
        return self.committed + sum(self.pending.values())

    def _check_identical(self, fragment: int) -> None:
        reps = [r for r in self.g.ranks.values() if isinstance(r, RelaxedReplica)]
        if not reps:
            return
        frag = reps[0].fragments[fragment]
        s = slice(frag.start, frag.stop)
        first = reps[0].flat.flatten(reps[0].params)[s]
        self.outer_bytes += 4 * frag.numel * len(reps)
        for r in reps:
            if not (torch.equal(r.flat.flatten(r.params)[s], first)
                    and torch.equal(r.global_[s], reps[0].global_[s])
                    and torch.equal(r.momentum[s], reps[0].momentum[s])):
                self.identical = False

    # -- what the simulated group reports ----------------------------------------
    def _point(self, name: str) -> Strike | None:
        if name == "inner":
            self.clock.advance(self._compute)
        hit = self.rec.strike(name, self.executed, self._logical)
        if hit is None:
            return None
        self._hits.append((hit, name))
        # No collective in an inner step: the survivors go on and find out at the outer
        # step; at ``outer`` the collective breaks for every member at once.
        resume = frozenset(s for s in self.g.live if s not in hit.ids) \
            if name != "outer" else frozenset()
        return Strike(hit.ids, resume)
