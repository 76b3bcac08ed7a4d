"""The discrete-event model of one data-parallel job at scale: no tensors, real policies.

Time is the sim engine's :class:`~trainthrough.engines.sim.clock.VirtualClock`, moved
only by the cost model (lab/scale/costs.py). Failures of the ``n`` accelerators arrive
as one Poisson process of rate ``n / MTTF`` (the superposition of ``n`` exponential
clocks: no object per accelerator, so 100,000 of them cost what 8 do), each striking a
live rank drawn at random, at the point of the step the clock has reached.

Every decision is made by the object the engines use, called as they call it
(ft/dp_policies.py's call order):

- the strategy's :class:`~trainthrough.ft.dp_policies.GroupRecoveryPolicy`
  (``group_recovery_policy``) on each failure, told the phase it struck and whether a
  checkpoint exists; this module carries out its decision (a restart from the last
  checkpoint, a re-formation, a redone or completed step, the lost replicas' local
  steps dropped), as engines/sim/dp_recovery.py does;
- the strategy's checkpoint policy (``Strategy.checkpoint_policy``) after every
  committed step;
- :class:`~trainthrough.ft.dp_policies.ElasticPolicy` before every step (the global
  batch, hence each rank's compute, for the ranks alive);
- :class:`~trainthrough.ft.dp_policies.ReplacementPolicy` after a re-formation (when
  the replacement joins: a re-formation and a state transfer);
- relaxed sync: :class:`~trainthrough.dp.relaxed.SyncSpec` says after which inner steps
  an outer step (of which fragments) is due.

Progress is counted in steps of the full global batch; the job ends when ``steps`` of
them are committed. A failure striking while the clock is inside a recovery, a join
or a save strikes at the next step boundary (recoveries queue, as on ``sim``); one
within the detection window joins the recovery under way. A save cut by a failure is
lost. Simplifications (docs/scale-suite.md): one gradient bucket; the update is
instant (no failure after the commit); streaming DiLoCo drops a lost replica's work
since the last outer step of any fragment.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainthrough.dp.relaxed import SyncSpec
from trainthrough.engines.sim.clock import VirtualClock
from trainthrough.ft.decisions import RecoveryAction, ReplacementDecision
from trainthrough.ft.dp_policies import (
    ElasticPolicy,
    GroupFailure,
    Phase,
    ReplacementPolicy,
    group_recovery_policy,
)
from trainthrough.lab.advise.model import interval
from trainthrough.lab.scale.costs import ScaleCosts
from trainthrough.lab.scale.params import ScaleParams
from trainthrough.lab.scale.variants import Variant

BATCH = 64  #: a rank's nominal batch (only ratios of it matter)
#: a job that has not finished after this many times its failure-free time is stopped
#: (no progress: e.g. every failure restarts it from the start)
GIVE_UP = 50.0


@dataclass
class Outcome:
    """One simulated job: where its time went (seconds) and what it did."""

    variant: str
    n: int
    seed: int
    steps: int
    ideal_seconds: float  #: the same steps without failures or fault-tolerance costs
    seconds: float = 0.0  #: simulated time to train them (or until given up)
    finished: bool = True
    failures: int = 0
    restarts: int = 0
    reforms: int = 0
    joins: int = 0
    checkpoints: int = 0
    interval_steps: int | None = None  #: the checkpoint interval used
    checkpoint_seconds: float = 0.0  #: blocked by saves (those cut short too)
    recovery_seconds: float = 0.0  #: detection, restart or re-formation, reading back
    lost_seconds: float = 0.0  #: work done and then lost (rewound, redone, dropped)
    join_seconds: float = 0.0  #: replacements joining (re-formation + state transfer)
    #: each recovery's downtime, failure to training again (its mean is the downtime
    #: per failure the published figures give)
    downtimes: list[float] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        """Effective training time ratio: failure-free time over the time it took."""
        return self.ideal_seconds / self.seconds if self.seconds > 0 else 1.0

    @property
    def downtime(self) -> float | None:
        return sum(self.downtimes) / len(self.downtimes) if self.downtimes else None


def young_daly_steps(p: ScaleParams, costs: ScaleCosts) -> int:
    """Young/Daly's interval ``sqrt(2 C MTBF)`` in whole steps (advise's helper), for
    the save cost ``C`` at this size and the job's MTBF ``MTTF / n``."""
    return interval(costs.save, 0.0, p.mttf_seconds / costs.n, p.step_seconds, most=p.steps)


