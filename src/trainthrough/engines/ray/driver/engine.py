"""The ``ray`` engine's driver: start the actors, inject real failures, recover, measure.

The driver never computes updates. It watches (every ~20 ms) for three things:
deaths (a pending ``watch`` call on each actor fails the moment its process is
gone: that is the detection), due failures (iteration or wall-time triggers, carried
out by SIGKILL), and due work (evaluations and checkpoints at iteration multiples,
replacements whose down time has elapsed). Recovery follows the strategy: chains
fail over at once and grow back later; other strategies bring a replacement up after
``recovery_delay`` seconds, restored from the shard's own latest checkpoint. A
replacement process is started as soon as the death is seen and only put in service
when the delay is over, so the configured down time is what users wait, not the
seconds it takes Python and torch to start.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from typing import Any

import ray
import torch

from trainthrough.engines.base import RunContext
from trainthrough.engines.ray.actors.reports import Progress, ShardStats
from trainthrough.engines.ray.chain.zk_membership import ZooKeeperMembership
from trainthrough.engines.ray.driver import recovery
from trainthrough.engines.ray.driver.acknowledged import (
    AcknowledgedLedger,
    Losses,
    acknowledged,
)
from trainthrough.engines.ray.driver.bsp import BulkSynchronous
from trainthrough.engines.ray.driver.checkpoints import RayShardSaves
from trainthrough.engines.ray.driver.cluster import RayCluster, seen_dead
from trainthrough.engines.ray.driver.members import Member, MemberState, OutageWork, Strike
from trainthrough.engines.ray.driver.pool import POOL
from trainthrough.engines.ray.driver.recovery import Measuring, Replacement
from trainthrough.engines.ray.driver.stall import StallWatch
from trainthrough.engines.ray.runtime import ensure_ray_for, shutdown_ray
from trainthrough.engines.result import RunResult
from trainthrough.events import Event, Failure, RecoveryEnded, SpareReady
from trainthrough.faults.schedule import FailureEvent
from trainthrough.ft.checkpointer import Checkpointer
from trainthrough.ps.layout import make_layout

TICK = 0.02
#: How long a run that is over (its budget, its target, its wall limit) still waits for
#: the death of an actor it killed to be seen: every failure it injected is then
#: detected in its record, even one struck a tick before the end (a stateless run's
#: workers, pushing on while the shard is down, once made the last 55 of their 90
#: iterations before the kill's death was seen). A death is seen within ~0.1 s.
KILL_SEEN_GRACE = 5.0


class RayEngine:
    """Runs one configuration on Ray actors. Its helpers (recovery.py, bsp.py) use it
    through :class:`~trainthrough.engines.ray.driver.interface.Driver` only."""

    cluster: RayCluster  #: the run's actors (set once they are up)

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        cfg, workload = ctx.cfg, ctx.workload
        self.cfg, self.cb, self.url = cfg, ctx.callback, ctx.checkpoint_url
        self.aggregate: str = workload.aggregate
        self.strategy = ctx.strategy
        spec = workload.default_optimizer
        if cfg.lr is not None:
            spec = replace(spec, lr=cfg.lr)
        self.spec = spec
        self.x0 = workload.init_params(torch.Generator().manual_seed(cfg.seed))
        self.layout = make_layout(self.x0, cfg.shards)
        replicas = cfg.replicas if self.strategy.replication != "none" else 1
        self.sizes = {"shard": cfg.shards, "worker": cfg.workers, "replica": replicas}
        self.schedule = ctx.schedule(self.sizes)  # validates ids before anything starts
        self.max_iter = ctx.limits.max_iterations
        self.every = cfg.checkpoint_every or workload.default_checkpoint_every
        self.recovery_policy = self.strategy.recovery_policy()
        self.saves = RayShardSaves(self.url, self.strategy.checkpoint, cfg.checkpoint_keep,
                                   cfg.seed, self._heads, self.emit)
        self.checkpointer = Checkpointer(
            self.strategy.checkpoint_policy(self.every, cfg.checkpoint_fraction,
                                            cfg.checkpoint_rule), self.saves, self.emit)
        self.replayed = 0  # iterations run again after rollbacks (executed = logical + this)
        self._rewound_to: int | None = None  # set by a rollback, read by the loop
        self._last_progress: dict[str, Progress] = {}  # every worker's latest report
        self.result = ctx.result
        self.pending: list[Replacement] = []
        self.measuring: list[Measuring] = []
        self.incarnation = [0] * cfg.workers
        self.bsp: BulkSynchronous | None = None
        self.acks = AcknowledgedLedger()

    def emit(self, event: Event) -> None:
        """Record an event of the run (stamped with the wall clock)."""
        self.ctx.emit(event)

    def _heads(self) -> list[Any | None]:
        return [self.cluster.head(i) for i in range(self.layout.num_shards)]

    # -- lifecycle --------------------------------------------------------------
    def run(self) -> RunResult:
        started, ref = ensure_ray_for(self.cfg.workload, self.cfg.ray_address)
        # Start-up: from here (Ray up) to the first update applied (``startup_seconds``);
        # the process's own start-up before it (imports, Ray joined) is recorded apart.
        self._t_start = time.perf_counter()
        self.result.extras["driver_ready_seconds"] = process_age()
        if self.cfg.ray_address:  # a cluster that outlives us: its warm actors (warm.py)
            POOL.attach(self.cfg.keep_warm)
        self.ctx.start_clock()
        cluster = None
        try:  # the actors import the workload as they see it (a cluster we join: shipped)
            cluster = RayCluster(replace(self.cfg, workload=ref), self.strategy, self.layout,
                                 self.x0, self.spec, self.aggregate)
            self.cb.before_run(self.cfg.to_dict())
            return self._loop(cluster)
        finally:
            if cluster is not None:  # its actors serve the next run, unless Ray stops
                cluster.shutdown(reuse=not started or POOL.attached)
            if started:
                shutdown_ray()

    def _loop(self, c: RayCluster) -> RunResult:
        self.cluster = c
        self.ctx.start_clock()
        if self.cfg.consistency == "bsp":
            self.bsp = BulkSynchronous(self)
            return self.bsp.run()
        runs = {m.name: m.handle.run.remote(self.max_iter)
                for m in c.members.values() if m.kind == "worker"}
        iteration, done, progress = 0, False, {}
        if c.zk is not None:
            c.membership = ZooKeeperMembership(c, self.emit)
        stall = StallWatch(self.cfg.recovery_delay, lambda: self.pending)
        self.evaluate(0, {})
        while not done:
            watches = {m.watch: m for m in c.members.values() if m.watch is not None}
            ready, _ = ray.wait(list(watches), num_returns=len(watches), timeout=TICK)
            for ref in ready:
                m = watches[ref]
                m.watch = None
                if not seen_dead(m, ref):  # out of reach, not dead: watched again
                    continue
                if c.membership is not None and m.kind == "shard" and m.in_service:
                    # A serving replica's death is seen through ZooKeeper (after a grace,
                    # through this report if ZooKeeper stays silent).
                    c.membership.ray_death(m)
                    continue
                self.on_death(m, iteration)
            for m in c.membership.step() if c.membership is not None else []:
                self.on_death(m, iteration)
            now = self.ctx.wall()
            progress = self._progress()
            stall.check(progress, iteration)
            if any(p["pushes"] for p in progress.values()):
                self.started_training()
            iteration = self._logical(progress, iteration)
            executed = iteration + self.replayed
            for e in self.schedule.due(executed, now):
                self.strike(e, executed)
            self.activate_due(iteration, runs)
            if self._rewound_to is not None:  # a rollback set every worker back
                iteration, self._rewound_to = self._rewound_to, None
                executed = iteration + self.replayed
            self.measure()
            self.report_spares()
            self.checkpointer.after_iteration(iteration)
            # The driver sees the iteration at its ticks: it keeps or scores what it sees.
            done = self.ctx.observe(executed, self.cluster.pull, **self.extras(progress, iteration))
            self.cb.after_step(executed, now)
            done = done or executed >= self.max_iter or (
                self.cfg.wall_limit is not None and now >= self.cfg.wall_limit) or (
                not self.pending and all(_returned(r) for r in runs.values()))
            done = done and not self._kills_unseen()
        for m in c.members.values():
            if m.kind == "worker" and m.alive:
                m.handle.stop.remote()
        ray.wait(list(runs.values()), num_returns=len(runs), timeout=10)
        # The tick that ended the run may have come between a restored shard's first
        # update and the measurement of it (the target reached right after a recovery).
        self.measure()
        progress = self._progress()  # after the last pushes: what workers saw acknowledged
        return self.finish(iteration + self.replayed, progress)

    def _kills_unseen(self) -> bool:
        """Whether an actor this run killed has not been seen dead yet, within
        :data:`KILL_SEEN_GRACE` of its kill."""
        now = time.perf_counter()
        return any(m.state is MemberState.KILLED and m.killed_at is not None
                   and now - m.killed_at < KILL_SEEN_GRACE
                   for m in self.cluster.members.values())

    def started_training(self) -> None:
        """Record the start-up time once, when the first update is seen applied."""
        if "startup_seconds" not in self.result.extras:
            self.result.extras["startup_seconds"] = time.perf_counter() - self._t_start
            self.result.extras["process_startup_seconds"] = process_age()

    def _logical(self, progress: dict[str, Progress], previous: int) -> int:
        """The logical iteration: the mean step of the workers in service."""
        live = [p["step"] for name, p in progress.items()
                if self.cluster.members[name].serving]
        return sum(live) // len(live) if live else previous

    def rewind(self, step: int, iteration: int) -> None:
        """A rollback: every worker goes back to ``step`` (its data position follows)."""
        self.checkpointer.rewind(step)
        if self.bsp is not None:  # the driver runs the rounds: the next one is ``step``
            self.result.updates_lost += self.bsp.rewind(step) * self.cfg.workers
            return
        back = max(0, iteration - step)
        self.replayed += back
        self.result.updates_lost += back * self.cfg.workers
        refs = [m.handle.rewind.remote(step) for m in self.cluster.members.values()
                if m.kind == "worker" and m.serving]
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(refs, timeout=30)
        self._rewound_to = step

    # -- observation ------------------------------------------------------------
    def _progress(self) -> dict[str, Progress]:
        live = [m for m in self.cluster.members.values()
                if m.kind == "worker" and m.serving]
        out = self._last_progress
        refs = {m.name: m.handle.progress.remote() for m in live}
        for name, ref in refs.items():
            with contextlib.suppress(ray.exceptions.RayError):
                out[name] = ray.get(ref, timeout=5)
        self._last_progress = out
        return out

    def evaluate(self, iteration: int, progress: dict[str, Progress],
                 logical: int | None = None) -> bool:
        """Score the current parameters at ``iteration``; True: the target is reached."""
        params = self.cluster.pull()
        if params is None:
            return False  # a shard is down: nothing to score
        return self.ctx.evaluate(params, iteration,
                                 **self.extras(progress, iteration if logical is None else logical))

    @staticmethod
    def extras(progress: dict[str, Progress], logical: int) -> dict[str, Any]:
        """What every evaluation records besides the metric."""
        return {"logical_iteration": logical,
                "updates_applied": sum(p["pushes"] for p in progress.values()),
                "idle_seconds": sum(p["idle"] for p in progress.values())}

    # -- failures and recovery --------------------------------------------------
    def strike(self, e: FailureEvent, iteration: int) -> None:
        """Carry out a failure that fell due at executed ``iteration``: kill its
        victims, count and record each (its :class:`~.members.Strike`)."""
        logical = self.bsp.logical if self.bsp is not None else iteration - self.replayed
        # The state the failure strikes, scored unless it was (curves show the dip).
        progress = {} if self.bsp is not None else self._last_progress
        self.ctx.disruption(iteration, self.cluster.pull, **self.extras(progress, logical))
        for name in recovery.victims(self.cluster, e):
            m = self.cluster.members[name]
            before = self.cluster.pull() if m.kind == "shard" else None
            version = None
            if m.kind == "shard" and self.bsp is not None:
                # Between rounds nothing changes it: the version a worker-copy replay
                # checks its copies against (async: pushes race the kill, no replay).
                version = int(ray.get(m.handle.stats.remote(), timeout=10)["version"])
            self.cluster.kill(name)
            self.result.failures += 1
            self.emit(Failure(iteration=iteration, kind=m.kind, ids=[m.index], member=name,
                              spec=e.spec, in_service=m.in_service))
            m.strike = Strike(iteration, before, self._work(), version)

    def on_death(self, m: Member, iteration: int) -> None:
        """``m`` was seen dead: fail over, or start its replacement (recovery.py)."""
        recovery.on_death(self, m, iteration)

    def activate_due(self, iteration: int, runs: dict[str, Any]) -> None:
        """Put in service each pending replacement that is ready and whose down time
        is over (``runs``: the asynchronous workers' ``run`` refs). A replacement
        killed before it served is not: its death, seen next, starts another."""
        now = time.perf_counter()
        for p in [p for p in self.pending
                  if p.at <= now and p.member.alive and self.cluster.ready(p.member)]:
            if recovery.activate(self, p, iteration, runs):
                self.pending.remove(p)
                # A recovery ended: the next iterations are evaluated too.
                self.ctx.disruption(self.bsp.executed if self.bsp is not None
                                    else iteration + self.replayed)

    def report_spares(self) -> None:
        """An event for each spare started after a failure that is now ready: how long a
        failure soon after that one would wait for its replacement (advise's model)."""
        for m, seconds in self.cluster.refilled():
            self.emit(SpareReady(member=m.name, after_failure=round(seconds, 4)))

    def measure(self) -> None:
        """Close the recoveries whose shard has applied an update since: their recovery
        seconds run from the kill to that update."""
        for r in list(self.measuring):
            try:
                version = ray.get(r.handle.stats.remote(), timeout=2)["version"]
            except ray.exceptions.RayError:
                continue
            if version > r.version:
                self.measuring.remove(r)
                rec = r.record
                rec.recovery_seconds = time.perf_counter() - r.kill_time
                self.result.recoveries.append(rec)
                busy = self._busy_share(r.work_at_kill)
                self.result.extras.setdefault("busy_during_outage", []).append(busy)
                self.emit(RecoveryEnded(recovery=rec, busy_during_outage=busy))

    def _work(self) -> OutageWork:
        """The workers' outage work so far."""
        ps = self._progress().values()
        return OutageWork(sum(p.get("outage_busy", 0.0) for p in ps),
                          sum(p.get("outage", 0.0) for p in ps))

    def _busy_share(self, at_kill: OutageWork | None) -> float | None:
        """Share of the workers' outage they spent computing (stateless: ~1; waiting
        strategies: 0). The outage is each worker's own: from its first failed call to
        a shard until every shard answers it again, so the normal round trips after the
        recovery (a small model's steps are mostly communication) do not count."""
        if at_kill is None:
            return None
        now = self._work()
        spent = now.total - at_kill.total
        return (now.busy - at_kill.busy) / spent if spent > 0 else None

    def chain_wiped(self, shard: int, handle: Any, restored_from: int | None) -> int:
        """Every replica of ``shard`` was lost and ``handle`` holds its restored state,
        not serving yet: record the acknowledged pushes the restore did not bring back
        (acknowledged.py); returns how many, beyond what earlier restores found.

        Raises:
            ray.exceptions.RayError: the restored replica died (its death is handled
            next; a later call counts nothing twice).
        """
        held = ray.get(handle.stats.remote(), timeout=10)["held"]
        acked = acknowledged(self._progress(), self._worker_ids())
        return sum(e["lost"] for e in self.acks.restored(shard, acked, held, restored_from))

    def _worker_ids(self) -> dict[str, int]:
        return {m.name: m.index for m in self.cluster.members.values() if m.kind == "worker"}

    def _replica_stats(self) -> dict[int, list[ShardStats]]:
        """Per shard, the stats of each live replica (none: no replica left at the end,
        a wipe whose restore had not happened)."""
        out: dict[int, list[ShardStats]] = {}
        for i in range(self.layout.num_shards):
            out[i] = []
            for name in self.cluster.chains[i].members:
                with contextlib.suppress(ray.exceptions.RayError):
                    out[i].append(ray.get(self.cluster.members[name].handle.stats.remote(),
                                          timeout=10))
        return out

    def _acknowledged_lost(self, progress: dict[str, Progress],
                           stats: dict[int, list[ShardStats]]) -> Losses | None:
        """The run's acknowledged pushes lost, in updates (acknowledged.py): what wiped
        chains' restores did not bring back, and what no live replica of a chain holds
        at the end. Synchronous chains that keep a replica promise 0. None without
        chains: a non-replicated shard's restart is not counted (docs/strategies.md).
        """
        if self.cluster.mode == "none":
            return None
        held = {i: [s["held"] for s in replicas] for i, replicas in stats.items()}
        return self.acks.at_end(acknowledged(progress, self._worker_ids()), held)

    def finish(self, iteration: int, progress: dict[str, Progress]) -> RunResult:
        """The run's result at its end (``iteration`` executed)."""
        r = self.result
        r.iterations = iteration
        ck = self.checkpointer
        r.checkpoints, r.checkpoint_bytes = ck.count, ck.bytes
        r.checkpoints_failed = ck.failed
        r.checkpoint_blocked_seconds = ck.blocked
        r.extras["checkpoint_payload_bytes"] = ck.payload_bytes
        r.extras.update(self.saves.stats())
        r.wall_seconds = r.sim_seconds = self.ctx.wall()
        stats = self._replica_stats()
        # What the shards hold at the end (the most any live replica of a shard holds),
        # not what was acknowledged: a restore takes back what came after its checkpoint.
        r.updates_applied = sum(max((s["version"] for s in replicas), default=0)
                                for replicas in stats.values())
        lost = self._acknowledged_lost(progress, stats)
        r.extras.update({
            "worker_busy_seconds": sum(p["busy"] for p in progress.values()),
            "worker_idle_seconds": sum(p["idle"] for p in progress.values()),
            "worker_comm_seconds": sum(p.get("comm", 0.0) for p in progress.values()),
            "updates_buffered": sum(p["buffered"] for p in progress.values()),
            "updates_acknowledged": sum(p["pushes"] for p in progress.values()),
            "acknowledged_lost": lost.updates if lost is not None else None,
            "acknowledged_lost_pairs": lost.pairs if lost is not None else None,
            "acknowledged_lost_wiped": self.acks.wiped if lost is not None else None,
            "acknowledged_lost_detail": lost.detail[:10] if lost is not None else None,
            "time_to_target": r.sim_seconds_to_target})
        return r


def process_age() -> float | None:
    """Seconds since this process started (Linux; None elsewhere): what a user waits
    from typing the command, the interpreter and imports included."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _returned(ref: Any) -> bool:
    """Whether a worker's ``run`` ended by returning (its iterations done).

    A run that ended with its actor's death did not finish: that is a failure, seen and
    recovered through the member's watch, which may come a tick later (a whole host lost
    takes its workers' runs down at once, before Ray reports the actors dead). A run
    that raised is the worker's own error, raised here.
    """
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return False
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError:
        return False
    return True
