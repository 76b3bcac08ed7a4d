"""The headline suite (``make run``): differences its noise can show, intervals on every
reduction, SCAR's figure beside ours; and the quick TTF suite's check that its failure
struck before any run reached its target."""

from __future__ import annotations

from typing import Any

from trainthrough.lab.results import summarize
from trainthrough.lab.suites import build_suite
from trainthrough.lab.suites.core import PAPER, SEEDS, STRATEGIES
from trainthrough.lab.suites.scar import SETTINGS
from trainthrough.lab.suites.ttf import build as build_ttf
from trainthrough.lab.suites.ttf import strike_line
from trainthrough.lab.tables import headline_table


def test_the_headline_runs_every_workload_at_the_scar_settings_with_five_seeds() -> None:
    spec = build_suite("core")
    assert spec.intervals
    seeds = {r.config.seed for r in spec.runs}
    assert len(seeds) == SEEDS >= 5
    for r in spec.runs:
        st = SETTINGS[r.config.workload]
        # every strategy that saves, saves every N (none reads no interval)
        assert r.config.checkpoint_every == (None if r.config.strategy == "none" else st.every)
        assert r.config.failures == [f"shards=50%@iter={st.fail_at}"]
        # the failure strikes 80% of the way through an interval: checkpoint-restart
        # rolls back 0.8 N, tens of iterations
        assert st.fail_at % st.every == round(0.8 * st.every) >= 20
    assert {r.config.strategy for r in spec.runs} == set(STRATEGIES)
    # one failure-free twin per (workload, seed), shared by every strategy
    twins = {spec.baseline_of(r.config).to_toml() for r in spec.runs}
    assert len(twins) == len(SETTINGS) * SEEDS


def _rows(reworks: dict[str, list[float]]) -> list[dict[str, Any]]:
    return [{"workload": "mf", "fail": "shards=50%@iter=45", "strategy": s, "seed": i,
             "converged": True, "rework_iterations": v}
            for s, vs in reworks.items() for i, v in enumerate(vs)]


def test_a_reduction_whose_interval_reaches_zero_reads_no_difference_measured() -> None:
    rows = _rows({"checkpoint-restart": [20, 20, 20, 20, 20],
                  "scar": [4, 5, 6, 5, 5],  # clearly less: a percentage
                  "none": [0, 45, 10, 30, 20]})  # noise around 20: no difference
    spec = build_suite("core")
    table = headline_table(summarize(rows, intervals=True), extra=spec.columns)
    scar = next(ln for ln in table.splitlines() if " scar " in ln)
    none = next(ln for ln in table.splitlines() if " none " in ln)
    assert "75.0% [" in scar and "no difference" not in scar
    assert "no difference measured [" in none and "%" in none.split("measured")[1]
    assert PAPER in scar  # SCAR's figure beside ours, on the scar row of a paper workload
    assert PAPER not in none


def test_the_scar_paper_column_is_left_empty_where_the_paper_trains_nothing() -> None:
    spec = build_suite("core")
    (head, cell), = spec.columns
    assert head == "SCAR paper"
    assert cell({"workload": "lda", "strategy": "scar"}) == PAPER
    assert cell({"workload": "cnn", "strategy": "scar"}) == "-"
    assert cell({"workload": "mlr", "strategy": "checkpoint-restart"}) == "baseline"


def _ttf(strategy: str, kill: float, ttt: float | None) -> dict[str, Any]:
    return {"strategy": strategy, "first_kill_s": kill, "time_to_target": ttt}


def test_the_quick_ttf_suite_strikes_before_its_target_and_says_when_it_did_not() -> None:
    kills = {r.labels["first_kill_s"] for r in build_ttf(quick=True).runs}
    assert kills == {2.0}
    ok = strike_line([_ttf("stateless", 2.0, 4.5), _ttf("chain-sync", 2.0, 6.0)])
    assert ok.startswith("The failure struck at 2 s, before any run reached its target")
    assert "stateless at 4.5 s" in ok
    late = strike_line([_ttf("stateless", 5.0, 4.3), _ttf("chain-sync", 5.0, 7.0)])
    assert late.startswith("The failure struck too late for 1 of 2 runs") and "stateless" in late
    assert strike_line([_ttf("stateless", 2.0, None)]).startswith("No run reached")
