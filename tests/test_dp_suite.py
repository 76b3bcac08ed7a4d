"""The data-parallel suite: its grid, and the failure traces that end every run on L steps."""

from __future__ import annotations

import pytest

from trainthrough.config import RunConfig
from trainthrough.lab.runner import run_silent
from trainthrough.lab.suites import SUITES
from trainthrough.lab.suites.dataparallel import COST, PHASES, STRATEGIES, failure_trace
from trainthrough.lab.validate import for_strategy, validate_run


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("phase", PHASES)
def test_every_run_ends_on_exactly_l_committed_steps(strategy: str, phase: str) -> None:
    steps, every = 60, 20
    specs, extra = failure_trace(strategy, (4, 30, 56), phase, every)
    s = run_silent(for_strategy(RunConfig(workload="mlr", paradigm="dp", failures=specs,
                                          max_iterations=steps + extra, stop_at_target=False,
                                          checkpoint_every=every, eval_every=20, cost=COST,
                                          allreduce_buckets=4), strategy))
    assert s.failures == 3 and s.extras["logical_iterations"] == steps
    # Every failure struck at the planned committed step, whatever the strategy lost.
    assert [r.at_iteration for r in s.recoveries] == [
        int(x.split("@iter=")[1].split(",")[0]) for x in specs]


def test_suite_grid() -> None:
    quick = SUITES["dataparallel"].build(quick=True)
    full = SUITES["dataparallel"].build()
    for spec in (quick, full):
        for r in spec.runs:
            validate_run(r.config)
    # 2 workloads x (seeds failure-free + phases x 2 counts x 5 strategy/elastic cells x seeds)
    assert len(quick.runs) == 2 * (1 + 2 * 2 * 5)
    assert len(full.runs) == 2 * 3 * (1 + 4 * 2 * 5)
    assert {r.labels["elastic"] for r in full.runs} == {"-", "keep-global", "keep-local"}
