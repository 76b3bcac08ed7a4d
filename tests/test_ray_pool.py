"""Pooled Ray actors (engines/ray/driver/pool.py): runs on reused actors equal runs on fresh ones.

Bulk-synchronous runs are deterministic on Ray (the driver runs the rounds and
aggregates in worker order), so a reused actor that kept anything from its previous
run (optimizer moments, a version, applied rounds, a dedup table, a worker's data
position or sampler) would change the parameters and the metrics, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest

ray = pytest.importorskip("ray")

from trainthrough.config import RunConfig  # noqa: E402
from trainthrough.engines.ray.driver.pool import POOL  # noqa: E402
from trainthrough.lab.bound import IterateTracker  # noqa: E402
from trainthrough.lab.runner import run_silent  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_session")


def _bsp(seed: int, strategy: str) -> RunConfig:
    # One shard: each actor imports torch (~2 s), and a second shard is the same class
    # reset the same way, so it covers nothing more.
    return RunConfig(workload="cnn", strategy=strategy, engine="ray", shards=1, workers=2,
                     consistency="bsp", seed=seed, max_iterations=12, eval_every=4,
                     checkpoint_every=5, stop_at_target=False)


def _dirty() -> RunConfig:
    """An asynchronous run that leaves every kind of state behind: Adam moments,
    versions, dedup tables, data positions, a chain's forwarder (a chain saves no
    checkpoint: the interval it was given was never used, and is refused now)."""
    return RunConfig(workload="cnn", strategy="chain-async", engine="ray", shards=1,
                     workers=2, consistency="async", replicas=2, max_iterations=40,
                     eval_every=10, stop_at_target=False)


def _outcome(cfg: RunConfig) -> dict[str, Any]:
    tracker = IterateTracker()
    s = run_silent(cfg, tracker)
    return {"iterations": tracker.iterations, "params": tracker.iterates[-1],
            "metric": s.final_metric, "updates": s.updates_applied}


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["iterations"] == b["iterations"]
    assert a["metric"] == b["metric"] and a["updates"] == b["updates"]
    assert bool((a["params"] == b["params"]).all()), "parameters differ"


def test_two_runs_on_reused_actors_equal_two_runs_on_fresh_ones() -> None:
    first, second = _bsp(0, "checkpoint-sync"), _bsp(1, "checkpoint-async")
    POOL.clear()
    fresh = [_outcome(first)]
    POOL.clear()
    fresh.append(_outcome(second))

    POOL.clear()
    run_silent(_dirty())
    created = POOL.created
    reused = [_outcome(first), _outcome(second)]
    assert POOL.created == created, "a run on a warm pool started new actors"
    for a, b in zip(fresh, reused):
        _same(a, b)


def test_killed_actors_do_not_come_back() -> None:
    POOL.clear()
    s = run_silent(RunConfig(workload="mlr", strategy="checkpoint-sync", engine="ray",
                             shards=1, workers=2, consistency="async",
                             failures=["worker=1@iter=5"], recovery_delay=0.2,
                             max_iterations=10**6, wall_limit=5.0, stop_at_target=False))
    assert s.failures == 1
    idle = POOL.idle()
    assert idle
    # Every pooled actor answers: none is the killed worker.
    assert len(ray.get([h.__ray_ready__.remote() for h in idle], timeout=60)) == len(idle)
