"""``trainthrough advise --paradigm dp``: every data-parallel strategy measured at the
failure rate and ranked by time to target (lab/advise/measured.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines.result import RunResult
from trainthrough.lab.advise import advise_dp, trace_spec
from trainthrough.lab.advise.measured_report import table_text, verdict

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "advise_dp.toml"


def _runs(times: dict[str, tuple[float | None, float]]) -> tuple[Any, list[RunConfig]]:
    """A stand-in for run_silent: each strategy's (with failures, failure-free) seconds to
    target, 1,000 samples committed either way; None: the target not reached."""
    seen: list[RunConfig] = []

    def run(cfg: RunConfig) -> RunResult:
        seen.append(cfg)
        hit, free = times[cfg.strategy]
        t = hit if cfg.failures else free
        return RunResult(workload=cfg.workload, strategy=cfg.strategy, engine=cfg.engine,
                         seed=cfg.seed, metric_name="loss", target=1.0, direction="min",
                         converged=t is not None, sim_seconds_to_target=t,
                         sim_seconds=t or 100.0, failures=3 if cfg.failures else 0,
                         final_metric=0.2, extras={"samples_committed": 1000})
    return run, seen


def _advise(times: dict[str, tuple[float | None, float]], seeds: int = 1) -> Any:
    run, seen = _runs(times)
    cfg = RunConfig.from_toml(EXAMPLE)
    a = advise_dp(cfg, trace_spec("dp", "2s", None), only=list(times), seeds=seeds, run=run)
    return a, seen


def test_candidates_are_ranked_by_measured_time_to_target() -> None:
    a, seen = _advise({"rollback": (20.0, 14.0), "diloco": (7.0, 2.5),
                       "checkpoint-restart": (None, 14.0)})
    assert [r.name for r in a.results] == ["diloco", "rollback", "checkpoint-restart"]
    # Each candidate failure-free and on the trace, with its own strategy, the user's
    # ranks and H; the trace is the same for every candidate.
    assert len(seen) == 6 and {c.ranks for c in seen} == {4}
    assert {tuple(c.failures) for c in seen} == {(), ("rank=any@mtbf=2s",)}
    assert {c.sync_every for c in seen} == {10}
    v = verdict(a)
    assert v.startswith("Recommended: diloco.")
    assert "relaxed sync is the better deal" in v and "rollback" in v
    # Its lead is larger without failures (5.6x) than with them (2.9x): said so.
    assert "2.86x as fast with the failures, 5.60x without" in v
    assert "mostly the optimization" in v
    assert "One seed" in v
    assert a.results[0].mean_goodput == pytest.approx(100 * 2.5 / 7.0)
    assert "not reached" in table_text(a)


def test_synchronous_wins_where_it_is_faster_and_the_verdict_says_so() -> None:
    a, _ = _advise({"rollback": (15.0, 14.0), "localsgd": (30.0, 14.0)})
    assert a.recommended.name == "rollback"
    assert "synchronous data parallel is the better deal" in verdict(a)


def test_seeds_are_averaged_and_their_spread_reported() -> None:
    a, seen = _advise({"rollback": (15.0, 14.0), "diloco": (15.1, 14.0)}, seeds=3)
    assert sorted({c.seed for c in seen}) == [0, 1, 2]
    assert a.results[0].to_target_se == 0.0  # the stand-in's seeds agree
    assert "differ by less than the seeds' spread" not in verdict(a)  # 0.1 s > 0 spread


def test_a_run_that_does_not_stop_at_the_target_is_refused() -> None:
    from trainthrough.errors import UserError

    cfg = replace(RunConfig.from_toml(EXAMPLE), stop_at_target=False)
    never = _runs({})[0]  # refused before any run: a run would raise KeyError
    with pytest.raises(UserError, match="stop_at_target"):
        advise_dp(cfg, trace_spec("dp", "2s", None), run=never)


@pytest.mark.timeout(120)
def test_the_command_measures_and_writes_the_advice(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "advice"
    r = cli("advise", "--config", str(EXAMPLE), "--mtbf", "2s", "--strategies",
            "rollback,diloco", "--quiet", "--out", str(out))
    assert r.code == 0, r.err
    assert "measured, not predicted" in r.out and "Recommended:" in r.out
    data = json.loads((out / "advice.json").read_text())
    assert {x["name"] for x in data["results"]} == {"rollback", "diloco"}
    assert data["recommended"] == data["results"][0]["name"]
    for x in data["results"]:  # real runs: both reached the target, with failures
        assert x["to_target"] > x["free_to_target"] > 0 and x["failures"][0] > 0, x
    assert (out / "advice.png").stat().st_size > 0 and "# Advice" in (
        out / "advice.md").read_text()