class _Job:
    """One run of the model; :func:`simulate` is its public face."""

    def __init__(self, v: Variant, p: ScaleParams, n: int, seed: int,
                 trace: Sequence[float] | None = None) -> None:
        self.v, self.p, self.n = v, p, n
        # A given trace of failure times replaces the Poisson arrivals (a cross-check
        # against an engine's run on the same times).
        self.trace = None if trace is None else iter(sorted(trace))
        # Arrivals and victims from generators of their own, seeded by size and seed
        # alone: every variant meets the same failure times (one trace, as the other
        # suites compare strategies), whatever it draws in between.
        self.arrivals = random.Random(f"scale/arrivals/{n}/{seed}")
        self.victims = random.Random(f"scale/victims/{n}/{seed}")
        self.costs = c = ScaleCosts.of(p, n, v.store, v.warm)
        s = v.strategy
        self.policy = group_recovery_policy(s.recovery)
        self.elastic = ElasticPolicy(p.elastic, n, BATCH)
        self.replacement = ReplacementPolicy(True, c.join)
        every = young_daly_steps(p, c) if v.interval == "young-daly" else p.checkpoint_every
        self.ckpt = s.checkpoint_policy(every)
        self.sync = (SyncSpec("localsgd" if s.sync == "localsgd" else "diloco", p.sync_every,
                              p.sync_fragments if s.sync == "streaming-diloco" else 1)
                     if s.relaxed else None)
        self.compute = p.step_seconds * (1 - p.comm_share)
        self.comm = p.step_seconds * p.comm_share
        per_step = (self.compute + self.comm / p.sync_every if self.sync is not None
                    else p.step_seconds)
        self.out = Outcome(v.name, n, seed, p.steps, p.steps * per_step,
                           interval_steps=every if s.checkpoint != "none" else None)
        self.clock = VirtualClock()
        self.rate = n / p.mttf_seconds
        self._last = 0.0  # the last failure's time: arrivals are a trace, not reset by events
        self.next_fail = self._draw()
        self.down: set[int] = set()  # failed ranks not replaced yet
        self.joins: list[ReplacementDecision] = []
        self.progress = 0.0  # committed steps of the full global batch
        self.logical = 0
        self.saved: tuple[int, float] | None = None  # (logical step, progress) of the last save
        # the last decision's redo_step and complete_step (what the step in flight becomes)
        self._redo = self._complete = False

    # -- events -------------------------------------------------------------------
    def _draw(self) -> float:
        if self.trace is not None:
            return next(self.trace, math.inf)
        self._last = self._last + self.arrivals.expovariate(self.rate)
        return self._last

    def _victim(self) -> int:
        while True:  # a live rank (few are down at once: this ends quickly)
            r = self.victims.randrange(self.n)
            if r not in self.down:
                return r

    def _fail_one(self) -> int:
        """The failure due now takes a live rank down (counted); the next one is drawn."""
        victim = self._victim()
        self.down.add(victim)
        self.out.failures += 1
        self.next_fail = self._draw()
        return victim

    def _strike(self) -> list[int]:
        """The failure due now and those that fall due within its detection."""
        failed = [self._fail_one()]
        self._recovering(self.costs.detect)
        while self.next_fail <= self.clock.now and len(self.down) < self.n:
            failed.append(self._fail_one())
        return failed

    def _recovering(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.out.recovery_seconds += seconds

    def _saving(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.out.checkpoint_seconds += seconds

    def _join_due(self) -> bool:
        """Replacements whose time came join: one re-formation and a state transfer."""
        due = [j for j in self.joins if j.at_seconds <= self.clock.now]
        if not due:
            return False
        self.joins = [j for j in self.joins if j.at_seconds > self.clock.now]
        for j in due:
            self.down.difference_update(j.slots)
        self.out.joins += 1
        self.clock.advance(self.costs.reform + self.costs.transfer)
        self.out.join_seconds += self.costs.reform + self.costs.transfer
        return True

    def _decide(self, failed: list[int], phase: Phase) -> RecoveryAction:
        """Ask the strategy's policy; carry out a restart or a re-formation."""
        t0 = self.clock.now - self.costs.detect
        d = self.policy.decide(GroupFailure(tuple(failed), self.n - len(self.down), phase, 0,
                                            self.saved is not None))
        if d.action is RecoveryAction.ROLLBACK_ALL:
            self._recovering(self.costs.restart
                             + (self.costs.read if d.from_checkpoint else 0.0))
            logical, progress = self.saved if d.from_checkpoint and self.saved else (0, 0.0)
            self._lose((self.progress - progress) * self.p.step_seconds)
            self.logical, self.progress = logical, progress
            self.down.clear()  # every rank relaunched, the failed ones replaced
            self.joins.clear()
            self.out.restarts += 1
        else:
            self._recovering(self.costs.reform)
            self.out.reforms += 1
            join = self.replacement.decide(tuple(failed), t0)
            if join is not None:
                self.joins.append(join)
        self.out.downtimes.append(self.clock.now - t0)
        self._redo = d.redo_step
        self._complete = d.complete_step
        return d.action

    def _lose(self, seconds: float) -> None:
        # Work that is lost costs no clock now (it was charged as it ran): only counted.
        self.out.lost_seconds += seconds

    def _share(self) -> tuple[float, float]:
        """(one step's compute for each live rank, its progress) by the elastic policy."""
        e = self.elastic.decide(self.n - len(self.down))
        return (self.compute * e.global_batch / (e.ranks * BATCH),
                e.global_batch / (self.n * BATCH))

    def _stalled(self) -> bool:
        if self.clock.now <= GIVE_UP * self.out.ideal_seconds:
            return False
        self.out.finished = False
        return True

    # -- synchronous data parallel ---------------------------------------------------
    def run_sync(self) -> Outcome:
        steps = self.p.steps
        while self.progress < steps - 1e-9 and not self._stalled():
            if self.next_fail <= self.clock.now:  # fell due while the clock was busy
                self._decide(self._strike(), "boundary")
                continue
            if self.joins and self._join_due():
                continue
            compute, gain = self._share()
            dt = compute + self.comm
            if self.next_fail < self.clock.now + dt:
                offset = self.next_fail - self.clock.now
                phase: Phase = ("forward" if offset < compute / 3 else
                                "backward" if offset < compute else "allreduce")
                self.clock.advance(offset)
                live = self.n - len(self.down)
                failed = self._strike()
                self._decide(failed, phase)
                if self._complete:  # lossy forward: the survivors finish the step
                    alive = max(0, live - len(failed)) / live
                    self.clock.advance(max(0.0, dt - offset))
                    self._commit(gain * alive)
                    self._lose(dt * (1 - alive))
                else:  # the attempt is redone (or rewound): its time was lost
                    self._lose(offset)
                continue
            self.clock.advance(dt)
            self._commit(gain)
        return self._finish()

    def _commit(self, gain: float) -> None:
        self.progress += gain
        self.logical += 1
        if self.ckpt.decide(self.logical) is None:
            return
        save = self.costs.save
        if self.next_fail < self.clock.now + save:  # cut short: lost, strikes at the boundary
            self._saving(self.next_fail - self.clock.now)
            return
        self._saving(save)
        self.saved = (self.logical, self.progress)
        self.out.checkpoints += 1

    # -- relaxed sync --------------------------------------------------------------------
    def run_relaxed(self) -> Outcome:
        assert self.sync is not None
        steps, sync = self.p.steps, self.sync
        pending = 0.0  # progress of the inner steps since the last outer step
        lost_ranks: list[int] = []  # failed since then: found at the outer collective
        since = 0
        inner = 0
        while self.progress + pending < steps - 1e-9 and not self._stalled():
            known = self.n - len(self.down) + len(lost_ranks)  # the group as it believes
            e = self.elastic.decide(known)
            compute = self.compute * e.global_batch / (e.ranks * BATCH)
            per_rank = e.global_batch / (e.ranks * self.n * BATCH)
            alive = self.n - len(self.down)
            end = self.clock.now + compute
            while self.next_fail < end and alive > 0:  # nobody notices before the outer step
                self.clock.advance(max(0.0, self.next_fail - self.clock.now))
                lost_ranks.append(self._fail_one())
                # its local steps since the last outer step are dropped with it
                pending -= since * per_rank
                self._lose(since * per_rank * self.out.ideal_seconds / steps)
                alive -= 1
            self.clock.advance(end - self.clock.now)
            pending += alive * per_rank
            since += 1
            inner += 1
            frags = sync.due(inner)
            if not frags:
                continue
            comm = self.comm * len(frags) / sync.fragments
            phase: Phase = "inner"
            if self.next_fail < self.clock.now + comm:  # struck in the outer collective
                offset = max(0.0, self.next_fail - self.clock.now)
                self.clock.advance(offset)
                self._lose(offset)
                lost_ranks.append(self._fail_one())
                pending -= since * per_rank
                phase = "outer"
            else:
                self.clock.advance(comm)
            if lost_ranks:
                self._recovering(self.costs.detect)
                action = self._decide(lost_ranks, phase)
                lost_ranks = []
                if action is RecoveryAction.ROLLBACK_ALL:  # nobody left: from the start
                    pending, since = 0.0, 0
                    continue
                if self._redo:
                    self.clock.advance(comm)
            self.progress += max(0.0, pending)
            pending, since = 0.0, 0
            self._join_due()  # replacements join at an outer boundary
        return self._finish()

    def _finish(self) -> Outcome:
        self.out.seconds = self.clock.now
        return self.out


def simulate(v: Variant, p: ScaleParams, n: int, seed: int = 0,
             trace: Sequence[float] | None = None) -> Outcome:
    """Train ``p.steps`` steps of variant ``v`` on ``n`` accelerators; what it took.

    ``trace``: failure times (seconds) to use instead of the Poisson arrivals."""
    if n < 1:
        raise ValueError(f"n must be at least 1 (got {n})")
    job = _Job(v, p, n, seed, trace)
    return job.run_relaxed() if v.relaxed else job.run_sync()


def mean_goodput(outcomes: list[Outcome]) -> float:
    """Goodput over several seeds: total failure-free time over total time."""
    total = sum(o.seconds for o in outcomes)
    return sum(o.ideal_seconds for o in outcomes) / total if total > 0 else math.nan
