"""The scale suite: its decisions are the runtime's policy objects, its model is sane,
and ``compare --suite scale`` writes its folder or refuses a bad option in one line."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest

from trainthrough.cli import main
from trainthrough.engines.sim import dp_engine
from trainthrough.ft.checkpointing import FullEvery
from trainthrough.ft.decisions import GroupRecoveryDecision, RecoveryAction
from trainthrough.ft.dp_policies import GroupFailure, MiniBatchRollback
from trainthrough.lab.perf_model import young_daly_interval
from trainthrough.lab.scale import model
from trainthrough.lab.scale.costs import ScaleCosts
from trainthrough.lab.scale.model import mean_goodput, simulate, young_daly_steps
from trainthrough.lab.scale.params import ScaleParams, parse
from trainthrough.lab.scale.plot import crossovers
from trainthrough.lab.scale.validation import PUBLISHED, Published, check
from trainthrough.lab.scale.variants import BY_NAME

P = ScaleParams(steps=4_000, mttf_hours=3_000.0, validate=False)


def _good(name: str, p: ScaleParams, n: int, seeds: int = 2) -> float:
    return mean_goodput([simulate(BY_NAME[name], p, n, s) for s in range(seeds)])


def test_the_model_asks_the_policies_the_engines_use() -> None:
    # The very factory and classes the sim engine builds its policies from.
    assert model.group_recovery_policy is dp_engine.group_recovery_policy
    assert model.ElasticPolicy is dp_engine.ElasticPolicy
    assert model.ReplacementPolicy is dp_engine.ReplacementPolicy


def test_a_changed_recovery_policy_changes_the_simulated_outcome(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = simulate(BY_NAME["rollback"], P, 16_384, 0)
    assert before.failures > 0 and before.reforms > 0 and before.restarts == 0

    def restart(self: MiniBatchRollback, f: GroupFailure) -> GroupRecoveryDecision:
        return GroupRecoveryDecision(RecoveryAction.ROLLBACK_ALL, f.failed, rewind=True,
                                     from_checkpoint=f.have_checkpoint)

    monkeypatch.setattr(MiniBatchRollback, "decide", restart)
    after = simulate(BY_NAME["rollback"], P, 16_384, 0)
    # No checkpoint to go back to: every failure restarts the job from its first step.
    assert after.restarts > 0 and after.reforms == 0
    assert after.goodput < before.goodput - 0.05


def test_a_changed_checkpoint_policy_changes_the_simulated_outcome(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = simulate(BY_NAME["checkpoint-restart"], P, 1_024, 0)
    assert before.checkpoints == P.steps // P.checkpoint_every
    monkeypatch.setattr(FullEvery, "decide", lambda self, iteration: None)
    after = simulate(BY_NAME["checkpoint-restart"], P, 1_024, 0)
    assert after.checkpoints == 0 and after.checkpoint_seconds == 0


def test_goodput_falls_with_size_and_failure_rate() -> None:
    for name in ("checkpoint-restart/young-daly", "rollback", "diloco"):
        sizes = [_good(name, P, n) for n in (64, 16_384, 100_000)]
        assert sizes[0] >= sizes[1] > sizes[2], (name, sizes)
        worse = _good(name, replace(P, mttf_hours=P.mttf_hours / 10), 16_384)
        assert worse < sizes[1], name


def test_failures_arrive_at_the_cluster_rate() -> None:
    o = simulate(BY_NAME["lossy-forward"], P, 100_000, 0)
    expected = o.seconds * 100_000 / P.mttf_seconds
    assert abs(o.failures - expected) < 4 * math.sqrt(expected), (o.failures, expected)


def test_young_daly_interval() -> None:
    for n in (8, 1_024, 100_000):
        c = ScaleCosts.of(P, n)
        t = young_daly_interval(c.save, P.mttf_seconds / n)
        assert math.isclose(t, math.sqrt(2 * c.save * P.mttf_seconds / n))
        assert young_daly_steps(P, c) == min(P.steps, max(1, round(t / P.step_seconds)))
    # Shared storage: past the aggregate bandwidth, a save grows with the cluster.
    assert ScaleCosts.of(P, 100_000).save > 10 * ScaleCosts.of(P, 1_024).save


def test_crossovers_are_sign_changes_beyond_a_tie() -> None:
    sizes = [8, 64, 1_024]
    cs = crossovers(sizes, "a", "b", [1.0, 0.99, 0.90], [1.0, 0.995, 0.97])
    assert cs == []  # b is ahead or tied everywhere
    cs = crossovers(sizes, "a", "b", [0.99, 0.98, 0.90], [0.97, 0.96, 0.95])
    assert [(c.behind, c.ahead) for c in cs] == [("a", "b")]
    assert 64 < cs[0].size < 1_024 and 0.90 < cs[0].goodput < 0.98
    # Differences of noise on both sides (no failure at 8 accelerators) are no crossing.
    assert crossovers(sizes[:2], "a", "b", [1.0, 1.0], [1.0 + 1e-12, 1.0 - 1e-4]) == []


def test_validation_compares_like_with_like() -> None:
    short = replace(PUBLISHED[0], days=2.0)
    c = check(short, P, seeds=1)
    assert c.params.sizes == (16_384,) and c.params.storage_total_gbps == 2_000
    assert 0 < c.ours < 1 and math.isclose(c.difference, c.ours - 0.90)
    assert c.within == (c.ours >= 0.90 or abs(c.difference) <= 0.05)
    down = Published("x", "y", "downtime", 1.0, "about", 1_024, 1.0,
                     BY_NAME["checkpoint-restart"], {}, ())
    d = check(down, replace(P, mttf_hours=100.0), seeds=1)
    assert d.ours > 0 and math.isclose(d.gap, 1.0 / d.ours)


def test_compare_scale_writes_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "scale"
    rc = main(["compare", "--suite", "scale", "--quick", "--quiet", "--out", str(out),
               "--option", "sizes=8,1024", "--option", "steps=1000",
               "--option", "validate=false", "--option", "mttf_hours=500"])
    assert rc == 0
    with open(out / "results.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 * 2  # variants x sizes, one seed
    assert {r["accelerators"] for r in rows} == {"8", "1024"}
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| mttf_hours | `500` |" in report and "## Crossovers" in report
    assert (out / "plots" / "goodput.png").stat().st_size > 0
    assert "data:image/png;base64" in (out / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("args", [
    ["--option", "nope=1"], ["--option", "mttf_hours=-1"], ["--option", "sizes=8,x"],
    ["--option", "steps=1.5"], ["--option", "validate=maybe"],
    ["--option", "sync_every=4", "--option", "sync_fragments=8"],
    ["--option", "elastic=shrink"], ["--option", "steps=1", "--option", "steps=2"],
    ["--option", "sizes=0"]])
def test_a_bad_option_is_one_line_and_exit_2(args: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", "--suite", "scale", "--quick", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("trainthrough: error:")
    assert not (tmp_path / "o").exists()


def test_options_for_a_suite_that_takes_none_are_refused(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["compare", "--suite", "core", "--option", "steps=1"]) == 2
    assert "takes no --option" in capsys.readouterr().err


def test_parse_types_each_option() -> None:
    p = parse({"sizes": "8,64", "steps": "10", "state_gb": "0.5", "validate": "no",
               "elastic": "keep-local"})
    assert (p.sizes, p.steps, p.state_gb, p.validate, p.elastic) == (
        (8, 64), 10, 0.5, False, "keep-local")


def test_a_job_without_progress_is_given_up() -> None:
    # One rank and no checkpoint: every failure sends it back to its first step.
    p = replace(P, mttf_hours=0.01, steps=1_000)
    o = simulate(BY_NAME["rollback"], p, 1, 0)
    assert not o.finished and o.restarts > 0
    assert o.goodput <= 1 / model.GIVE_UP + 1e-9


@pytest.mark.parametrize("name", ["rollback", "lossy-forward", "checkpoint-restart"])
def test_a_failure_costs_what_the_sim_engine_charges(name: str) -> None:
    """Same failure time, same costs, 4 ranks: the model decides as the sim engine does
    (a restart or a re-formation) and charges the same downtime for it."""
    from trainthrough.config import CostModel, RunConfig
    from trainthrough.lab.runner import run_silent

    cost = CostModel(detection_seconds=0.025, reform_seconds=0.3, restart_seconds=3.83,
                     storage_bandwidth=1e9)
    s = run_silent(RunConfig(workload="mlr", paradigm="dp", strategy=name, ranks=4,
                             failures=["rank=1@time=0.08s"], checkpoint_every=5,
                             max_iterations=60, stop_at_target=False, replace=False, cost=cost,
                             checkpoint_dir=f"memory://scale-check/{name}"))
    (engine,) = s.recoveries
    state = s.checkpoint_bytes / s.checkpoints / 1e9 if s.checkpoints else 1e-6
    # The engine's pace without the failure and the saves (the failure must find a save).
    step = (s.sim_seconds - engine.recovery_seconds - s.checkpoint_blocked_seconds) / s.iterations
    p = replace(P, steps=60, step_seconds=step, detect_seconds=0.025,
                reform_seconds=0.3, restart_seconds=3.83, rendezvous_ms=0.0, state_gb=state,
                storage_gbps=1.0, storage_total_gbps=1e6, write_efficiency=1.0,
                checkpoint_every=5)
    o = simulate(BY_NAME[name], p, 4, trace=[0.08])
    assert o.failures == 1 and len(o.downtimes) == 1
    assert (o.restarts, o.reforms) == ((1, 0) if engine.action == "rollback-all" else (0, 1))
    assert math.isclose(o.downtimes[0], engine.recovery_seconds, rel_tol=1e-9)
