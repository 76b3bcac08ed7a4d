"""The conformance matrix: which (engine, paradigm, strategy, failure form) cells exist,
how to run one, and the invariants every run must keep whatever engine hosts it.

The cells come from the engines' own declarations (``engines/registry.py``), never from
a list kept here: a cell an engine claims is run; a cell it does not claim must be
refused before anything starts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainthrough.config import CostModel, RunConfig
from trainthrough.engines.matrix import FORMS, Cell, all_cells, claimed, covering
from trainthrough.engines.result import RunResult
from trainthrough.ft.strategy import resolve
from trainthrough.lab.runner import run
from trainthrough.lab.validate import for_strategy

__all__ = ["FORMS", "Cell", "all_cells", "check", "claimed", "config", "covering", "run_cell"]

CHECKPOINT_EVERY = 10
#: Data parallel stops at its target (mlr reaches 0.9 near iteration 30, after every
#: form's failure at 12 and its recovery); a run that missed its stop trains on to
#: :data:`DP_MAX`. On the real engines the first rank evaluates and the controller,
#: which records it, asks the group to stop; the ranks keep training until the request
#: reaches them: ~5 iterations on an idle machine, 110 seen at a
#: load of 5-12 on 2 cores (mlr makes 100-200 steps a second), so at most
#: :data:`STOP_LAG`, far from the ~3,000 of a stop never heard.
DP_TARGET, DP_MAX, STOP_LAG = 0.9, 3000, 1000


def config(c: Cell) -> RunConfig:
    """A small run of the cell: long enough for every failure and its recovery."""
    base: dict[str, Any] = dict(engine=c.engine, paradigm=c.paradigm, strategy=c.strategy,
                                failures=c.specs(), seed=3, stop_at_target=False,
                                checkpoint_every=CHECKPOINT_EVERY, eval_every=5)
    if c.paradigm == "ps":
        base.update(workload="mlr", shards=4, workers=2)
        if c.engine == "sim":
            base.update(max_iterations=90)
        else:
            # Few actors (each imports torch): 2 shards, chains of 2. A failure struck at
            # an iteration bounds the run by iterations (a loaded machine may make 35 in
            # 4 s or in 20); one struck at a time, by the wall clock.
            timed = c.form.name in ("time", "mtbf")
            base.update(consistency="async", recovery_delay=0.2, shards=2,
                        max_iterations=10**6 if timed else 90,
                        wall_limit=4.0 if timed else 60.0)
            if resolve(c.strategy).replication != "none":
                base.update(replicas=2)
    else:
        base.update(workload="mlr", ranks=3, max_iterations=DP_MAX, target=DP_TARGET,
                    stop_at_target=True)
        if c.engine != "sim":  # a hung rank is found by the collective timeout: short
            base.update(wall_limit=60.0, recovery_delay=0.1,
                        cost=CostModel(timeout_seconds=2.0))
    return for_strategy(RunConfig(**base), c.strategy)  # no interval where nothing is saved


def run_cell(c: Cell, tmp: Path) -> tuple[RunResult, list[dict[str, Any]]]:
    out = tmp / c.id
    summary = run(config(c), out)
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    return summary.result, events


def check(c: Cell, s: RunResult, events: list[dict[str, Any]],
          full_save_payload: int) -> None:
    """The invariants every engine keeps for this cell (asserts)."""
    strategy = resolve(c.strategy)
    fails = [e for e in events if e["type"] == "failure"]
    # 1. The injected failures are the spec's, each recorded.
    assert s.failures == c.form.count, (s.failures, c.form.count)
    assert len(fails) == s.failures
    # 2. Every failure was detected and recovered from (real engines: a replacement
    #    process may still be starting when a short run ends; its detection counts).
    detected = [e for e in events if e["type"] in ("detection", "failover")]
    preempted, slowed = c.form.name == "preempt", c.form.name == "slow"
    assert s.recoveries or (c.engine != "sim" and detected) or preempted or slowed, \
        "no recovery recorded"
    # 2b. A preempted rank drains at a step boundary: no recovery, no step redone.
    if preempted:
        assert [e["slots"] for e in events if e["type"] == "drained"] == [[1]]
        assert not s.recoveries and not detected
        assert s.iterations == s.extras["logical_iterations"]
    # 2c. A slow rank without a straggler deadline is waited for: nothing is lost.
    if slowed:
        assert not s.recoveries and not detected and s.extras["ranks_min"] == 3
        assert s.iterations == s.extras["logical_iterations"]
    # 2d. A pause the group gave up on fences the paused incarnation (sim: the pause
    #     outlasts the run's few simulated seconds, so it never wakes within it).
    #     A cut past the timeout the same (sim: 30 s, longer than the run too).
    if c.form.name in ("pause", "partition"):
        assert [(e["slot"], e["reason"]) for e in events
                if e["type"] == "rank-fenced"][:1] == [(1, "no-report")]
    if c.engine == "sim":  # real engines report NaN where no survivor kept the old state
        assert all(math.isfinite(r.perturbation_norm) for r in s.recoveries)
    checkpoints = [e for e in events if e["type"] == "checkpoint"]
    first = fails[0]
    before = [e["iteration"] for e in checkpoints
              if events.index(e) < events.index(first)]
    # 3. checkpoint-restart resumes at the last checkpoint before the failure.
    if strategy.recovery == "rollback-all" and strategy.persist == "sync" and \
            c.form.name in ("iter", "worker") and c.paradigm == "ps" and first["kind"] == "shard":
        rec = s.recoveries[0]
        assert rec.restored_from == (max(before) if before else 0), (rec, before)
        if c.engine == "sim":
            resumed = [e for e in events if e["type"] == "recovery"][0]
            assert resumed["logical_iteration"] == rec.restored_from
    # 4. restore-lost leaves survivors untouched (sim: bulk-synchronous, so exactly)
    #    and restores the lost shard from the last checkpoint.
    if strategy.recovery == "restore-lost" and strategy.checkpoint == "full" and \
            strategy.persist == "sync" and c.form.name == "iter":
        rec = s.recoveries[0]
        assert rec.restored_from == (max(before) if before else None), (rec, before)
        if c.engine == "sim":
            assert math.isclose(rec.perturbation_norm, rec.perturbation_norm_lost,
                                rel_tol=1e-9)
    # 4b. worker-copy: survivors untouched (sim), and the lost rows came from the live
    #     workers' copies (every worker holds every row it pulled).
    if strategy.recovery == "worker-copy" and c.form.name == "iter":
        rec = s.recoveries[0]
        assert rec.action == "worker-copy" and rec.worker_copy["rows_from_workers"] > 0
        assert rec.worker_copy["rows_initial"] == 0
        if c.engine == "sim":
            assert math.isclose(rec.perturbation_norm, rec.perturbation_norm_lost,
                                rel_tol=1e-9, abs_tol=1e-12)
    # 5. Prioritized saves write no more bytes per N than one full checkpoint.
    if strategy.checkpoint == "prioritized":
        logical = s.extras.get("logical_iterations") or s.iterations
        per_n = s.extras["checkpoint_payload_bytes"] / max(1.0, logical / CHECKPOINT_EVERY)
        assert per_n <= full_save_payload * 1.0001, (per_n, full_save_payload)
    # 6. Chain failover loses no acknowledged update.
    if strategy.replication == "chain-sync":
        assert s.extras["acknowledged_lost"] == 0, s.extras.get("acknowledged_lost_detail")
    # 7. Data parallel: the surviving replicas agree bit for bit.
    if c.paradigm == "dp" and "replicas_identical" in s.extras:
        assert s.extras["replicas_identical"]
    # 8. Relaxed sync: replicas identical after each outer step (7, checked by the host
    #    at every outer step), outer steps went on without the lost replicas, nobody
    #    rolled back, and a lost replica took at most its H local steps along.
    if strategy.relaxed:
        assert s.extras["replicas_identical"] is True
        assert {r.action for r in s.recoveries} <= {"drop-local"}
        assert all(r.restored_from is None for r in s.recoveries)
        assert s.extras["outer_steps"] >= s.iterations // config(c).sync_every // 2
        # (a drain leaves after an outer step, when every replica is in sync)
        assert len(s.extras["local_steps_lost"]) == (0 if preempted or slowed else c.form.count)
        assert all(0 <= n <= config(c).sync_every for n in s.extras["local_steps_lost"])
        assert s.extras["ranks_min"] <= 3 - (0 if slowed else c.form.count)
    # 9. Data parallel stops at its target after every kind of recovery (a restart, a
    #    re-formation, a join, a relaxed drop): sim at the evaluation that finds it,
    #    the real engines within the lag of their asynchronous evaluation.
    #    A real run still recovering when its wall limit ends it (a restart's three new
    #    processes on a loaded machine) never reached its target: nothing to check.
    cfg = config(c)
    if c.paradigm == "dp":
        slow = c.engine != "sim" and cfg.wall_limit is not None \
            and s.wall_seconds >= cfg.wall_limit and s.iterations < DP_MAX
        assert s.converged or slow, (s.final_metric, s.iterations, s.wall_seconds,
                                     s.extras.get("restart_seconds"))
    if c.paradigm == "dp" and s.converged:
        lag = s.iterations - s.iterations_to_target
        assert 0 <= lag <= (cfg.eval_every if c.engine == "sim" else STOP_LAG), \
            (s.iterations_to_target, s.iterations)
