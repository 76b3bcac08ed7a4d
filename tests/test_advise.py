"""`trainthrough advise`: its model, its candidates, its command, and its predictions
against runs on a seeded failure trace (sim; Ray: benchmarks/advise_check.py).

Seconds are the sim engine's simulated seconds throughout (engines/sim/clock.py).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.errors import UserError
from trainthrough.faults.spec import parse_one
from trainthrough.ft import strategy as strategy_module
from trainthrough.ft.strategy import PRESETS, Strategy
from trainthrough.lab.advise import Advice, advise, trace_spec
from trainthrough.lab.advise.advisor import recovery_overlap
from trainthrough.lab.advise.calibrate import (
    EXACT_FAILURE_RUNS,
    REAL_FAILURE_RUNS,
    calibration_failure,
    failure_plan,
    failure_point,
    measure,
    pool_refill,
)
from trainthrough.lab.advise.candidates import candidates
from trainthrough.lab.advise.check import Check, check, failure_free, steady_from_steps
from trainthrough.lab.advise.model import (
    Baseline,
    Measured,
    costing,
    interval,
    outage,
    predict,
    rank,
)
from trainthrough.lab.advise.report import table_text, verdict
from trainthrough.lab.advise.wall import (
    StepClock,
    failure_cost,
    phase_cost,
    refill_delay,
    save_cost,
    spare_share,
)
from trainthrough.lab.runner import run_silent

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "advise.toml"


# -- the model: arithmetic that can be checked by hand ---------------------------------
def test_prediction_is_the_renewal_model_at_young_daly() -> None:
    base = Baseline("none", iterations=100, seconds=10.0)
    m = Measured("x", interval=20, checkpoint_seconds=0.2, steady=0.1, failed_at=(50,),
                 recovery_seconds=1.0, rework=10)
    p = predict(base, m, "x", mtbf=5.0, nodes=8)
    # 1 - exp(-R/MTBF) of the failures strike while recovering and cost no rework.
    lost = 1.0 + math.exp(-1.0 / 5.0) * 10 * 0.1 * 1.1
    assert p.per_failure_seconds == pytest.approx(lost)
    assert p.seconds_to_target == pytest.approx(10.0 * 1.1 / (1 - lost / 5.0))
    assert p.failures == pytest.approx(p.seconds_to_target / 5.0)
    assert p.overhead == pytest.approx(p.seconds_to_target / 10.0 - 1)
    assert p.cost_on_demand == pytest.approx(8 * p.seconds_to_target / 3600 * 0.10)


def _union_outage_per_failure(recovery: float, mtbf: float, n: int, seed: int) -> float:
    """Monte Carlo: ``n`` Poisson failures ``mtbf`` apart on average, each out for
    ``recovery`` from its strike, side by side: the time covered by any, per failure."""
    rng = random.Random(seed)
    t, end, covered = 0.0, 0.0, 0.0
    for _ in range(n):
        t += rng.expovariate(1 / mtbf)
        covered += t + recovery - max(t, end)  # the part past the outage already running
        end = t + recovery
    return covered / n


@pytest.mark.parametrize(("recovery", "mtbf"), [(1.0, 3.0), (1.2, 3.0), (4.0, 2.0)])
def test_overlapping_recoveries_add_mtbf_times_one_minus_exp(recovery: float, mtbf: float
                                                             ) -> None:
    expected = mtbf * (1 - math.exp(-recovery / mtbf))
    assert outage(recovery, mtbf, "parallel") == pytest.approx(expected)
    assert _union_outage_per_failure(recovery, mtbf, 200_000, 7) == pytest.approx(expected,
                                                                                  rel=0.01)
    assert outage(recovery, mtbf, "queue") == recovery  # queued: each its whole R


def _batched(recovery: float, mtbf: float, n: int, seed: int) -> tuple[float, float]:
    """Monte Carlo of Ray's bulk-synchronous rounds: a failure due during a recovery
    waits for its end; all waiting then strike together and recover in one recovery
    more. (outage per failure, share of failures striking a running engine)."""
    rng = random.Random(seed)
    t, end, covered, running = 0.0, 0.0, 0.0, 0
    waiting = False
    for _ in range(n):
        t += rng.expovariate(1 / mtbf)
        while waiting and t >= end:  # the held-back batch strikes at the end
            covered += recovery
            end += recovery
            waiting = False
            if t < end:
                waiting = True
        if t < end:
            waiting = True  # held back (or joins the batch already held)
            continue
        running += 1
        covered += recovery
        end = t + recovery
    if waiting:
        covered += recovery
    return covered / n, running / n


@pytest.mark.parametrize(("recovery", "mtbf"), [(1.0, 3.0), (1.25, 3.0), (4.0, 2.0)])
def test_held_back_failures_recover_together(recovery: float, mtbf: float) -> None:
    x = recovery / mtbf
    down, share = _batched(recovery, mtbf, 200_000, 11)
    assert outage(recovery, mtbf, "batch") == pytest.approx(
        recovery * math.exp(x) / (1 + x * math.exp(x)))
    assert outage(recovery, mtbf, "batch") == pytest.approx(down, rel=0.01)
    assert costing(recovery, mtbf, "batch") == pytest.approx(share, rel=0.01)
    # Between side by side from the strike and one after another.
    assert outage(recovery, mtbf, "parallel") < down < recovery
    assert costing(recovery, mtbf, "queue") == costing(recovery, mtbf, "parallel") \
        == pytest.approx(math.exp(-x))
    with pytest.raises(ValueError, match="overlap"):
        outage(recovery, mtbf, "sideways")


def test_overlapping_recovery_by_hand() -> None:
    # R = 1 s, MTBF = 3 s: 3 (1 - e^(-1/3)) = 0.8504 s; the 28.3% striking during a
    # recovery add E[g | g < 1] = 3 - e^(-1/3) / (1 - e^(-1/3)) = 0.4723 s each, the rest 1 s.
    during = 1 - math.exp(-1 / 3)
    assert during == pytest.approx(0.28347, abs=1e-5)
    assert (1 - during) * 1.0 + during * 0.47227 == pytest.approx(0.85041, abs=1e-4)
    assert outage(1.0, 3.0, "parallel") == pytest.approx(0.85041, abs=1e-5)


def test_parallel_recovery_lowers_the_prediction_by_the_overlap_only() -> None:
    base = Baseline("none", iterations=100, seconds=10.0)
    m = Measured("x", interval=20, checkpoint_seconds=0.2, steady=0.1, failed_at=(50,),
                 recovery_seconds=1.0, rework=10)
    serial = predict(base, m, "x", mtbf=5.0, nodes=8)
    assert serial == predict(base, m, "x", mtbf=5.0, nodes=8, overlap="queue")  # sim's
    side = predict(base, m, "x", mtbf=5.0, nodes=8, overlap="parallel")
    # The same rework (the same failures strike outside a recovery); the outage each adds
    # is 5 (1 - e^(-1/5)) = 0.9063 s, not 1 s.
    gain = 1.0 - 5.0 * (1 - math.exp(-1.0 / 5.0))
    assert gain == pytest.approx(0.09365, abs=1e-5)
    assert side.recovery_seconds == serial.recovery_seconds == 1.0
    assert serial.per_failure_seconds is not None and side.per_failure_seconds is not None
    assert side.per_failure_seconds == pytest.approx(serial.per_failure_seconds - gain)
    assert side.seconds_to_target == pytest.approx(
        10.0 * 1.1 / (1 - side.per_failure_seconds / 5.0))
    assert side.seconds_to_target < serial.seconds_to_target
    # Recoveries longer than an MTBF stop progress only if they queue.
    slow = Measured("slow", None, recovery_seconds=6.0, rework=0)
    assert math.isinf(predict(base, slow, "slow", 5.0, 4).seconds_to_target)
    assert math.isfinite(predict(base, slow, "slow", 5.0, 4, overlap="parallel")
                         .seconds_to_target)


def test_recovery_overlap_is_the_engines_claim_and_survives_json() -> None:
    assert recovery_overlap("ray", "ps", "async") == "parallel"
    assert recovery_overlap("sim", "ps", "bsp") == "queue"
    # Ray's bulk-synchronous rounds deliver failures due during a recovery after it,
    # together.
    assert recovery_overlap("ray", "ps", "bsp") == "batch"
    a = advise(RunConfig.from_toml(EXAMPLE), trace_spec("ps", "3s", None),
               only=["none", "checkpoint-restart"])
    assert a.recovery_overlap == "queue"  # sim recovers one at a time
    d = a.to_dict()
    assert Advice.from_dict(json.loads(json.dumps(d))).recovery_overlap == "queue"
    # Advice saved before the fact was recorded takes its engine's claim, also over the
    # yes-or-no recorded before (Ray bsp said False: queued, which it is not).
    old = {k: v for k, v in d.items() if k != "recovery_overlap"}
    ray_async = {**old, "engine": "ray", "config": {**old["config"], "consistency": "async"}}
    assert Advice.from_dict(ray_async).recovery_overlap == "parallel"
    assert Advice.from_dict({**old, "engine": "ray"}).recovery_overlap == "batch"
    assert Advice.from_dict({**old, "engine": "ray", "parallel_recovery": False}
                            ).recovery_overlap == "batch"
    assert Advice.from_dict(old).recovery_overlap == "queue"
    # Every calibration failure run's iteration is kept (the costs are their mean), and
    # advice saved when only the first was kept (an int, or null) still loads.
    m = next(x for x in a.measured if x.name == "checkpoint-restart")
    assert m.failed_at and all(isinstance(i, int) for i in m.failed_at)
    again = Advice.from_dict(json.loads(json.dumps(d)))
    assert [x.failed_at for x in again.measured] == [x.failed_at for x in a.measured]
    for stored, want in ((m.failed_at[0], m.failed_at[:1]), (None, ())):
        one = {**d, "measured": [{**x, "failed_at": stored} for x in d["measured"]]}
        assert all(x.failed_at == want for x in Advice.from_dict(one).measured)


def test_a_failure_costing_an_mtbf_is_no_progress_and_ranks_last() -> None:
    base = Baseline("none", iterations=100, seconds=10.0)
    slow = predict(base, Measured("slow", None, recovery_seconds=6.0, rework=0), "slow", 5.0, 4)
    lost = predict(base, Measured("lost", None, recovery_seconds=1.0, rework=None), "lost",
                   5.0, 4)
    ok = predict(base, Measured("ok", None, recovery_seconds=1.0, rework=5), "ok", 5.0, 4)
    assert math.isinf(slow.seconds_to_target) and math.isinf(lost.seconds_to_target)
    assert [p.name for p in rank([slow, lost, ok])][0] == "ok"


def test_rank_by_cost_weighs_nodes() -> None:
    base = Baseline("none", iterations=100, seconds=10.0)
    fast_big = predict(base, Measured("chain", None, recovery_seconds=0.1, rework=0), "chain",
                       5.0, nodes=12)
    slow_small = predict(base, Measured("ckpt", 10, steady=0.05, recovery_seconds=1.0,
                                        rework=5), "ckpt", 5.0, nodes=8)
    assert [p.name for p in rank([slow_small, fast_big], "time")] == ["chain", "ckpt"]
    assert [p.name for p in rank([fast_big, slow_small], "cost")] == ["ckpt", "chain"]


def test_interval_is_young_daly_in_iterations_and_at_least_one_write() -> None:
    assert interval(0.5, 0.0, 100.0, 0.1, 1000) == 100  # sqrt(2 * 0.5 * 100) = 10 s
    assert interval(1e-6, 0.35, 100.0, 0.1, 1000) == 4  # async: a write takes 3.5 steps
    assert interval(50.0, 0.0, 1e6, 0.1, 300) == 300  # never past the failure-free run


def test_calibration_failure_is_the_traces_own_once() -> None:
    trace = parse_one("shards=50%@mtbf=3s,max=40,mode=crash")
    assert calibration_failure(trace, 120) == "shards=50%@iter=120,mode=crash"
    assert failure_point(682, 43) == 301 + 21  # half way, half an interval after a save
    assert failure_point(682, None) == 341
    assert failure_point(682, 43, 0.125) == 43 + 21 and failure_point(682, None, 0.875) == 596


def test_calibration_failures_are_spread_over_the_run_as_a_traces_are() -> None:
    """A trace's failures strike anywhere; what one costs depends on where (Ray cnn:
    0-23 iterations of rework for the same seed): the calibration's failure runs sit
    at evenly spread points, cycling through the calibration seeds."""
    assert failure_plan(1, 1) == [(0, 0.5)]  # sim, one seed: half way, as before
    assert failure_plan(2, 4) == [(0, 0.125), (1, 0.375), (0, 0.625), (1, 0.875)]
    assert failure_plan(4, 2) == [(0, 0.125), (1, 0.375), (2, 0.625), (3, 0.875)]
    assert EXACT_FAILURE_RUNS == 1 and REAL_FAILURE_RUNS >= 4
    plan = failure_plan(3, REAL_FAILURE_RUNS)
    assert statistics.fmean(w for _, w in plan) == pytest.approx(0.5)  # no side favoured
    assert {k for k, _ in plan} == {0, 1, 2}


def test_measure_makes_one_failure_run_per_planned_point(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """On a real engine the planned points are run, each on its seed's failure-free
    run (rework against that seed's own)."""
    import trainthrough.lab.advise.calibrate as cal

    seen: list[tuple[int, float]] = []

    def fake_one(cfg, c, base, trace, every, say, shape, where):  # noqa: ANN001, ANN202
        seen.append((cfg.seed, where))
        return {"failed_at": 1, "rework": 0.0, "recovery": 0.1, "norm": 0.0, "lost": 1.0,
                "bound": None}

    monkeypatch.setattr(cal, "_one_failure", fake_one)
    monkeypatch.setattr(cal, "back_to_back", lambda *a: None)
    monkeypatch.setattr(cal, "EXACT_FAILURE_RUNS", cal.REAL_FAILURE_RUNS)  # sim as a real one
    cands = candidates("sim", "ps", "bsp", [trace_spec("ps", "3s", None)], ["none"])
    measure(RunConfig.from_toml(EXAMPLE), cands, trace_spec("ps", "3s", None), 3.0,
            lambda _: None, seeds=2)
    assert seen == [(0, 0.125), (1, 0.375), (0, 0.625), (1, 0.875)]


# -- candidates: from PRESETS, filtered by what the engine claims ---------------------
def test_candidates_follow_presets_and_engine_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = [parse_one("shard=any@mtbf=3s")]
    names = [c.name for c in candidates("sim", "ps", "bsp", spec)]
    assert "chain-sync" not in names and "stateless" not in names  # sim does not claim them
    assert "scar-partial" in names and "checkpoint-sync" not in names  # same composition
    ray_async = [c.name for c in candidates("ray", "ps", "async", spec)]
    assert "chain-sync" in ray_async and "stateless" in ray_async
    # A preset added later is weighed without a change to the advisor.
    extra = Strategy("later", "a preset added later", checkpoint="full", persist="async",
                     recovery="rollback-all")
    monkeypatch.setattr(strategy_module, "PRESETS", {**PRESETS, "later": extra})
    monkeypatch.setattr("trainthrough.lab.advise.candidates.PRESETS", strategy_module.PRESETS)
    assert "later" in [c.name for c in candidates("sim", "ps", "bsp", spec)]


def test_trace_spec_needs_one_time_mtbf() -> None:
    assert trace_spec("ps", "30s", None).text == "shard=any@mtbf=30s"
    assert trace_spec("dp", "2min", None).mtbf == 120.0
    for mtbf, fail in ((None, None), ("3s", "shard=any@mtbf=3s"), (None, "shard=1@iter=3"),
                       (None, "shard=any@mtbf=300iter"), (None, "shard=any@mtbf=3s,max=5")):
        with pytest.raises(UserError):
            trace_spec("ps", mtbf, fail)


def test_a_recorded_trace_is_predicted_at_its_rate() -> None:
    """Failures of one kind at times: MTBF = the last one's time / their number (4
    failures by 12 s: one every 3 s), the same spec as ``--mtbf 3s``; the note says how
    far the gaps (2, 3, 1, 6 s) are from random ones (coefficient of variation 1)."""
    said: list[str] = []
    spec = trace_spec("ps", None, "shard=any@time=2s;shard=any@time=5s;shard=any@time=6s;"
                      "shard=any@time=12s", note=said.append)
    assert spec == trace_spec("ps", "3s", None)
    gaps = [2.0, 3.0, 1.0, 6.0]
    cv = statistics.stdev(gaps) / statistics.fmean(gaps)
    assert len(said) == 1 and "every 3 s" in said[0] and f"{cv:.2f}" in said[0]
    # Options and the target carry over; the order of the lines does not matter.
    two = trace_spec("ps", None, "shards=50%@time=9s,mode=hang;shards=50%@time=1s,mode=hang")
    assert two.text == "shards=50%@mtbf=4.5s,mode=hang" and two.mode == "hang"
    # One kind as parsed: "shard=" and "shards=" name the same (the first line's text).
    assert trace_spec("ps", None, "shard=1@time=9s;shards=1@time=1s").text == \
        "shard=1@mtbf=4.5s"
    for bad in ("shard=any@time=2s",  # one failure: no rate
                "shard=any@time=2s;worker=0@time=3s",  # two kinds
                "shard=0@time=2s,mode=hang;shard=0@time=4s",  # two modes
                "shard=any@time=2s;shard=any@iter=5",  # not a time
                "shard=any@time=0s;shard=any@time=0s", ";"):
        with pytest.raises(UserError):
            trace_spec("ps", None, bad)


def test_advise_reads_a_trace_file(cli, tmp_path: Path) -> None:  # noqa: ANN001
    """``--trace FILE``: one failure per line, comments and blank lines skipped; the note
    comes before any run (here the used --out refuses the run)."""
    f = tmp_path / "failures.txt"
    f.write_text("# from the cluster's log\nshard=any@time=2s\n\nshard=any@time=5s  # node 3\n"
                 "shard=any@time=6s\nshard=any@time=12s\n")
    out = tmp_path / "used"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    r = cli("advise", "--config", str(EXAMPLE), "--trace", str(f), "--out", str(out))
    assert r.code == 2 and "not empty" in r.err
    assert "note: the trace's 4 failures (shard=any) up to 12 s" in r.err
    assert "shard=any@mtbf=3s" in r.err and (out / "mine.txt").read_text() == "keep"
    for args in (["--trace", str(tmp_path / "missing.txt")],
                 ["--trace", str(f), "--fail", "shard=any@time=1s;shard=any@time=2s"],
                 ["--trace", str(f), "--mtbf", "3s"], ["--trace", str(tmp_path)]):
        r = cli("advise", "--quiet", "--out", str(tmp_path / "new"), *args)
        lines = [x for x in r.err.splitlines() if x.strip()]
        assert r.code == 2 and len(lines) == 1, (args, r.err)
        assert lines[0].startswith("trainthrough: error: ") and "Traceback" not in r.err
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n")
    r = cli("advise", "--quiet", "--trace", str(empty), "--out", str(tmp_path / "new"))
    assert r.code == 2 and "no failure in it" in r.err


# -- the command ----------------------------------------------------------------------
def test_advise_command_writes_its_folder(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "advice"
    r = cli("advise", "--config", str(EXAMPLE), "--mtbf", "3s", "--quiet",
            "--strategies", "none,checkpoint-restart", "--out", str(out))
    assert r.code == 0, r.err
    assert "Recommended: checkpoint-restart" in r.out and "simulated seconds" in r.out
    data = json.loads((out / "advice.json").read_text())
    assert [p["name"] for p in data["predictions"]] == ["checkpoint-restart", "none"]
    assert data["predictions"][1]["seconds_to_target"] is None  # no progress, not inf
    assert (out / "advice.png").stat().st_size > 0 and "## Why" in (out / "advice.md").read_text()
    again = cli("advise", "--config", str(EXAMPLE), "--mtbf", "3s", "--out", str(out))
    assert again.code == 2 and "not empty" in again.err  # a used folder is never written


def test_advise_takes_a_workload_by_reference(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "advice"
    r = cli("advise", "--workload", str(ROOT / "examples" / "my_model.py") + ":build",
            "--option", "hidden=8", "--mtbf", "20s", "--strategies", "none,scar-partial",
            "--quiet", "--out", str(out))
    assert r.code == 0, r.err
    data = json.loads((out / "advice.json").read_text())
    assert data["workload"].endswith("my_model.py:build") and data["recommended"]
    assert data["config"]["workload_options"] == {"hidden": 8}


@pytest.mark.parametrize("args", [
    [], ["--mtbf", "3s", "--fail", "shard=any@mtbf=3s"], ["--mtbf", "abc"], ["--mtbf", "0s"],
    ["--fail", "shards=1@iter=30"], ["--mtbf", "3s", "--strategies", "bogus"],
    ["--mtbf", "3s", "--strategies", "chain-sync"], ["--mtbf", "3s", "--strategies", ","],
    ["--mtbf", "3s", "--workload", "nope"], ["--mtbf", "3s", "--rank-by", "speed"],
    ["--mtbf", "3s", "--shards", "0"], ["--mtbf", "3s", "--option", "bogus=1"],
    ["--mtbf", "3s", "--engine", "gloo"], ["--fail", "worker=9@mtbf=3s"],
    ["--mtbf", "3s", "--calibration-seeds", "0"],
    # data parallel (measured advice: tests/test_advise_dp.py)
    ["--mtbf", "3s", "--paradigm", "dp", "--rank-by", "cost"],
    ["--paradigm", "dp", "--fail", "shard=any@mtbf=3s"],
    ["--mtbf", "3s", "--paradigm", "dp", "--strategies", "chain-sync"],
    ["--mtbf", "3s", "--paradigm", "dp", "--ranks", "0"],
    ["--mtbf", "3s", "--paradigm", "dp", "--sync-every", "0"],
    ["--paradigm", "dp", "--fail", "rank=9@mtbf=3s"],
])
def test_advise_bad_input_exits_2_with_one_line(args: list[str], cli, tmp_path: Path  # noqa: ANN001
                                                ) -> None:
    out = tmp_path / "advice"
    r = cli("advise", "--quiet", "--out", str(out), *args)
    assert r.code == 2, (args, r.err)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainthrough: error: "), (args, r.err)
    assert "Traceback" not in r.out + r.err and not out.exists()


# -- predictions against measurement ---------------------------------------------------
@pytest.mark.timeout(400)
def test_mlr_prediction_within_20_percent_of_the_seeded_trace() -> None:
    """The recommended strategy, at the advisor's interval, on 16 seeds of the trace
    (seeds 0-15, fixed before looking: the failure count is Poisson, so fewer seeds
    leave the mean time to target ~1/sqrt(16 x 8) = 9% noisy). The runner-up is the
    same model on another candidate: ``benchmarks/advise_check.py`` checks it (and cnn,
    and Ray); here it would double the suite's longest test."""
    a = advise(RunConfig.from_toml(EXAMPLE), trace_spec("ps", "3s", None))
    assert a.clock == "simulated seconds"
    assert a.recommended.seconds_to_target <= a.runner_up.seconds_to_target  # type: ignore[union-attr]
    # Through JSON (advice.json, advise_check --save/--advice) and back, infinities too.
    again = Advice.from_dict(json.loads(json.dumps(a.to_dict())))
    assert again.to_dict() == a.to_dict() and again.predictions == a.predictions
    # Two at a time: sim's results do not depend on it (below).
    free = failure_free(a, list(range(16)), jobs=2)
    c = check(a, a.recommended.name, list(range(16)), free, jobs=2)
    assert c.reached == 16, c
    assert c.measured_steady == pytest.approx(c.predicted_steady, rel=0.2, abs=1e-4), c
    assert c.measured_blocked == pytest.approx(c.predicted_steady, rel=0.2, abs=1e-4), c
    assert c.measured_seconds == pytest.approx(c.predicted_seconds, rel=0.2), c
    assert c.measured_overhead == pytest.approx(c.predicted_overhead, rel=0.2), c
    # Seeds run side by side compute what they compute one after another (sim's clock);
    # on a wall clock they would time each other, so that is refused.
    one = check(a, c.name, [3], {3: free[3]})
    assert one.runs[0] == c.runs[3] and one.runs[0]["seed"] == 3
    with pytest.raises(ValueError, match="sim's clock"):
        failure_free(replace(a, clock="wall seconds"), [0], jobs=2)


# -- costs as whole-run differences (lab/advise/wall.py) -------------------------------
def test_failure_cost_is_the_run_minus_its_failure_free_time_at_its_own_pace() -> None:
    """The failure-free run: 0.1 s a step, 0.5 s of evaluations at the end, 100 steps
    to target. The failure run is twice as slow (another time, another load); after
    50 steps a failure: 1 s down, 10 steps redone, slow steps long after it."""
    free, run = StepClock(), StepClock()
    for i in range(1, 101):
        free.after_step(i, 0.1 * i)
    t = 0.0
    for i in range(1, 111):
        t += 0.2 + (1.0 if i == 51 else 0.0) + (0.05 if 60 < i <= 100 else 0.0)
        run.after_step(i, t)
    lost, pace = failure_cost(run, 50, t + 1.0, free, 10.5, 100)
    assert pace == pytest.approx(0.21)  # 10 s at the run's pace + its 1 s of evaluations
    assert lost == pytest.approx(1.0 + 10 * 0.2 + 40 * 0.05)
    assert free.at(0) == 0.0 and free.at(10**6) == free.at(100)


def test_save_cost_is_the_pairs_mean_difference_per_interval_with_its_spread() -> None:
    def run(seconds: float) -> RunResult:
        return RunResult(workload="mlr", strategy="none", engine="sim", seed=0,
                         metric_name="accuracy", target=0.9, direction="max",
                         iterations=100, sim_seconds=seconds)
    cost, spread = save_cost([(run(10.0), run(11.0)), (run(12.0), run(13.4))], every=5)
    assert cost == pytest.approx((1.0 + 1.4) / 2 * 5 / 100)
    assert spread == pytest.approx(statistics.stdev([0.05, 0.07]))


def test_on_sim_whole_run_costs_agree_with_the_recorded_ones() -> None:
    """sim's clock advances only by its cost model, so what a save and a failure add to
    a run is what the engine records: the save's blocked seconds, the recovery and the
    rework (a few steps of slack: the window's pace and the save phase)."""
    cfg = RunConfig.from_toml(EXAMPLE)
    cands = candidates("sim", "ps", "bsp", [trace_spec("ps", "3s", None)],
                       ["none", "checkpoint-restart"])
    base, measured = measure(cfg, cands, trace_spec("ps", "3s", None), 3.0, lambda _: None)
    ck = next(m for m in measured if m.name == "checkpoint-restart")
    s = run_silent(replace(cfg, strategy="checkpoint-restart", stop_at_target=False,
                           max_iterations=200, checkpoint_every=50))
    assert ck.checkpoint_seconds == pytest.approx(s.checkpoint_blocked_seconds / 4, rel=0.02)
    for m in measured:
        assert m.lost_steps == pytest.approx(m.rework, abs=2), m


def test_phase_cost_reads_the_saves_off_the_steps_of_one_run() -> None:
    """Saves after every 8th step: the step with the save 0.3 s longer, the next one
    0.1 s (a background write); the rest 0.2 s, with one stall the trimming drops."""
    clock = StepClock()
    t = 0.0
    for i in range(1, 201):
        t += 0.2 + {0: 0.3, 1: 0.1}.get(i % 8, 0.0) + (5.0 if i == 100 else 0.0)
        clock.after_step(i, t)
    cost, pace = phase_cost(clock, 8)  # type: ignore[misc]
    assert cost == pytest.approx(0.4) and pace == pytest.approx(0.2)
    ticks = StepClock()  # an engine reporting at its ticks: not read this way
    for i in range(2, 200, 3):
        ticks.after_step(i, i * 0.2)
    assert phase_cost(ticks, 8) is None


def test_refill_delay_prices_a_failure_that_finds_the_replacement_not_ready() -> None:
    assert refill_delay(0.0, 1.0, 3.0) == 0.0  # sim: a replacement is always ready
    # 0.4 s more when 1 s apart: all of it for closer failures, less for later ones.
    d = refill_delay(0.4, 1.0, 3.0)
    assert 0.4 * (1 - math.exp(-1 / 3)) < d < 0.4 * (1 - math.exp(-1.4 / 3))
    assert refill_delay(0.4, 1.0, 1e-6) == pytest.approx(0.4)  # every failure is close
    base = Baseline("none", iterations=100, seconds=10.0)
    m = Measured("x", None, recovery_seconds=0.1, rework=0, refill_excess=0.4, refill_gap=1.0)
    assert predict(base, m, "x", 3.0, 4).recovery_seconds == pytest.approx(0.1 + d)


def test_refill_delay_with_the_spare_window_measured_with_steps_running() -> None:
    """With the steps running the spare was ready 3 s after a failure: a failure g
    seconds after another waits 3 - g (midpoint sums over the Exp(3 s) gaps agree),
    whatever the back-to-back sample read; none if no failure ever waited (sim)."""
    mtbf, dt = 3.0, 1e-4
    numeric = sum(max(0.0, 3.0 - (k + 0.5) * dt) * math.exp(-(k + 0.5) * dt / mtbf) * dt
                  / mtbf for k in range(int(4 / dt)))
    assert refill_delay(0.4, 1.0, mtbf, 3.0) == pytest.approx(numeric, rel=1e-4)
    assert refill_delay(2.0, 1.0, mtbf, 3.0) == refill_delay(0.4, 1.0, mtbf, 3.0)
    assert refill_delay(0.0, 1.0, mtbf, 3.0) == 0.0
    # A 10 s run starts with a spare ready: a failure at t waits only for gaps g < t.
    def upto(t: float) -> float:  # E[max(0, 3 - g); g < t]
        a = min(t, 3.0)
        e = math.exp(-a / mtbf)
        return 3.0 * (1 - e) - (mtbf * (1 - e) - a * e)
    dt = 1e-3
    numeric = sum(upto((k + 0.5) * dt) for k in range(int(10 / dt))) * dt / 10
    assert refill_delay(0.4, 1.0, mtbf, 3.0, 10.0) == pytest.approx(numeric, rel=1e-4)
    assert refill_delay(0.4, 1.0, mtbf, 3.0, 10.0) < refill_delay(0.4, 1.0, mtbf, 3.0)
    base = Baseline("none", iterations=100, seconds=10.0)
    m = Measured("x", None, recovery_seconds=0.1, rework=0, refill_excess=0.4,
                 refill_gap=1.0, refill_window=3.0)
    p = predict(base, m, "x", mtbf, 4)  # over the run it predicts (a fixed point)
    assert p.recovery_seconds == pytest.approx(
        0.1 + refill_delay(0.4, 1.0, mtbf, 3.0, p.seconds_to_target, 0.1), rel=1e-3)
    # A failure waiting for the spare recovers when it is ready: its lone recovery runs
    # meanwhile, so the wait beyond it is that of a window shorter by it.
    assert refill_delay(0.4, 1.0, mtbf, 3.0, None, 0.1) == pytest.approx(
        refill_delay(0.4, 1.0, mtbf, 2.9))


def test_slow_steps_beside_the_spare_stop_when_the_next_failure_waits_for_it() -> None:
    """A lone failure's steps lost beyond its rework are slow steps beside the spare
    being started again, from its recovery (``a`` s) until the spare is ready (``w`` s
    after the failure); on a trace the next failure, ``Exp(MTBF)`` later, stops them
    when it strikes before (its wait is counted in its recovery): they last
    ``E[max(0, min(g, w) - a)]`` of the ``w - a`` seconds, not all of them."""
    mtbf, w, a = 3.0, 3.08, 0.14
    rng = random.Random(5)
    gaps = [rng.expovariate(1 / mtbf) for _ in range(200_000)]
    mc = statistics.fmean(max(0.0, min(g, w) - a) for g in gaps) / (w - a)
    assert spare_share(w, mtbf, a) == pytest.approx(mc, rel=0.01)
    assert spare_share(w, mtbf, a) == pytest.approx(0.6085, abs=1e-3)
    assert spare_share(w, mtbf) == pytest.approx(
        statistics.fmean(min(g, w) for g in gaps) / w, rel=0.01)
    assert spare_share(w, 1e9, a) == pytest.approx(1.0)  # failures far apart: all of it
    assert spare_share(a, mtbf, a) == 1.0  # nothing to cut
    base = Baseline("none", iterations=250, seconds=10.0)
    lone = Measured("x", 8, recovery_seconds=0.14, rework=4.75, lost_steps=14.4,
                    refill_excess=2.7, refill_gap=0.2, refill_window=w)
    p = predict(base, lone, "x", mtbf, 4, overlap="batch")
    r = p.recovery_seconds
    assert r is not None and p.per_failure_seconds is not None
    steps = 4.75 + (14.4 - 4.75) * spare_share(w, mtbf, 0.14)  # 10.6: the rework stays whole
    assert p.per_failure_seconds == pytest.approx(
        outage(r, mtbf, "batch") + costing(r, mtbf, "batch") * steps * 0.04)
    assert p.outage_seconds == pytest.approx(outage(r, mtbf, "batch"))  # < r: overlapping
    # No window (sim: a replacement is always ready): nothing to cut short.
    bare = replace(lone, refill_excess=0.0, refill_window=None)
    q = predict(base, bare, "x", mtbf, 4)
    assert q.per_failure_seconds == pytest.approx(0.14 + math.exp(-0.14 / mtbf) * 14.4 * 0.04)
    # Fewer steps lost than the rework (a noisy calibration): those, uncut.
    few = predict(base, replace(lone, lost_steps=3.0), "x", mtbf, 4, overlap="batch")
    r = few.recovery_seconds  # its own: the wait for the spare depends on the run's length
    assert r is not None
    assert few.per_failure_seconds == pytest.approx(
        outage(r, mtbf, "batch") + costing(r, mtbf, "batch") * 3.0 * 0.04)


def test_the_prediction_carries_the_calibrations_noise() -> None:
    """Steps lost 10 +- 8 over 4 failure runs: the time to target moves by the prediction
    at 10 + 8/sqrt(4) = 14 steps less that at 10; one run (sim) or none: no estimate. The
    verdict says when the runner-up is within that noise of the recommended."""
    base = Baseline("none", iterations=100, seconds=10.0)
    m = Measured("x", 10, steady=0.02, failed_at=(10, 30, 60, 90), recovery_seconds=0.5,
                 rework=4, lost_steps=10.0, lost_spread=8.0)
    p = predict(base, m, "x", 5.0, 4)
    at14 = predict(base, replace(m, lost_steps=14.0, lost_spread=None), "x", 5.0, 4)
    assert p.seconds_se == pytest.approx(at14.seconds_to_target - p.seconds_to_target)
    assert p.seconds_se is not None and p.seconds_se > 0
    assert predict(base, replace(m, failed_at=(50,)), "x", 5.0, 4).seconds_se is None
    assert predict(base, replace(m, lost_spread=None), "x", 5.0, 4).seconds_se is None
    # A mean below zero (noise) is used as 0, and the noise counted from there.
    neg = predict(base, replace(m, lost_steps=-6.0), "x", 5.0, 4)
    at4 = predict(base, replace(m, lost_steps=4.0, lost_spread=None), "x", 5.0, 4)
    at0 = predict(base, replace(m, lost_steps=0.0, lost_spread=None), "x", 5.0, 4)
    assert neg.seconds_se == pytest.approx(at4.seconds_to_target - at0.seconds_to_target)
    a = Advice("x", "sim", "ps", "simulated seconds", 5.0, "shard=any@mtbf=5s", "time",
               base, [m], [p, replace(p, name="y", label="y",
                                      seconds_to_target=p.seconds_to_target + 0.1)], {})
    assert "less than the calibration's noise" in verdict(a)
    far = replace(a, predictions=[p, replace(p, name="y", label="y", seconds_to_target=99.0)])
    assert "noise" not in verdict(far)
    assert f"+- {p.seconds_se:.2g}" in table_text(a)


def test_failure_free_overhead_read_off_a_checks_own_steps() -> None:
    """Saves after every 9th step cost 0.09 s on 0.1 s steps: 10% failure-free, read
    from each seed's failure-free run whatever its pace (the second run is 2x slower);
    not read where the interval shares a factor with the evaluations' or no saves."""
    def steps(scale: float) -> tuple[list[int], list[float]]:
        its, secs, t = [], [], 0.0
        for i in range(1, 181):
            t += scale * (0.1 + (0.09 if i % 9 == 0 else 0.0))
            its.append(i)
            secs.append(t)
        return its, secs
    runs = tuple({"steps": (steps(k), ((), ()))} for k in (1.0, 2.0))
    c = Check("x", 9, 0.1, 0.1, 0.0, 1.0, 1.0, 0.1, 0.1, 1.0, 1.0, 2, 2, runs=runs)
    assert steady_from_steps(c, 10) == pytest.approx([0.1, 0.1])
    assert steady_from_steps(c, 3) == []  # evaluations every 3: on phases 0, 3, 6 only
    assert steady_from_steps(replace(c, interval=None), 10) == []


def test_back_to_back_excess_is_pooled_over_candidates_replaced_from_the_spare() -> None:
    """The wait for the warm spare is the engine's, not the strategy's: the candidates
    replaced from it share the mean of their back-to-back runs; a chain's failover
    keeps its own, and one candidate alone keeps its own."""
    ms = [Measured("a", 8, refill_excess=1.8, refill_gap=0.2, refill_window=3.0),
          Measured("b", 8, refill_excess=2.2, refill_gap=0.1, refill_window=4.0),
          Measured("chain", None, refill_excess=0.0, refill_gap=0.0)]
    a, b, chain = pool_refill(ms, [True, True, False])
    assert (a.refill_excess, b.refill_excess) == pytest.approx((2.0, 2.0))
    assert (a.refill_gap, b.refill_gap) == pytest.approx((0.15, 0.15))
    assert (a.refill_window, b.refill_window) == pytest.approx((3.5, 3.5))
    assert chain == ms[2]
    assert pool_refill(ms[:1], [True]) == ms[:1]


def test_step_clock_records_when_the_spare_after_a_failure_was_ready() -> None:
    """Ray reports each refill spare ready (engines/ray/driver/cluster.py ``refilled``): the
    calibration's lone-failure runs read the window from it."""
    clock = StepClock()
    clock.on_event({"type": "failure", "sim_seconds": 2.0})
    clock.on_event({"type": "spare-ready", "after_failure": 3.1, "sim_seconds": 5.1})
    assert (clock.failures, clock.spares) == ([2.0], [3.1])
