"""Ray in bulk-synchronous rounds runs the same parameter-server round as ``sim``: with
the same seed and checkpoint-restart through a real SIGKILL, it follows sim's
logical-iteration trace exactly and ends on the same parameters (within 1e-5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.result import RunResult
from trainthrough.lab.runner import run

pytestmark = pytest.mark.usefixtures("ray_session")


class LastParams(Callback):
    def __init__(self) -> None:
        self.params: dict[str, torch.Tensor] = {}

    def on_params(self, iteration: int, params: dict[str, Any]) -> None:
        self.params = {n: v.detach().clone() for n, v in params.items()}


def _delay(engine: str) -> dict[str, float]:
    """Ray's real down time; sim charges its cost model's restart time instead."""
    return {"recovery_delay": 0.2} if engine == "ray" else {}


def _run(engine: str, tmp: Path) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor],
                                           RunResult]:
    cfg = RunConfig(workload="mlr", strategy="checkpoint-restart", engine=engine,
                    consistency="bsp", shards=2, workers=2, checkpoint_every=20,
                    failures=["shards=0@iter=50"], max_iterations=100,
                    eval_every=5, stop_at_target=False, seed=4, **_delay(engine))
    cb = LastParams()
    result = run(cfg, tmp / engine, [cb]).result
    metrics = [json.loads(x) for x in (tmp / engine / "metrics.jsonl").read_text().splitlines()]
    return metrics, cb.params, result


@pytest.mark.timeout(120)
def test_ray_bsp_follows_sims_trace(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sim_m, sim_p, sim_s = _run("sim", tmp_path)
    ray_m, ray_p, ray_s = _run("ray", tmp_path)
    assert sim_s.failures == ray_s.failures == 1
    assert sim_s.recoveries[0].restored_from == ray_s.recoveries[0].restored_from == 40
    assert [(m["iteration"], m["logical_iteration"]) for m in ray_m] == \
        [(m["iteration"], m["logical_iteration"]) for m in sim_m]
    for a, b in zip(sim_m, ray_m):
        assert abs(a["metric"] - b["metric"]) < 1e-5, (a, b)
    for n, v in sim_p.items():
        assert torch.allclose(v, ray_p[n], atol=1e-5, rtol=0), n


@pytest.mark.timeout(120)
def test_worker_copy_on_ray_rebuilds_the_lost_shard_from_worker_actors(tmp_path: Path) -> None:
    """Shard 1 is SIGKILLed between rounds; its replacement gets its rows from the worker
    actors' copies (the round before) and replays that round from their kept pushes:
    on ridge (plain SGD) nothing is lost, and the run ends where sim's does."""
    pytest.importorskip("ray")
    out = {}
    for engine in ("sim", "ray"):
        cfg = RunConfig(workload="ridge", strategy="worker-copy", engine=engine,
                        consistency="bsp", shards=2, workers=2, checkpoint_every=20,
                        failures=["shards=1@iter=30"], max_iterations=40,
                        eval_every=5, stop_at_target=False, seed=4, **_delay(engine))
        cb = LastParams()
        out[engine] = (run(cfg, tmp_path / engine, [cb]).result, cb.params)
    (sim_s, sim_p), (ray_s, ray_p) = out["sim"], out["ray"]
    rec = ray_s.recoveries[0]
    assert rec.action == "worker-copy" and rec.restored_from == 20
    assert rec.perturbation_norm == 0.0
    wc = rec.worker_copy
    assert wc["rows_from_workers"] == 32 and wc["rows_from_checkpoint"] == 0
    assert wc["rounds_replayed"] == 1 and wc["copy_lag"] == 1
    # Both workers asked for their version, worker 0 for the rows, both for their push.
    assert wc["messages"] == 2 * 2 + 2 + 2 * 2 and ray_s.extras["worker_copy_messages"] == 10
    assert ray_s.extras["worker_copy_bytes"] == wc["bytes"] == 32 * 8 * 3
    assert sim_s.recoveries[0].worker_copy == wc  # the same record as sim's
    for n, v in sim_p.items():
        assert torch.allclose(v, ray_p[n], atol=1e-9, rtol=0), n
