"""The sim engine models the failure kinds beside a crash, for data parallel, on its
virtual clock: a preemption notice (a drain at the step boundary, or a crash once the
notice runs out), a pause (charged, or a fenced loss past the collective timeout), a
partition (the same to the group; the cut-off ranks' report after the heal refused) and
a slow rank (its compute F times over; dropped at ``straggler_deadline``).

Quick tier: sim runs in this process. The agreement with gloo is the last test (slow).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainthrough.config import CostModel, RunConfig
from trainthrough.errors import Preempted
from trainthrough.lab.runner import run
from trainthrough.workloads.mlr import MLR

# mlr computes a step in 2 ms (simulated); a few replacements' worth of time is short.
COMPUTE = MLR.step_seconds


def _run(tmp: Path, name: str, **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    base: dict[str, Any] = dict(paradigm="dp", engine="sim", workload="mlr", ranks=3,
                                strategy="rollback", seed=1, eval_every=5)
    cfg = RunConfig(**{**base, **kw})
    out = tmp / name
    r = run(cfg, out).result
    return r, [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def test_a_notice_drains_the_rank_at_the_step_boundary_and_the_group_grows_back(
        tmp_path: Path) -> None:
    r, ev = _run(tmp_path, "p", failures=["rank=1@iter=8,mode=preempt:10s"],
                 stop_at_target=False, max_iterations=60,
                 cost=CostModel(replace_seconds=0.05))
    notice, = _of(ev, "preempt-notice")
    assert (notice["slot"], notice["logical"], notice["notice_seconds"]) == (1, 8, 10.0)
    drained, = _of(ev, "drained")
    # It trained the step it got its notice before (8) and left after it: no rollback.
    assert drained == {**drained, "slots": [1], "logical": 9, "ranks": [0, 2]}
    joined, = _of(ev, "rank-joined")
    assert joined["ranks"] == [0, 1, 2]
    types = [e["type"] for e in ev]
    assert not {"detection", "reform", "recovery", "preempt-expired"} & set(types)
    assert r.failures == 1 and r.recoveries == []
    assert r.iterations == r.extras["logical_iterations"], "a step was executed twice"
    assert (r.extras["ranks_min"], r.extras["ranks_final"], r.extras["ranks_drained"]) == (2, 3, 1)


def test_a_notice_shorter_than_the_step_expires_into_a_crash(tmp_path: Path) -> None:
    """The notice comes a third into the compute (``phase=forward``) and lasts 0.1 ms:
    the rank is still computing when it runs out, so it is SIGKILLed there and its
    loss recovered like a crash (rollback: the step redone without it)."""
    r, ev = _run(tmp_path, "x", failures=["rank=1@iter=8,phase=forward,mode=preempt:0.1ms"],
                 stop_at_target=False, max_iterations=30)
    expired, = _of(ev, "preempt-expired")
    assert expired["slot"] == 1 and expired["notice_seconds"] == 1e-4
    assert not _of(ev, "drained")
    assert [x.failed for x in r.recoveries] == [["rank1"]]
    assert r.recoveries[0].action == "mini-batch-rollback"
    assert r.iterations == r.extras["logical_iterations"] + 1  # the struck step, redone


def test_every_rank_with_a_notice_stops_the_job_with_a_just_in_time_checkpoint(
        tmp_path: Path) -> None:
    with pytest.raises(Preempted):
        _run(tmp_path, "all", strategy="checkpoint-restart", checkpoint_every=100,
             failures=["rank=all@iter=6,mode=preempt:10s"], stop_at_target=False,
             max_iterations=60)
    ev = [json.loads(x) for x in (tmp_path / "all" / "events.jsonl").read_text().splitlines()]
    saved = [e for e in _of(ev, "checkpoint") if e.get("why") == "preempt"]
    job, = _of(ev, "job-preempted")
    assert [e["iteration"] for e in saved] == [7] and job["saved"] == job["logical"] == 7
    assert not _of(ev, "drained")


def test_a_short_pause_costs_its_duration_and_nothing_else(tmp_path: Path) -> None:
    common: dict[str, Any] = dict(stop_at_target=False, max_iterations=30)
    free, _ = _run(tmp_path, "free", **common)
    r, ev = _run(tmp_path, "pause", failures=["rank=1@iter=8,mode=pause:3s"], **common)
    assert r.sim_seconds == pytest.approx(free.sim_seconds + 3.0, abs=1e-9)
    assert r.final_metric == free.final_metric and r.recoveries == []
    end, = _of(ev, "pause-ended")
    assert (end["slot"], end["inc"], end["member"]) == (1, 0, True)
    assert not _of(ev, "rank-fenced")


def test_a_pause_past_the_collective_timeout_is_a_fenced_loss_and_the_woken_rank_leaves(
        tmp_path: Path) -> None:
    # 0.2 s steps, so the 12 s pause ends while the run goes on.
    r, ev = _run(tmp_path, "long", failures=["rank=1@iter=5,mode=pause:12s"],
                 stop_at_target=False, max_iterations=100,
                 cost=CostModel(compute_scale=100, timeout_seconds=10, replace_seconds=5))
    fail, = _of(ev, "failure")
    fenced, = _of(ev, "rank-fenced")
    assert (fenced["slot"], fenced["inc"], fenced["reason"]) == (1, 0, "no-report")
    # Found at the collective timeout after the pause began.
    assert fenced["sim_seconds"] == pytest.approx(fail["sim_seconds"] + 10.0)
    assert [x.failed for x in r.recoveries] == [["rank1"]]
    joined, = _of(ev, "rank-joined")
    end, = _of(ev, "pause-ended")
    # The paused incarnation (0) wakes after its slot was taken by a new one: out.
    assert (end["slot"], end["inc"], end["member"]) == (1, 0, False)
    assert joined["sim_seconds"] < end["sim_seconds"]
    assert end["sim_seconds"] >= fail["sim_seconds"] + 12.0


@pytest.mark.parametrize("mode,back", [("pause", "pause-ended"),
                                       ("partition", "partition-healed")])
def test_two_ranks_away_shorter_than_the_timeout_are_waited_out_once(
        tmp_path: Path, mode: str, back: str) -> None:
    """The ranks of one spec are away together (stopped, or cut off): the group waits
    3 s once, not 3 s per rank, and nothing else happens."""
    common: dict[str, Any] = dict(stop_at_target=False, max_iterations=30)
    free, _ = _run(tmp_path, "free", **common)
    r, ev = _run(tmp_path, mode, failures=[f"ranks=1,2@iter=8,mode={mode}:3s"], **common)
    assert r.sim_seconds == pytest.approx(free.sim_seconds + 3.0, abs=1e-9)
    assert r.final_metric == free.final_metric and r.recoveries == []
    assert [(e["slot"], e["member"]) for e in _of(ev, back)] == [(1, True), (2, True)]
    assert not _of(ev, "rank-fenced") and not _of(ev, "write-refused")
    assert r.extras["writes_refused"] == 0


def test_ranks_cut_off_past_the_timeout_are_fenced_replaced_and_refused_after_the_heal(
        tmp_path: Path) -> None:
    """Two of four ranks cut off 12 s (timeout 10 s): the controller's side (ranks 0,
    3) goes on by rollback, the cut-off ranks are fenced at the timeout and replaced;
    when the cut heals each reports the step it was in, refused, and leaves."""
    r, ev = _run(tmp_path, "cut", failures=["ranks=1,2@iter=5,mode=partition:12s"],
                 ranks=4, stop_at_target=False, max_iterations=100,
                 cost=CostModel(compute_scale=100, timeout_seconds=10, replace_seconds=5))
    fail, = _of(ev, "failure")
    fenced = _of(ev, "rank-fenced")
    assert sorted((e["slot"], e["inc"], e["reason"]) for e in fenced) == [
        (1, 0, "no-report"), (2, 0, "no-report")]
    assert all(e["sim_seconds"] == pytest.approx(fail["sim_seconds"] + 10.0) for e in fenced)
    reform, = _of(ev, "reform")
    assert reform["ranks"] == [0, 3]  # the controller's side went on alone
    assert [sorted(x.failed) for x in r.recoveries] == [["rank1", "rank2"]]
    refused = _of(ev, "write-refused")
    healed = _of(ev, "partition-healed")
    assert sorted((e["slot"], e["inc"], e["message"]) for e in refused) == [
        (1, 0, "report"), (2, 0, "report")]
    assert sorted((e["slot"], e["inc"], e["member"]) for e in healed) == [
        (1, 0, False), (2, 0, False)]
    assert all(e["sim_seconds"] >= fail["sim_seconds"] + 12.0 for e in healed + refused)
    assert r.extras["writes_refused"] == 2
    # Grown back: the replacements joined (before the heal: 5 s after the reform).
    assert r.extras["ranks_final"] == 4 and r.extras["ranks_min"] == 2
    assert max(e["sim_seconds"] for e in _of(ev, "rank-joined")) < min(
        e["sim_seconds"] for e in healed)


def test_a_slow_rank_makes_every_step_wait_for_it(tmp_path: Path) -> None:
    common: dict[str, Any] = dict(stop_at_target=False, max_iterations=30)
    free, _ = _run(tmp_path, "free", **common)
    r, ev = _run(tmp_path, "slow", failures=["rank=1@iter=10,mode=slow:4x"], **common)
    # Steps 10..29 each wait (4 - 1) times the rank's compute; nothing else changes.
    assert r.sim_seconds == pytest.approx(free.sim_seconds + 20 * 3 * COMPUTE)
    assert r.final_metric == free.final_metric and r.failures == 1 and r.recoveries == []


def test_the_straggler_deadline_drops_the_slow_rank_and_a_full_speed_one_replaces_it(
        tmp_path: Path) -> None:
    """Deadline 5 ms, mlr's compute 2 ms a step: a rank 50 times slower comes 98 ms
    late, is dropped at the deadline, replaced, and the run reaches its target sooner
    than when the group waits for it; one 3 times slower (4 ms late) makes it."""
    spec = "rank=1@iter=10,mode=slow:{}x"
    common: dict[str, Any] = dict(target=0.9, max_iterations=3000,
                                  cost=CostModel(replace_seconds=0.01, reform_seconds=0.05))
    waits, _ = _run(tmp_path, "waits", failures=[spec.format(50)], **common)
    r, ev = _run(tmp_path, "drops", failures=[spec.format(50)], straggler_deadline=0.005,
                 **common)
    fenced, = _of(ev, "rank-fenced")
    assert (fenced["slot"], fenced["inc"], fenced["reason"]) == (1, 0, "straggler")
    assert [x.failed for x in r.recoveries] == [["rank1"]]
    assert _of(ev, "rank-joined")[0]["ranks"] == [0, 1, 2]
    assert r.converged and waits.converged and r.sim_seconds < waits.sim_seconds
    kept, ev3 = _run(tmp_path, "kept", failures=[spec.format(3)], straggler_deadline=0.005,
                     **common)
    assert not _of(ev3, "rank-fenced") and kept.recoveries == []


@pytest.mark.timeout(180)
def test_sim_and_gloo_agree_on_a_preemption(tmp_path: Path) -> None:
    """The same spec on both engines: one failure counted, no recovery, no step redone,
    and the same history of the group's size (drained to [0, 2], grown back to [0, 1, 2])."""
    from tests.test_dist import Watch, _engine

    spec = ["rank=1@iter=8,mode=preempt:10s"]
    cb = Watch(lambda w: bool(w.of("rank-joined")) and w.evals[-1]["ranks"] == 3)
    g = _engine(tmp_path / "gloo", cb, strategy="rollback", ranks=3, stop_at_target=False,
                max_iterations=4000, wall_limit=120, recovery_delay=0.1, eval_every=5,
                cost=CostModel(timeout_seconds=3), failures=spec).run()
    s, ev = _run(tmp_path, "sim", failures=spec, stop_at_target=False,
                 max_iterations=60, cost=CostModel(replace_seconds=0.05))

    def history(events: list[dict[str, Any]]) -> list[tuple[str, list[int], list[int]]]:
        return [(e["type"], e["slots"], e["ranks"]) for e in events
                if e["type"] in ("drained", "rank-joined")]

    assert history(cb.events) == history(ev) == [("drained", [1], [0, 2]),
                                                 ("rank-joined", [1], [0, 1, 2])]
    for r, events in ((g, cb.events), (s, ev)):
        assert r.failures == 1 and r.recoveries == []
        assert r.iterations == r.extras["logical_iterations"], (r.engine, "a step redone")
        assert not {"detection", "recovery", "preempt-expired"} & {e["type"] for e in events}


def test_the_straggler_suite_is_small_and_valid() -> None:
    from trainthrough.lab.suites import build_suite
    from trainthrough.lab.validate import validate_run

    spec = build_suite("stragglers", quick=True)
    assert len(spec.runs) == 5  # failure-free, 2 factors x (no deadline, 1 s)
    for r in spec.runs:
        validate_run(r.config)
    assert {(r.labels["slow_factor"], r.labels["deadline"]) for r in spec.runs} == {
        (1.0, "-"), (2.0, "waits"), (2.0, "1s"), (8.0, "waits"), (8.0, "1s")}
