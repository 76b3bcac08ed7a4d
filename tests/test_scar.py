"""SCAR mechanisms in isolation, and the bound where its assumptions hold exactly."""

from __future__ import annotations

import math
import random

import pytest
import torch

from trainthrough.config import RunConfig
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.sim.engine import SimEngine
from trainthrough.ft.prioritized import PrioritizedEvery
from trainthrough.ft.prioritized_rows import row_change, select_rows
from trainthrough.lab.rework import rework
from trainthrough.lab.runner import build_engine, resolve_defaults, run_baseline, run_silent


def test_largest_change_takes_the_biggest_rows_within_the_byte_budget() -> None:
    change = torch.tensor([0.1, 5.0, 0.0, 3.0, 2.0])
    rows, _ = select_rows(change, torch.full((5,), 10.0), budget=25, rule="largest-change")
    assert rows.tolist() == [1, 3]  # 2 rows of 10 bytes fit in 25


def test_ties_are_broken_by_row_order_so_selection_is_deterministic() -> None:
    rows, _ = select_rows(torch.zeros(6), torch.ones(6), budget=3, rule="largest-change")
    assert rows.tolist() == [0, 1, 2]


def test_round_robin_cycles_and_random_is_seeded() -> None:
    rb = torch.ones(5)
    a, cur = select_rows(torch.zeros(5), rb, 2, "round-robin", cursor=4)
    assert a.tolist() == [0, 4] and cur == 1
    r1, _ = select_rows(torch.zeros(50), torch.ones(50), 5, "random",
                        gen=torch.Generator().manual_seed(3))
    r2, _ = select_rows(torch.zeros(50), torch.ones(50), 5, "random",
                        gen=torch.Generator().manual_seed(3))
    assert r1.tolist() == r2.tolist() and len(r1) == 5


def test_a_budget_below_one_row_selects_nothing() -> None:
    rows, cur = select_rows(torch.ones(3), torch.full((3,), 100.0), 99, "round-robin", 1)
    assert len(rows) == 0 and cur == 1


def test_row_change_is_a_per_row_norm() -> None:
    a = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert row_change(a, torch.zeros(2, 2)).tolist() == [5.0, 0.0]


@pytest.mark.parametrize("every,fraction,period", [(50, 0.25, 12), (50, 0.02, 1), (10, 1.0, 10),
                                                   (5, 0.25, 1)])
def test_prioritized_policy_period_and_bytes_per_interval(every: int, fraction: float,
                                                          period: int) -> None:
    p = PrioritizedEvery(every, fraction)
    saves = [i for i in range(1, 101) if p.decide(i)]
    assert saves[:2] == [period, 2 * period]
    # Each save writes period/N of a full checkpoint: one full checkpoint per N.
    assert p.decide(period).fraction == period / every  # type: ignore[union-attr]


def _engine(strategy: str, **kw) -> SimEngine:  # noqa: ANN003
    cfg, wl = resolve_defaults(RunConfig(workload="mlr", strategy=strategy, seed=0, **kw))
    return build_engine(cfg, wl, Callback(),  # type: ignore[return-value]
                        f"memory://test-scar/{random.random()}")


@pytest.mark.parametrize("fraction,saves", [(0.25, 16), (None, 40)])
def test_prioritized_bytes_match_a_full_checkpoint_per_interval(fraction: float | None,
                                                                saves: int) -> None:
    full = _engine("checkpoint-restart", checkpoint_every=50, max_iterations=200,
                   stop_at_target=False).run()
    prio = _engine("scar", checkpoint_every=50, max_iterations=200, stop_at_target=False,
                   checkpoint_fraction=fraction).run()
    f, p = full.extras["checkpoint_payload_bytes"], prio.extras["checkpoint_payload_bytes"]
    assert full.checkpoints == 4 and prio.checkpoints >= saves
    # Credit carries over, so prioritized never writes more than full; it can write a
    # little less (credit left over that did not reach a whole row).
    assert 0.9 * f <= p <= f, (f, p)


def test_restore_assembles_the_freshest_saved_copy_of_every_row() -> None:
    e = _engine("scar", checkpoint_every=20, checkpoint_fraction=0.25, max_iterations=60,
                stop_at_target=False)
    e.run()
    ck = e.checkpointer
    saved = {n: v.clone() for n, v in ck.backend.savers[1]._ref.items()}  # last saved, per row
    current = {n: v.clone() for n, v in e.cluster.shards[1].values.items()}
    e.cluster.wipe(1)
    ck.restore([1], lambda msg: pytest.fail(msg))
    for n, v in e.cluster.shards[1].values.items():
        assert torch.equal(v, saved[n])
        assert not torch.equal(v, current[n])  # something was stale: a real restore
    # Survivors are untouched by a partial restore.
    assert all(torch.isfinite(v).all() for v in e.cluster.shards[0].values.values())


def test_partial_recovery_perturbs_only_the_lost_shards() -> None:
    s = run_silent(RunConfig(workload="mlr", strategy="scar-partial", checkpoint_every=50,
                             failures=["shards=1@iter=130"]))
    r = s.recoveries[0]
    assert r.action == "restore-lost" and r.restored_from == 100
    assert math.isclose(r.perturbation_norm, r.perturbation_norm_lost, rel_tol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_scar_partial_never_worse_than_checkpoint_restart(seed: int) -> None:
    def to_target(strategy: str) -> int | None:
        return run_silent(RunConfig(workload="mlr", strategy=strategy, seed=seed, eval_every=1,
                                    checkpoint_every=50, failures=["shards=50%@iter=240"])
                          ).iterations_to_target

    partial, full = to_target("scar-partial"), to_target("checkpoint-restart")
    assert partial is not None and full is not None and partial <= full


def test_bound_holds_exactly_on_ridge_for_many_random_perturbations() -> None:
    rng = random.Random(7)
    base = run_baseline(RunConfig(workload="ridge", seed=0))
    c_true = 1 - 0.1 * 1.1
    assert base.fit is not None and abs(base.fit.c - c_true) < 1e-3  # the true rate
    checked = 0
    for _ in range(30):
        strategy = rng.choice(["none", "checkpoint-restart", "scar-partial", "scar"])
        fails = [f"shards={rng.choice(['1', '0,2', '25%', '75%'])}@iter={rng.randint(3, 60)}"
                 for _ in range(rng.choice([1, 2]))]
        cfg = RunConfig(workload="ridge", strategy=strategy, failures=fails, seed=0,
                        checkpoint_every=rng.randint(3, 25))
        s = run_silent(cfg)
        assert s.converged
        r = rework(s, base)  # what a run folder's summary.json records
        assert r.rework_iterations is not None and r.rework_bound is not None
        assert r.rework_iterations <= math.ceil(r.rework_bound + 1e-9), (cfg, r)
        checked += 1
    assert checked == 30
