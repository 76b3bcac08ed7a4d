"""The ``sim`` engine for data-parallel training: N ranks in one process, a virtual clock.

A step: every live rank computes the gradients of its micro-batches (the busiest
rank sets the time: forward a third of it, backward the rest), the gradient is
averaged by a ring allreduce bucket by bucket, and the ranks apply it in rank
order. Failures strike at the points in between (``phase=`` of a failure spec):

- ``boundary``: between steps (specs without a phase; ``@time`` specs strike at
  whichever point the clock passes their time);
- ``forward``: a third into the compute; ``backward``: after it, before the allreduce;
- ``allreduce:k``: after ``k`` buckets were reduced with every rank's share;
- ``update``: ranks apply in rank order and the lowest failed rank dies as it
  applies, so the survivors below it hold the new step and those above the old one;
- ``recovery``: during the detection of an earlier failure.

Recovery is delegated to :class:`SimDPRecovery`. Same seed, same bits: no decision
reads the wall clock, and the gradient is reduced in micro-batch order.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from trainthrough.dp.allreduce import Reduced, allreduce, ring_seconds
from trainthrough.engines.base import RunContext
from trainthrough.engines.result import RunResult
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.dp_checkpoints import DPCheckpointer
from trainthrough.engines.sim.dp_group import SimGroup
from trainthrough.engines.sim.dp_recovery import Hit, InFlight, SimDPRecovery
from trainthrough.errors import UserError
from trainthrough.faults.spec import FailureSpec
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ft.dp_policies import ElasticPolicy, ReplacementPolicy, group_recovery_policy
from trainthrough.workloads.base import Params


def _check_phases(specs: list[FailureSpec], buckets: int) -> None:
    for s in specs:
        if s.phase == "persist":
            raise UserError(f"failure spec {s.text!r}: phase persist is parameter-server only; "
                            "use forward, backward, allreduce:K, update or recovery")
        if s.phase and s.phase.startswith("allreduce:") and int(s.phase[10:]) >= buckets:
            raise UserError(f"failure spec {s.text!r}: the allreduce has {buckets} buckets, "
                            f"so K in allreduce:K goes from 0 to {buckets - 1}")


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
        self.g = SimGroup(workload, spec, x0, cfg.ranks, cfg.seed, cfg.allreduce_buckets, elastic)
        schedule = ctx.schedule({"rank": cfg.ranks})
        _check_phases(ctx.specs, len(self.g.buckets))
        self.clock = VirtualClock()
        self.costs = Costs(cfg.cost, workload.step_seconds)
        store = (CheckpointStore(checkpoint_url, keep_last=cfg.checkpoint_keep)
                 if self.strategy.checkpoint != "none" else None)
        every = cfg.checkpoint_every or workload.default_checkpoint_every
        self.ckpt = DPCheckpointer(self.g, store, self.strategy.checkpoint_policy(every),
                                   self.clock, self.costs, self._emit)
        self.max_iter, self.eval_every = ctx.limits.max_iterations, ctx.limits.eval_every
        self.result = ctx.result
        self.recovery = SimDPRecovery(
            self.g, schedule, self.policy,
            ReplacementPolicy(cfg.replace, cfg.cost.replace_seconds), self.ckpt, self.clock,
            self.costs, self.result, self._emit)
        self.executed = self.logical = 0
        self._wall0 = time.perf_counter()

    # -- hooks ------------------------------------------------------------------
    def _emit(self, event: dict[str, Any]) -> None:
        self.ctx.emit(event, sim_seconds=self.clock.now)

    def params(self) -> Params:
        """The parameters of the lowest live rank (every live replica is identical)."""
        return self.g.params()

    def _evaluate(self) -> bool:
        return self.ctx.evaluate(self.g.params(), self.executed, sim_seconds=self.clock.now,
                                 logical_iteration=self.logical, ranks=len(self.g.ranks))

    # -- the loop ---------------------------------------------------------------
    def run(self) -> RunResult:
        self.cb.before_run(self.cfg.to_dict())
        done = self._evaluate()
        while not done and self.executed < self.max_iter:
            self.ckpt.flush_due()
            self.recovery.join_due()
            hit = self.recovery.strike("boundary", self.executed)
            if hit is not None:  # nothing in flight: recover, then look again
                _, self.logical = self.recovery.recover(hit, InFlight("boundary"),
                                                        self.executed, self.logical)
                continue
            # An interrupted attempt counts as executed: it cost a step of work.
            committed = self._attempt()
            self.executed += 1
            if committed:
                self.ckpt.after_step(self.logical)
            self.cb.after_step(self.executed, self.clock.now)
            if self.executed % self.eval_every == 0:
                done = self._evaluate()
        if self.executed % self.eval_every and not done:
            self._evaluate()
        return self._finish()

    def _interrupted(self, hit: Hit, fl: InFlight) -> bool:
        committed, self.logical = self.recovery.recover(hit, fl, self.executed, self.logical)
        return committed

    def _attempt(self) -> bool:
        """One step on the live group; returns whether it was committed."""
        g, m = self.g, self.costs.m
        plan = g.plan()
        contribs = g.compute(plan, self.logical)
        compute = g.micro_seconds(self.costs.compute) * plan.most_micro
        self.clock.advance(compute / 3)
        if hit := self.recovery.strike("forward", self.executed):
            return self._interrupted(hit, InFlight("forward", plan, contribs,
                                                   compute_left=compute * 2 / 3))
        self.clock.advance(compute * 2 / 3)
        if hit := self.recovery.strike("backward", self.executed):
            return self._interrupted(hit, InFlight("backward", plan, contribs))
        every = [c for cs in contribs.values() for c in cs]
        mean = self.w.aggregate == "mean"
        red: Reduced | None = None
        for b in g.buckets:
            if hit := self.recovery.strike(f"allreduce:{b.index}", self.executed):
                return self._interrupted(hit, InFlight("allreduce", plan, contribs, red, b.index))
            red = allreduce(every, g.buckets, mean=mean, stop_after=b.index + 1, into=red)
            self.clock.advance(ring_seconds(4 * b.numel, len(plan.share), m.network_bandwidth,
                                            m.network_latency))
        assert red is not None
        live = g.live
        snaps = {}
        if self.policy.needs_step_snapshot:  # to undo an update a failure cuts short
            snaps = {s: g.ranks[s].state() for s in live}
            self.clock.advance(g.first().state_bytes / m.memory_bandwidth)
        if hit := self.recovery.strike("update", self.executed):
            cut = min(live.index(s) for s in hit.ids)
            for s in live[:cut]:
                g.ranks[s].apply(red.flat, plan.lr_scale)
            return self._interrupted(hit, InFlight("update", plan, contribs, red, len(g.buckets),
                                                   applied=tuple(live[:cut]), snapshots=snaps))
        for s in live:
            g.ranks[s].apply(red.flat, plan.lr_scale)
        g.cursor = plan.next_cursor
        self.logical += 1
        self.result.updates_applied += len(live)
        return True

    def _finish(self) -> RunResult:
        r, rec = self.result, self.recovery
        r.iterations = self.executed
        r.failures = rec.failures
        r.checkpoints = self.ckpt.count
        r.checkpoint_bytes = self.ckpt.bytes
        r.checkpoint_blocked_seconds = self.ckpt.blocked
        r.sim_seconds = self.clock.now
        r.wall_seconds = time.perf_counter() - self._wall0
        r.extras.update(paradigm="dp", ranks=self.cfg.ranks, ranks_final=len(self.g.ranks),
                        ranks_min=rec.smallest, reforms=rec.reforms, ranks_joined=rec.joined,
                        samples_dropped=rec.samples_dropped, logical_iterations=self.logical)
        return r
