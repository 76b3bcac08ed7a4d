"""Bulk-synchronous rounds on Ray: the parameter-server round, driven by the driver.

Each round is the same as ``sim``'s: every worker computes its update for logical
step ``k`` on the same parameters, and every shard applies the aggregate once
(``ShardActor.apply_round``, idempotent per round). The parameters go from the shards
to the workers and the update parts from the workers to the shards by reference:
the driver only sends the calls. Failures are delivered at round boundaries (as in
``sim``); the driver then waits until every shard and worker is back in service,
through the same death handling and recovery policy as asynchronous runs, and a
rollback sets the next round's step. With the same seed a run follows ``sim``'s
logical-iteration trace.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ray

from trainthrough.engines.ray.driver.cluster import seen_dead
from trainthrough.engines.result import RunResult
from trainthrough.ps.round import bsp_round

if TYPE_CHECKING:
    from trainthrough.engines.ray.driver.interface import Driver

TICK = 0.02


class BulkSynchronous:
    """The round loop; ``logical`` is the next round's step (a rollback rewinds it),
    ``executed`` counts the rounds run (replays included). It drives the engine's run
    through the :class:`~.interface.Driver` protocol."""

    def __init__(self, eng: Driver) -> None:
        self.eng, self.c = eng, eng.cluster
        self.logical = self.executed = 0
        self.rounds_applied = 0

    def run(self) -> RunResult:
        eng, cfg = self.eng, self.eng.cfg
        done = eng.evaluate(0, {}, 0)
        while not done and self.executed < eng.max_iter:
            if cfg.wall_limit is not None and eng.ctx.wall() >= cfg.wall_limit:
                break
            for e in eng.schedule.due(self.executed, eng.ctx.wall()):
                eng.strike(e, self.executed)
            self._settle()
            if not self._round():
                continue  # someone died during the round: recover, then run it again
            eng.started_training()
            self.logical += 1
            self.executed += 1
            eng.checkpointer.after_iteration(self.logical)
            eng.measure()
            eng.report_spares()
            eng.ctx.callback.after_step(self.executed, eng.ctx.wall())
            done = eng.ctx.observe(self.executed, self.c.pull, **eng.extras({}, self.logical))
        if not done and not eng.ctx.evaluated(self.executed):
            eng.evaluate(self.executed, {}, self.logical)
        result = eng.finish(self.executed, {})
        result.updates_applied = self.rounds_applied * cfg.workers
        return result

    def rewind(self, step: int) -> int:
        """A rollback to ``step``; returns how many iterations are undone."""
        back = max(0, self.logical - step)
        self.logical = step
        return back

    def _settle(self) -> None:
        """Handle deaths and wait until every shard has a head and every worker serves.

        A ``phase=recovery`` failure strikes meanwhile; any other failure that falls
        due now strikes once the recovery is over, at the next round's start, together
        with every other one held back, and those recover side by side: this mode
        claims ``batched_recovery`` (the ray package's CAPABILITIES)."""
        eng, c = self.eng, self.c
        while True:
            watches = {m.watch: m for m in c.members.values() if m.watch is not None}
            ready, _ = ray.wait(list(watches), num_returns=len(watches), timeout=TICK)
            for ref in ready:
                m = watches[ref]
                m.watch = None
                if seen_dead(m, ref):  # else out of reach, not dead: watched again
                    eng.on_death(m, self.executed)
            if eng.pending:
                for e in eng.schedule.due(self.executed, eng.ctx.wall(), phase="recovery"):
                    eng.strike(e, self.executed)
            eng.activate_due(self.logical, {})
            eng.report_spares()
            if not eng.pending and not ready and self._whole():
                return
            if not watches:  # ray.wait paused for TICK already when there was one
                time.sleep(TICK)

    def _whole(self) -> bool:
        c = self.c
        shards = all(c.chains[i].members and all(
            c.members[n].alive for n in c.chains[i].members)
            for i in range(self.eng.layout.num_shards))
        workers = [m for m in c.members.values() if m.kind == "worker" and m.serving]
        return bool(shards) and len(workers) == self.eng.cfg.workers

    def _round(self) -> bool:
        """One round (ps/round.py); False if a shard or worker died during it."""
        self._heads = [h for i in range(self.eng.layout.num_shards)
                       if (h := self.c.head(i)) is not None]
        if len(self._heads) < self.eng.layout.num_shards:
            return False  # a shard lost every replica meanwhile: settle again
        applied = bsp_round(self, self.logical, self.eng.aggregate)
        if applied is None:
            return False
        self.rounds_applied += 1
        return True

    # -- the round's host: references flow between actors, not through the driver ----
    def pull(self) -> list[Any]:
        return [h.pull.remote() for h in self._heads]

    def compute(self, step: int, params: list[Any]) -> list[list[Any]]:
        workers = sorted((m for m in self.c.members.values() if m.kind == "worker" and m.serving),
                         key=lambda m: m.index)
        n = len(self._heads)
        parts = [w.handle.compute_round.options(num_returns=n).remote(step, *params)
                 for w in workers]
        return [[p] for p in parts] if n == 1 else [list(p) for p in parts]

    def apply_parts(self, step: int, parts: list[list[Any]], divide_by: int) -> bool:
        refs = [h.apply_round.remote(step, divide_by, *p) for h, p in zip(self._heads, parts)]
        try:
            ray.get(refs, timeout=300)
        except (ray.exceptions.RayError, TimeoutError):
            return False
        return True
