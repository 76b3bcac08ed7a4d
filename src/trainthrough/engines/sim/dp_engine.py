"""The ``sim`` engine for data-parallel training: N ranks in one process, a virtual clock.

Every live rank runs the shared step (:func:`trainthrough.dp.step.train_step`) as a
coroutine on a simulated collective, in lock step; this host only charges the clock
at the step's points and strikes the failures due there (``phase=`` of a spec):

- ``boundary``: between steps (specs without a phase; ``@time`` specs strike at
  whichever point the clock passes their time);
- ``forward``: a third into the compute (the busiest rank sets it); ``backward``:
  after it, before the allreduce, once the slowest rank came (a ``mode=slow`` rank
  computes F times as long and the group waits; with ``straggler_deadline`` it waits
  at most that long, and who did not come is dropped there: :mod:`.dp_kinds`);
- ``allreduce:k``: after ``k`` buckets were reduced with every rank's share (each
  bucket charged as a ring allreduce);
- ``update``: ranks apply in rank order and the lowest failed rank dies as it
  applies, so the survivors below it hold the new step and those above the old one;
- ``recovery``: during the detection of an earlier failure.

The failure detector is perfect: survivors learn of a failure at the point it
strikes, after ``detection_seconds`` (a silent rank: the collective timeout). A rank
with a preemption notice leaves after the step it is in commits (``drained``). Recovery is delegated to
:class:`SimDPRecovery`. Same seed, same bits: no decision reads the wall clock, and
the gradient is reduced in micro-batch order.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from trainthrough.dp.allreduce import Bucket, ring_seconds
from trainthrough.dp.batching import StepBatch
from trainthrough.dp.relaxed import SyncSpec
from trainthrough.dp.simulated import LockStep, SimInjector, Strike
from trainthrough.dp.step import InFlight, StepSpec, check_points, train_step
from trainthrough.engines.base import RunContext
from trainthrough.engines.result import RunResult
from trainthrough.engines.sim import CAPABILITIES
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.dp_checkpoints import SimDPCheckpoints
from trainthrough.engines.sim.dp_group import SimGroup
from trainthrough.engines.sim.dp_kinds import SimKinds
from trainthrough.engines.sim.dp_recovery import Hit, SimDPRecovery
from trainthrough.engines.sim.dp_relaxed import SimRelaxed
from trainthrough.events import CheckpointCorrupt, Event
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ft.dp_policies import ElasticPolicy, ReplacementPolicy, group_recovery_policy
from trainthrough.workloads.base import Params


class SimDPEngine:
    """Runs one data-parallel configuration to its target (or its iteration budget)."""

    def __init__(self, ctx: RunContext) -> None:
        # One intra-op thread: the tensors are small and torch's pool is slow here.
        torch.set_num_threads(1)
        self.ctx = ctx
        cfg, workload, checkpoint_url = ctx.cfg, ctx.workload, ctx.checkpoint_url
        self.cfg, self.w, self.cb = cfg, workload, ctx.callback
        self.strategy = ctx.strategy
        self.strategy.require("dp")
        self.policy = group_recovery_policy(self.strategy.recovery)
        spec = workload.default_optimizer
        if cfg.lr is not None:
            spec = replace(spec, lr=cfg.lr)
        x0 = workload.init_params(torch.Generator().manual_seed(cfg.seed))
        elastic = ElasticPolicy(cfg.elastic, cfg.ranks, workload.batch_size)
        sync = SyncSpec.of(cfg, self.strategy.sync)
        self.g = SimGroup(workload, spec, x0, cfg.ranks, cfg.seed, cfg.allreduce_buckets, elastic,
                          cfg.micro_batches, SimRelaxed.wrap(sync) if sync else None)
        self.schedule = schedule = ctx.schedule({"rank": cfg.ranks})
        check_points(ctx.specs, len(self.g.buckets), CAPABILITIES["dp"].phases, "sim")
        self.clock = VirtualClock()
        self.costs = Costs(cfg.cost, workload.step_seconds)
        store = (CheckpointStore(checkpoint_url, keep_last=cfg.checkpoint_keep)
                 if self.strategy.checkpoint != "none" else None)
        every = cfg.checkpoint_every or workload.default_checkpoint_every
        self.ckpt = SimDPCheckpoints(self.g, store, self.strategy.checkpoint_policy(every),
                                     self.clock, self.costs, self._emit)
        self.max_iter = ctx.limits.max_iterations
        self.result = ctx.result
        self.spec = StepSpec(self.g.buckets, workload.aggregate == "mean")
        self.lockstep = LockStep(self._point, self._reduced)
        self.injector = SimInjector()
        self.recovery = SimDPRecovery(
            self.g, schedule, self.policy,
            ReplacementPolicy(cfg.replace, cfg.cost.replace_seconds), self.ckpt, self.clock,
            self.costs, self.result, self._emit, (self.lockstep, self.spec),
            SimKinds(cfg.ranks, self.clock, self.costs, self._emit, cfg.straggler_deadline))
        self.relaxed = None if sync is None else SimRelaxed(
            self.g, sync, self.spec, self.recovery, self.policy, self.clock, self.costs,
            self.result, self._emit, self._reduced, self.ctx.disruption)
        self._params = self.relaxed.params if self.relaxed else self.g.params
        self.executed = self.logical = 0
        self.allreduce_bytes = 0  # sent by all ranks together (ring: 2 (n-1) messages)
        self.samples = 0  # samples of committed steps (every-step sync; less lossy drops)
        # The attempt under way: its batch, and the failure that struck it (if any).
        self._batch: StepBatch | None = None
        self._hit: tuple[Hit, str] | None = None
        self._wall0 = time.perf_counter()

    # -- hooks ------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        self.ctx.emit(event, sim_seconds=self.clock.now)

    def params(self) -> Params:
        """The parameters of the lowest live rank (every live replica is identical; with
        a relaxed sync, those of the last outer step)."""
        return self._params()

    def _evaluate(self) -> bool:
        return self.ctx.evaluate(self._params(), self.executed, sim_seconds=self.clock.now,
                                 logical_iteration=self.logical, ranks=len(self.g.ranks))

    # -- the loop ---------------------------------------------------------------
    def run(self) -> RunResult:
        self.cb.before_run(self.cfg.to_dict())
        if self.ctx.resume:
            self._resume()
        done = self._evaluate()
        while not done and self.executed < self.max_iter:
            self.ckpt.persist.flush_due()
            if self.relaxed is not None:  # joins at outer boundaries, inside the step
                self.logical = self.relaxed.attempt(self.executed, self.logical)
                committed: bool | None = True
            else:
                self.recovery.join_due()
                before = self.logical
                committed = self._attempt()
                if self._batch is not None:  # a restart rewinds: those samples are lost
                    self.samples += (self.logical - before) * self._batch.micro_count * self.g.micro
            if committed is None:  # struck between steps: recovered, look again
                continue
            # An interrupted attempt counts as executed: it cost a step of work.
            self.executed += 1
            if committed:
                self.ckpt.after_step(self.logical)
            self.cb.after_step(self.executed, self.clock.now)
            done = self.ctx.observe(self.executed, self._params, sim_seconds=self.clock.now,
                                    logical_iteration=self.logical, ranks=len(self.g.ranks))
        if not done and not self.ctx.evaluated(self.executed):
            self._evaluate()
        return self._finish()

    def _resume(self) -> None:
        """Start from the run's newest checkpoint, as a checkpoint-restart does: every
        rank relaunched from the save, at its data cursor."""
        r = self.ckpt.restore(lambda msg: self._emit(CheckpointCorrupt(message=msg)))
        if r is not None:
            self.g.reset(r.tensors, r.cursor)
        self.executed = self.logical = self.ctx.resumed(
            r.step if r is not None else None, self.schedule, self.ckpt.checkpointer,
            sim_seconds=self.clock.now)

    def _attempt(self) -> bool | None:
        """One step on the live group: whether to save after it (it was committed and
        nothing struck; a step struck after its commit is saved here, before the
        recovery), None if a failure struck before it began (it does not count)."""
        g = self.g
        batch = self._batch = g.plan()
        self._hit = None
        fls = {s: InFlight.begin(batch, self.logical, g.ranks[s].new_grads(separate=True))
               for s in g.live}
        g.drive(self.lockstep, lambda r, c: train_step(r, fls[r.rank_id], c, self.injector,
                                                       self.spec, self.executed))
        after_commit = self._hit is not None and self._hit[1] == "update"
        if self._hit is None or after_commit:  # the vote completed: committed
            g.cursor = batch.next_cursor
            self.logical += 1
            self.result.updates_applied += len(g.live) - (len(self._hit[0].ids)
                                                          if self._hit else 0)
        if self._hit is None:
            self.recovery.drain(self.executed, self.logical)  # notices: leave at the boundary
            return True
        if after_commit:  # saved as any commit is, before the recovery may rewind it
            self.ckpt.after_step(self.logical)
        hit, point = self._hit
        # The last committed state is the one the failure struck (evaluated if kept).
        self.ctx.disruption(self.executed)
        committed, self.logical = self.recovery.recover(hit, point, fls, self.executed,
                                                        self.logical)
        if after_commit:
            return False  # it counts; there is nothing more to save
        return None if point == "boundary" else committed

    # -- what the simulated group reports ----------------------------------------
    def _point(self, name: str) -> Strike | None:
        """Every live rank reached point ``name``: charge what led here, strike what is due."""
        assert self._batch is not None
        compute = self.g.compute_seconds(self._batch, self.costs.compute)
        late: tuple[int, ...] = ()
        if name == "forward":
            self.clock.advance(compute / 3)
        elif name == "backward":  # the first collective starts once the last rank came
            kinds = self.recovery.kinds
            start, late = kinds.first_collective(kinds.arrivals(
                self._batch, self.g.micro_seconds(self.costs.compute)))
            if late:  # it broke at the deadline, maybe before the busiest share's end
                self.clock.advance(max(0.0, start - compute / 3))
            else:
                self.clock.advance(compute * 2 / 3 + max(0.0, start - compute))
        hit = self.recovery.strike(name, self.executed, self.logical)
        if late:  # the deadline was the wait: found at once
            hit = Hit(late, 0.0, late=late) + hit if hit is not None else Hit(late, 0.0, late=late)
        if hit is None:
            return None
        self._hit = (hit, name)
        # After the commit (update) the survivors apply the step and find the loss at
        # their next collective; anywhere else they learn of it at once.
        resume = frozenset(s for s in self.g.live if s not in hit.ids) if name == "update" \
            else frozenset()
        return Strike(hit.ids, resume)

    def _reduced(self, bucket: Bucket, ranks: int) -> None:
        m = self.costs.m
        self.allreduce_bytes += 2 * (ranks - 1) * 4 * bucket.numel
        self.clock.advance(ring_seconds(4 * bucket.numel, ranks, m.network_bandwidth,
                                        m.network_latency))

    def _finish(self) -> RunResult:
        r, rec = self.result, self.recovery
        r.iterations = self.executed
        r.failures = rec.failures
        r.checkpoints = self.ckpt.checkpointer.count
        r.checkpoints_failed = self.ckpt.checkpointer.failed
        r.checkpoint_bytes = self.ckpt.checkpointer.bytes
        r.checkpoint_blocked_seconds = self.ckpt.persist.blocked
        r.sim_seconds = self.clock.now
        r.wall_seconds = time.perf_counter() - self._wall0
        r.extras.update(paradigm="dp", ranks=self.cfg.ranks, ranks_final=len(self.g.ranks),
                        ranks_min=rec.smallest, reforms=rec.reforms, ranks_joined=rec.joined,
                        ranks_drained=rec.kinds.drained, writes_refused=rec.kinds.refused,
                        samples_dropped=rec.samples_dropped, logical_iterations=self.logical,
                        allreduce_bytes=self.allreduce_bytes,
                        samples_committed=self.samples - rec.samples_dropped)
        if self.relaxed is not None:
            x = self.relaxed
            r.extras.update(sync=self.strategy.sync, sync_every=self.cfg.sync_every,
                            outer_steps=x.outer_steps, outer_retries=x.outer_retries,
                            replicas_identical=x.identical,
                            local_steps_lost=x.local_steps_lost,
                            local_steps_lost_total=sum(x.local_steps_lost),
                            outer_bytes=x.outer_bytes, samples_committed=x.samples_committed())
        return r

