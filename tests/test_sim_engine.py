"""The sim engine: determinism, rework cost, recovery paths, run-folder contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.lab.runner import run, run_silent

from .conftest import read_metrics, read_summary

ISSUE_CMD = ["run", "--workload", "mlr", "--strategy", "checkpoint-restart",
             "--checkpoint-every", "50", "--fail", "shards=50%@iter=230", "--baseline",
             "--seed", "1", "--quiet"]

SUMMARY_KEYS = {"workload", "strategy", "engine", "seed", "metric_name", "target", "converged",
                "iterations", "iterations_to_target", "baseline_iterations_to_target",
                "rework_iterations", "failures", "recoveries", "checkpoint_bytes",
                "checkpoint_blocked_seconds", "updates_applied", "updates_lost",
                "wall_seconds", "sim_seconds", "final_metric"}


def _no_wall(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]


def test_issue_command_converges_with_rework_and_is_deterministic(cli, tmp_path: Path) -> None:  # noqa: ANN001
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(*ISSUE_CMD, "--out", str(a)).code == 0
    assert cli(*ISSUE_CMD, "--out", str(b)).code == 0
    s = read_summary(a)
    assert set(s) >= SUMMARY_KEYS
    assert s["converged"] and s["rework_iterations"] > 0
    assert s["recoveries"][0]["restored_from"] == 200
    assert {"failed", "at_iteration", "recovery_seconds", "perturbation_norm"} <= set(
        s["recoveries"][0])
    assert _no_wall(read_metrics(a)) == _no_wall(read_metrics(b))
    assert (a / "config.toml").read_text() != ""
    events = [json.loads(x) for x in (a / "events.jsonl").read_text().splitlines()]
    assert {"failure", "detection", "checkpoint", "recovery"} <= {e["type"] for e in events}


def test_config_toml_reruns_to_the_same_result(cli, tmp_path: Path) -> None:  # noqa: ANN001
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(*ISSUE_CMD, "--out", str(a)).code == 0
    assert cli("run", "--config", str(a / "config.toml"), "--checkpoint-dir",
               str(b / "checkpoints"), "--out", str(b), "--quiet").code == 0
    assert _no_wall(read_metrics(a)) == _no_wall(read_metrics(b))


def test_strategy_none_still_converges(cli, tmp_path: Path) -> None:  # noqa: ANN001
    cmd = [x if x != "checkpoint-restart" else "none" for x in ISSUE_CMD]
    i = cmd.index("--checkpoint-every")  # none saves nothing: an interval is refused
    del cmd[i:i + 2]
    r = cli(*cmd, "--out", str(tmp_path / "n"))
    s = read_summary(tmp_path / "n")
    assert r.code == 0 and s["converged"]
    assert s["recoveries"][0]["action"] == "reinit" and s["checkpoint_bytes"] == 0


def _cr(fail_at: int, **kw) -> RunResult:  # noqa: ANN003
    cfg = RunConfig(workload="mlr", strategy="checkpoint-restart", checkpoint_every=50, seed=2,
                    failures=[f"shards=1@iter={fail_at}"], **kw)
    return run_silent(cfg)


def test_rework_grows_with_distance_to_last_checkpoint() -> None:
    base = run_silent(RunConfig(workload="mlr", seed=2, checkpoint_every=50))
    rework = [_cr(at).iterations_to_target - base.iterations_to_target
              for at in (205, 230, 249)]
    assert rework[0] < rework[1] < rework[2]
    # Batches replay exactly after the rewind, so rework is the distance itself (to the
    # evaluation granularity of 5 iterations).
    assert [abs(r - d) <= 5 for r, d in zip(rework, (5, 30, 49))] == [True] * 3


def test_failure_during_recovery_is_recovered_too() -> None:
    s = run_silent(RunConfig(
        workload="mlr", strategy="checkpoint-restart", checkpoint_every=50, seed=0,
        failures=["shards=0@iter=230", "shards=1@iter=230,phase=recovery"]))
    assert s.failures == 2 and len(s.recoveries) == 1
    assert sorted(s.recoveries[0].failed) == ["shard0", "shard1"]
    assert s.recoveries[0].recovery_seconds >= 2 * (1.0 + 5.0)
    assert s.converged


def test_worker_failure_restarts_the_worker_and_rolls_back_under_checkpoint_restart() -> None:
    s = run_silent(RunConfig(workload="mlr", strategy="checkpoint-restart", checkpoint_every=50,
                             failures=["worker=2@iter=120"]))
    assert s.converged and s.recoveries[0].restored_from == 100
    assert s.updates_lost == 20 * 4


def test_several_failures_and_mtbf() -> None:
    s = run_silent(RunConfig(workload="mlr", strategy="checkpoint-restart", checkpoint_every=50,
                             failures=["shard=any@mtbf=150iter,max=3"]))
    assert s.failures == 3 and s.converged


def test_ssp_converges_and_differs_from_bsp() -> None:
    ssp = run_silent(RunConfig(workload="mlr", consistency="ssp", staleness=2, seed=0))
    bsp = run_silent(RunConfig(workload="mlr", seed=0))
    assert ssp.converged and ssp.iterations_to_target != bsp.iterations_to_target


@pytest.mark.parametrize("persist", ["sync", "async"])
def test_checkpoint_blocking_sync_vs_async(persist: str) -> None:
    cfg = RunConfig(workload="mlr", strategy=f"base=checkpoint-restart,persist={persist}",
                    checkpoint_every=50, max_iterations=200, stop_at_target=False,
                    cost=RunConfig().cost.__class__(storage_bandwidth=1e5))
    s = run_silent(cfg)
    assert s.checkpoints == 4 or (persist == "async" and s.checkpoints == 3)
    per = s.checkpoint_blocked_seconds / max(1, s.checkpoints)
    if persist == "sync":
        assert per > 0.02  # ~2.6 kB of tensors at 100 kB/s
    else:
        assert per < 0.01


def test_async_checkpoint_in_flight_at_failure_is_not_used() -> None:
    # Storage so slow that the persist begun at 200 is still in flight at 201: a full
    # save (~13.6 kB) takes ~7 simulated seconds, about 50 iterations, so the one begun
    # at 100 is done. (At 1 kB/s it took ~13.5 s, within 0.1 s of 100 iterations: 160
    # more bytes, the shards' pushes held per worker, left it in flight too.)
    cfg = RunConfig(workload="mlr", strategy="base=checkpoint-restart,persist=async",
                    checkpoint_every=100, failures=["shards=0@iter=201"],
                    cost=RunConfig().cost.__class__(storage_bandwidth=2e3))
    s = run_silent(cfg)
    assert s.recoveries[0].restored_from == 100


def test_run_folder_refuses_to_overwrite(tmp_path: Path) -> None:
    from trainthrough.errors import UserError

    out = tmp_path / "r"
    run(RunConfig(workload="mlr", max_iterations=10), out)
    with pytest.raises(UserError, match="already exists"):
        run(RunConfig(workload="mlr", max_iterations=10), out)
