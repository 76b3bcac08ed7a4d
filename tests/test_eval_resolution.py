"""Iterations to target (and so rework) exact to one iteration, whatever eval_every is.

The shared evaluation policy (engines/evaluation.py) keeps copies between evaluations
and looks back at them when the target is reached, so a run that evaluates every 10
iterations reports what evaluating every iteration would; the failure-free baseline
follows the same rule, so rework is a difference of exact numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.evaluation import (
    AFTER_DISRUPTION,
    NEAR_LOOKS,
    EvalAction,
    EvalPolicy,
    near,
)
from trainthrough.engines.result import RunResult
from trainthrough.lab.runner import run, run_silent
from trainthrough.workloads import make_workload

from .conftest import read_summary

#: full-batch gradient descent on a tiny least-squares model: a monotone metric
GD = str(Path(__file__).with_name("gd_workload.py")) + ":build"
GD_OPTIONS = {"target": 0.0115}  # reached at iteration 57 failure-free


class Evals(Callback):
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def after_eval(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def at(self, iteration: int) -> dict[str, Any]:
        return next(r for r in self.records if r["iteration"] == iteration)


# -- the policy, without any engine -------------------------------------------------
def test_policy_evaluates_multiples_and_after_disruptions_keeps_the_rest() -> None:
    p = EvalPolicy(10)
    assert p.decide(10, 9, False, None) is EvalAction.EVALUATE
    assert p.decide(11, 10, False, None) is EvalAction.KEEP
    assert p.decide(11, 10, True, None) is EvalAction.SKIP  # target known: nothing to locate
    # A driver that only sees some iterations: a multiple passed in between is due now.
    assert p.decide(23, 18, False, None) is EvalAction.EVALUATE
    # After a disruption at 41: the next AFTER_DISRUPTION iterations, even past the target.
    for it in range(42, 42 + AFTER_DISRUPTION):
        assert p.decide(it, it - 1, True, 41) is EvalAction.EVALUATE
    assert p.decide(42 + AFTER_DISRUPTION, 41 + AFTER_DISRUPTION, False, 41) is EvalAction.KEEP


def test_near_means_closer_to_the_target_than_the_last_steady_move() -> None:
    assert not near([0.20, 0.17], 0.16)  # two moves are needed
    assert near([0.23, 0.20, 0.17], 0.16)  # 0.01 away, moving 0.03 per interval
    assert not near([0.35, 0.30, 0.25], 0.16)  # 0.09 away
    # Fast geometric progress (the move shrank by more than half): the trend dominates,
    # and the look-back at the target finds a monotone approach exactly.
    assert not near([0.50, 0.20, 0.17], 0.16)


# -- sim parameter server: ridge (gradient descent, monotone metric) ----------------
#: ridge's default target, a little lower: reached between two multiples of 10
RIDGE_TARGET = make_workload("ridge").default_target * 0.7


def _ridge(tmp: Path, name: str, eval_every: int, failures: list[str]) -> dict[str, Any]:
    cfg = RunConfig(workload="ridge", strategy="checkpoint-restart", checkpoint_every=20,
                    target=RIDGE_TARGET, eval_every=eval_every, failures=failures,
                    baseline=True, seed=0)
    run(cfg, tmp / name)
    return read_summary(tmp / name)


def test_ps_rework_of_one_to_three_iterations_is_reported_exactly(tmp_path: Path) -> None:
    dense = _ridge(tmp_path, "dense", 1, [])
    base = dense["iterations_to_target"]
    assert base % 10, "the target must fall between two regular evaluations"
    for k in (1, 2, 3):
        # Shard 1 dies k iterations after the checkpoint of iteration 40: everything
        # rolls back to 40, so exactly k iterations are done again.
        s = _ridge(tmp_path, f"k{k}", 10, [f"shards=1@iter={40 + k}"])
        assert s["baseline_iterations_to_target"] == base
        assert s["rework_iterations"] == k, s
        assert s["iterations_to_target"] == base + k
        assert s["target_resolution"] == 1
        assert s["recoveries"][0]["restored_from"] == 40


def test_ps_evaluates_just_before_and_after_the_failure(tmp_path: Path) -> None:
    dense, sparse = Evals(), Evals()
    kw: dict[str, Any] = dict(workload="ridge", strategy="checkpoint-restart",
                              checkpoint_every=20, target=RIDGE_TARGET,
                              failures=["shards=1@iter=43"], seed=0)
    run_silent(RunConfig(eval_every=1, **kw), dense)
    s = run_silent(RunConfig(eval_every=10, **kw), sparse)
    its = [r["iteration"] for r in sparse.records]
    assert its == sorted(its) and len(set(its)) == len(its)
    # 43: the state the failure struck; 44..46: the dip after the rollback.
    for it in range(43, 44 + AFTER_DISRUPTION):
        assert it in its
        assert sparse.at(it)["metric"] == dense.at(it)["metric"]
        assert sparse.at(it)["logical_iteration"] == dense.at(it)["logical_iteration"]
    # The cost stays bounded: regular ones, the failure's, and look-backs.
    regular = s.iterations // 10 + 2
    assert s.extras["evaluations"] == len(its)
    assert len(its) <= regular + 1 + AFTER_DISRUPTION + (NEAR_LOOKS + 1) * 9


def test_noisy_sgd_finds_the_iteration_eval_every_1_finds() -> None:
    """mlr (mini-batch SGD) is not monotone: the evaluations near the target look back
    too, and here find what evaluating every iteration finds."""
    kw: dict[str, Any] = dict(workload="mlr", strategy="checkpoint-restart", checkpoint_every=50,
                              seed=1)
    for failures in ([], ["shards=50%@iter=202"]):
        dense = run_silent(RunConfig(eval_every=1, failures=failures, **kw))
        sparse = run_silent(RunConfig(eval_every=10, failures=failures, **kw))
        assert sparse.iterations_to_target == dense.iterations_to_target
        assert sparse.extras["evaluations"] < dense.extras["evaluations"] / 5


# -- sim data parallel ---------------------------------------------------------------
def _gd(engine: str, eval_every: int, failures: list[str]) -> RunResult:
    return run_silent(RunConfig(workload=GD, workload_options=GD_OPTIONS, paradigm="dp",
                                engine=engine, ranks=2, strategy="checkpoint-restart",
                                checkpoint_every=20, eval_every=eval_every, failures=failures,
                                seed=0))


def test_dp_rework_is_exact_and_matches_eval_every_1() -> None:
    base = _gd("sim", 10, []).iterations_to_target
    assert base == _gd("sim", 1, []).iterations_to_target == 57
    for k in (1, 2, 3):
        s = _gd("sim", 10, [f"rank=1@iter={40 + k}"])
        assert s.iterations_to_target == _gd(
            "sim", 1, [f"rank=1@iter={40 + k}"]).iterations_to_target
        assert s.iterations_to_target - base == k  # back to the checkpoint of 40
        assert s.extras["target_resolution"] == 1


# -- a real engine: gloo processes -----------------------------------------------------
@pytest.mark.timeout(120)
def test_gloo_finds_the_iteration_eval_every_1_finds() -> None:
    """Rank 0 keeps copies; the controller asks for them through the store when the
    evaluation at 60 finds the target reached (at 57, as sim's every-iteration run)."""
    s = _gd("gloo", 10, [])
    assert s.iterations_to_target == _gd("sim", 1, []).iterations_to_target == 57
    assert s.extras["target_resolution"] == 1
    assert s.extras["evaluations"] < 57
