"""``benchmarks/scale.py`` without its runs: the figures it reads from a run's records,
the table's targets on fixed inputs, and the arguments it refuses (no process)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _scale_table as table  # noqa: E402
import scale  # noqa: E402
from _scale_table import Run  # noqa: E402

STEPS = 24


def _recovered(strategy: str, loss: float, rss: int = 700 * 2**20) -> Run:
    """A run of STEPS steps where rank 0 died at 10.0 s and the group committed again
    at 11.5 s; a replacement joined (rollback, lossy) or a checkpoint was restored."""
    events: list[dict[str, Any]] = [
        {"type": "checkpoint", "bytes": 100_000_000, "blocked_seconds": 0.5, "wall_seconds": 5.0},
        {"type": "checkpoint", "bytes": 100_000_000, "blocked_seconds": 0.3, "wall_seconds": 8.0},
        {"type": "failure", "ids": [0], "wall_seconds": 10.0},
        {"type": "detection", "iteration": 9, "failed": ["rank0"], "wall_seconds": 10.1},
        {"type": "training-resumed", "iteration": 9, "wall_seconds": 11.5},
        {"type": "training-resumed", "iteration": 15, "wall_seconds": 20.0},
    ]
    joined = strategy != "checkpoint-restart"
    if joined:
        events.append({"type": "rank-joined", "bytes": 120_000_000, "transfer_seconds": 0.4,
                       "join_seconds": 0.9, "wall_seconds": 14.0})
    action = table.ACTIONS[strategy]
    summary = {"failures": 1, "replicas_identical": True, "logical_iterations": STEPS,
               "ranks_joined": int(joined), "peak_rss_bytes": [rss, rss - 1],
               "restart_seconds": [] if joined else [1.2],
               "recoveries": [{"action": action, "recovery_seconds": 1.4,
                               "restored_from": None if joined else 8}]}
    return Run(True, "", 30.0, summary, {"loss": loss}, events)


def _figures(**over: Any) -> dict[str, Any]:
    free = {"steps_per_s": 1.0, "peak_rss": 700 * 2**20, "loss": 4.0}
    fig = {"ours": [dict(free), {**free, "steps_per_s": 0.98}],
           "ddp": [{"steps_per_s": 1.02, "peak_rss": 650 * 2**20},
                   {"steps_per_s": 1.0, "peak_rss": 640 * 2**20}],
           "kills": {"rollback": table.kill_figures(_recovered("rollback", 4.00001), "rollback",
                                                    STEPS),
                     "lossy-forward": table.kill_figures(_recovered("lossy-forward", 4.1),
                                                         "lossy-forward", STEPS),
                     "checkpoint-restart": table.kill_figures(
                         _recovered("checkpoint-restart", 4.0), "checkpoint-restart", STEPS)},
           "bcast": {"bytes": 120_000_000, "seconds": 0.3},
           "disk": {"bytes": 100_000_000, "seconds": 0.35}}
    fig.update(over)
    return fig


def _by_check(rows: list[table.Row]) -> dict[str, table.Row]:
    return {r.check: r for r in rows}


def test_a_recovered_runs_figures_come_from_its_records() -> None:
    k = table.kill_figures(_recovered("rollback", 4.0), "rollback", STEPS)
    assert k["problems"] == []
    assert k["stall"] == pytest.approx(1.5)  # the failure to the next committed step
    assert k["join"] == {"bytes": 120_000_000, "seconds": 0.4, "join_seconds": 0.9}
    assert k["checkpoint"] == {"bytes": 100_000_000, "seconds": pytest.approx(0.4), "saves": 2}
    assert k["peak_rss"] == 700 * 2**20 and k["loss"] == 4.0


def test_what_makes_a_recovery_incomplete() -> None:
    crashed = table.kill_figures(Run(False, "exit code 1: Invalid payload size"), "rollback",
                                 STEPS)
    assert crashed["problems"] == ["exit code 1: Invalid payload size"]
    short = _recovered("checkpoint-restart", 4.0)
    short.summary.update(logical_iterations=0, recoveries=[], replicas_identical=False)
    problems = table.kill_figures(short, "checkpoint-restart", STEPS)["problems"]
    assert len(problems) == 3 and "0 steps committed, not 24" in problems[2]
    alone = _recovered("lossy-forward", 4.0)
    alone.summary["ranks_joined"] = 0
    assert table.kill_figures(alone, "lossy-forward", STEPS)["problems"] == [
        "no replacement joined before the end"]


def test_every_target_on_fixed_figures() -> None:
    rows = _by_check(table.rows("124M", _figures()))
    free = rows["failure-free steps/s"]
    assert free.ratio == "0.98x" and free.result == "PASS"  # medians 0.99 / 1.01
    assert rows["peak RSS per rank, failure-free"].result == "PASS"  # 700 / 645 MiB
    assert rows["kill, rollback: recovery completes (defaults)"].result == "PASS"
    assert rows["kill, rollback: stall, death to next commit"].result == "PASS"  # 1.5 <= 1.01 + 1
    assert rows["kill, rollback: final loss"].result == "PASS"  # 2.5e-6 relative
    assert rows["kill, lossy-forward: final loss"].result == "info"  # no target
    assert rows["kill, checkpoint-restart: final loss"].result == "PASS"  # equal
    transfer = rows["kill, rollback: joiner state transfer"]
    assert transfer.ratio == "75%" and transfer.result == "PASS"  # 300 MB/s vs 400 MB/s
    write = rows["checkpoint write (blocked: copy + write)"]
    assert write.ratio == "88%" and write.result == "PASS"  # 250 vs 286 MB/s, at 124M
    assert not table.missed(list(rows.values()))


def test_misses_are_marked_and_the_write_counts_at_124m_only() -> None:
    fig = _figures(ours=[{"steps_per_s": 0.9, "peak_rss": 800 * 2**20, "loss": 4.0}],
                   disk={"bytes": 100_000_000, "seconds": 0.1})
    fig["kills"]["checkpoint-restart"]["loss"] = 4.0000001
    fig["kills"]["rollback"]["stall"] = 2.2  # one step is 1.11 s
    rows = _by_check(table.rows("124M", fig))
    missed = {r.check for r in table.missed(list(rows.values()))}
    assert missed == {"failure-free steps/s", "peak RSS per rank, failure-free",
                      "kill, rollback: stall, death to next commit",
                      "kill, checkpoint-restart: final loss",
                      "checkpoint write (blocked: copy + write)"}
    small = _by_check(table.rows("10M", fig))["checkpoint write (blocked: copy + write)"]
    assert small.result == "info" and "(at 124M)" in small.target


def test_a_crashed_size_is_a_miss_with_the_ranks_error() -> None:
    error = "exit code 1: Invalid payload size. size: 39615304, max: 8388608"
    crashed = {"steps_per_s": None, "peak_rss": None, "loss": None, "error": error}
    fig = _figures(ours=[crashed], kills={"rollback": table.kill_figures(
        Run(False, error), "rollback", STEPS)}, bcast=None, disk=None)
    rows = table.rows("10M", fig)
    assert rows[0].result == "MISS" and error in rows[0].ours
    assert [r.check for r in rows[2:]] == ["kill, rollback: recovery completes (defaults)"]
    assert rows[2].result == "MISS" and rows[2].ours == error
    text = table.render("10M", rows)
    assert text.count("MISS") == 3 and text.startswith("### 10M")


@pytest.mark.parametrize("argv, says", [
    (["--sizes", "7M"], "unknown size '7M'"),
    (["--workload", "x.py:build", "--sizes", "10M"], "drop --sizes"),
    (["--steps", "5"], "--steps at least 10"),
    (["--workload", "x.py:build", "--device", "cuda"], "trains on the CPU"),
])
def test_bad_arguments_are_refused_in_one_line(argv: list[str], says: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        scale.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_cuda_is_honoured_or_refused(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert scale.main(["--device", "cuda", "--quick"]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_a_workloads_run_executes_what_its_recovery_redoes() -> None:
    # 24 steps, the kill at attempt 9, saves every 4 steps (the last at 8)
    assert scale.executed("lossy-forward", 24, 9, 4) == 24  # the step completes
    assert scale.executed("rollback", 24, 9, 4) == 25  # the interrupted step again
    assert scale.executed("checkpoint-restart", 24, 9, 4) == 26  # step 9 and the interrupted
    assert scale.executed("checkpoint-restart", 24, 8, 4) == 25  # saved right before it


def test_a_group_broken_with_nobody_lost_is_not_a_clean_recovery() -> None:
    run = _recovered("rollback", 4.0)
    run.events.insert(0, {"type": "detection", "iteration": 2, "failed": [],
                          "survivors": [0, 1], "wall_seconds": 3.0})
    problems = table.kill_figures(run, "rollback", STEPS)["problems"]
    assert problems == ["1 time(s) the group broke with every rank alive (a collective "
                        "timed out), first at step 2"]
    assert table.unplanned(run.events, 0).startswith("rank0 lost at step 9 and nobody")
