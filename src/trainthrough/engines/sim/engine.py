"""The ``sim`` engine: a deterministic, in-process parameter server on a virtual clock.

Bulk-synchronous (``bsp``): every iteration all live workers compute on the same
parameters, the updates are aggregated and every shard applies its part once.
Bounded staleness (``ssp``): workers run at their own simulated pace and each push is
applied when it arrives; a worker may run at most ``staleness`` clocks ahead of the
slowest. Either way the iteration count is the number of completed clocks.

Failures are delivered at iteration boundaries (``@iter``) or when the virtual
clock passes their time (``@time``); recovery is delegated to :class:`SimRecovery`.
A resumed run (``ctx.resume``) starts from the checkpoint that recovery's restore
finds, with every worker restarted.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

import torch

from trainthrough.engines.base import RunContext
from trainthrough.engines.result import RunResult
from trainthrough.engines.sim.checkpoints import SimCheckpointer
from trainthrough.engines.sim.clock import Costs, VirtualClock
from trainthrough.engines.sim.cluster import SimCluster
from trainthrough.engines.sim.recovery import SimRecovery
from trainthrough.events import CheckpointCorrupt, Event
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ps.layout import make_layout
from trainthrough.ps.round import bsp_round
from trainthrough.ps.shard import Shard
from trainthrough.ps.worker import Worker


class SimEngine:
    """Runs one configuration to its target (or its iteration budget)."""

    def __init__(self, ctx: RunContext) -> None:
        # One intra-op thread: the tensors here are small, and on a busy machine with
        # few cores torch's thread pool makes small operations orders of magnitude
        # slower (docs/measurements.md).
        torch.set_num_threads(1)
        self.ctx = ctx
        cfg, workload, checkpoint_url = ctx.cfg, ctx.workload, ctx.checkpoint_url
        self.cfg = cfg
        self.w = workload
        self.cb = ctx.callback
        self.strategy = ctx.strategy
        spec = workload.default_optimizer
        if cfg.lr is not None:
            from dataclasses import replace
            spec = replace(spec, lr=cfg.lr)
        x0 = workload.init_params(torch.Generator().manual_seed(cfg.seed))
        layout = make_layout(x0, cfg.shards)
        data = workload.partition(cfg.workers)
        shards = [Shard(i, blocks, spec, part)
                  for i, (blocks, part) in enumerate(zip(layout.shards, layout.split(x0)))]
        workers = [Worker(i, workload, d, cfg.seed) for i, d in enumerate(data)]
        for wk in workers:
            wk.start(x0)
        sizes = {"shard": cfg.shards, "worker": cfg.workers}
        self.schedule = ctx.schedule(sizes)
        # Prioritized saves are pruned by row ownership, not by count (see checkpoints.py).
        keep = cfg.checkpoint_keep if self.strategy.checkpoint == "full" else 10**9
        store = (CheckpointStore(checkpoint_url, keep_last=keep)
                 if self.strategy.checkpoint != "none" else None)
        self.cluster = SimCluster(workload, layout, x0, shards, workers, store)
        self.cluster.keep_copies = self.strategy.recovery == "worker-copy"
        self.clock = VirtualClock()
        self.costs = Costs(cfg.cost, workload.step_seconds)
        every = cfg.checkpoint_every or workload.default_checkpoint_every
        policy = self.strategy.checkpoint_policy(every, cfg.checkpoint_fraction,
                                                 cfg.checkpoint_rule)
        self.checkpointer = SimCheckpointer(self.cluster, policy, self.clock, self.costs,
                                            self._emit, cfg.seed)
        self.recovery = SimRecovery(self.cluster, self.schedule, self.strategy.recovery_policy(),
                                    self.checkpointer, self.clock, self.costs, self._emit,
                                    replay_rounds=cfg.consistency == "bsp")
        self.max_iter = ctx.limits.max_iterations
        self.result = ctx.result
        self._wall0 = time.perf_counter()

    # -- hooks ------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        self.ctx.emit(event, sim_seconds=self.clock.now)

    def _evaluate(self, executed: int, logical: int) -> bool:
        return self.ctx.evaluate(self.cluster.params(), executed, sim_seconds=self.clock.now,
                                 logical_iteration=logical)

    # -- the loop ---------------------------------------------------------------
    def run(self) -> RunResult:
        self.cb.before_run(self.cfg.to_dict())
        step: Callable[[int], int] = self._bsp_step if self.cfg.consistency == "bsp" \
            else self._ssp_step
        executed = logical = self._resume() if self.ctx.resume else 0
        done = self._evaluate(executed, logical)
        while not done and executed < self.max_iter:
            self.checkpointer.flush_due()
            struck_at = logical
            logical, rec, undone = self.recovery.deliver(executed, logical)
            if rec is not None:
                # The state just before the failure (the dip starts there).
                self.ctx.disruption(executed, lambda: self.recovery.before[0],
                                    sim_seconds=self.recovery.before[1],
                                    logical_iteration=struck_at)
                self.result.recoveries.append(rec)
                self.result.updates_lost += undone
                self.checkpointer.drop_pending()
                self.checkpointer.checkpointer.rewind(logical)
            logical = step(logical)
            executed += 1
            self.checkpointer.after_iteration(logical)
            self.cb.after_step(executed, self.clock.now)
            done = self.ctx.observe(executed, self.cluster.params, sim_seconds=self.clock.now,
                                    logical_iteration=logical)
        if not done and not self.ctx.evaluated(executed):
            self._evaluate(executed, logical)
        r = self.result
        r.iterations = executed
        r.failures = self.recovery.failures
        saves = self.checkpointer.checkpointer  # the shared one: counts and bytes
        r.checkpoints, r.checkpoint_bytes = saves.count, saves.bytes
        r.checkpoints_failed = saves.failed
        r.extras["checkpoint_payload_bytes"] = saves.payload_bytes
        r.checkpoint_blocked_seconds = self.checkpointer.blocked
        r.sim_seconds = self.clock.now
        r.wall_seconds = time.perf_counter() - self._wall0
        return r

    def _resume(self) -> int:
        """Start from the run's newest checkpoint: the recovery path's restore of every
        shard (onto one common step), and every worker restarted from it."""
        c = self.cluster
        step = self.checkpointer.restore(
            list(range(len(c.shards))),
            lambda msg: self._emit(CheckpointCorrupt(message=msg)))
        for i in range(len(c.workers)):
            c.restart_worker(i)
        return self.ctx.resumed(step, self.schedule, self.checkpointer.checkpointer,
                                sim_seconds=self.clock.now)

    def _bsp_step(self, logical: int) -> int:
        """The shared parameter-server round (ps/round.py), hosted in process."""
        applied = bsp_round(self.cluster, logical, self.w.aggregate)
        self.result.updates_applied += applied or 0
        self.clock.advance(self.costs.bsp_step(self.cluster.param_bytes,
                                               len(self.cluster.workers), self.cfg.shards))
        return logical + 1

    def _ssp_step(self, logical: int) -> int:
        """Advance until the slowest worker completes clock ``logical``.

        Workers are events in a heap keyed by the simulated time their current step
        ends; speeds differ by a seeded factor so staleness actually occurs. A
        worker more than ``staleness`` clocks ahead of the slowest waits.
        """
        if not hasattr(self, "_ready"):
            g = torch.Generator().manual_seed(self.cfg.seed + 17)
            self._speed = (1.0 + 0.5 * torch.rand(len(self.cluster.workers), generator=g)).tolist()
            self._clocks = [logical] * len(self.cluster.workers)
            self._ready: list[tuple[float, int]] = []
        n = len(self.cluster.workers)
        if min(self._clocks) != logical or not self._ready:
            # First call, or recovery rewound the run: every worker restarts at `logical`.
            self._clocks = [logical] * n
            self._ready = [(self.clock.now, i) for i in range(n)]
            heapq.heapify(self._ready)
        scale = 1.0 / n if self.w.aggregate == "mean" else 1.0
        base = self.costs.worker_step(self.cluster.param_bytes, self.cfg.shards)
        while min(self._clocks) <= logical:
            t, i = heapq.heappop(self._ready)
            if self._clocks[i] - min(self._clocks) > self.cfg.staleness:
                # Blocked by the bound: wait until the slowest worker moves.
                heapq.heappush(self._ready, (t + base, i))
                continue
            self.clock.now = max(self.clock.now, t)
            upd = self.cluster.workers[i].compute(self.cluster.pull_for(i), self._clocks[i])
            self.cluster.apply(upd, scale)
            self.result.updates_applied += 1
            self._clocks[i] += 1
            heapq.heappush(self._ready, (t + base * self._speed[i], i))
        return logical + 1
