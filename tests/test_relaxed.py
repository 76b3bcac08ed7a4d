"""Relaxed synchronization (LocalSGD, DiLoCo, streaming DiLoCo) without processes:
the shared routines, the recovery policy, the sim host and validation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainthrough.config import CostModel, RunConfig
from trainthrough.dp import relaxed, step
from trainthrough.dp.rank import Rank
from trainthrough.dp.relaxed import RelaxedReplica, SyncSpec
from trainthrough.dp.repair import share_state
from trainthrough.dp.simulated import LockStep, SimCollective
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.capabilities import RELAXED_STEP_PHASES, SYNC_STEP_PHASES
from trainthrough.errors import UserError
from trainthrough.ft.decisions import RecoveryAction
from trainthrough.ft.dp_policies import DropLocal, GroupFailure, group_recovery_policy
from trainthrough.ft.strategy import resolve
from trainthrough.lab.runner import build_engine, resolve_defaults
from trainthrough.lab.validate import validate_run
from trainthrough.workloads import make_workload


def _engine(strategy: str, **kw: Any) -> Any:
    cfg, w = resolve_defaults(RunConfig(paradigm="dp", workload="mlr", stop_at_target=False,
                                        strategy=strategy, **kw))
    return build_engine(cfg, w, Callback(), f"memory://test-relaxed/{id(cfg)}")


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-6) -> bool:
    return all(torch.allclose(a[n], b[n], atol=tol, rtol=0) for n in a)


def test_fragments_are_synchronized_on_staggered_schedules() -> None:
    one = SyncSpec("diloco", 4)
    assert [t for t in range(1, 13) if one.due(t)] == [4, 8, 12] and one.due(0) == []
    two = SyncSpec("diloco", 4, fragments=2)
    assert {t: two.due(t) for t in range(1, 9) if two.due(t)} == \
        {2: [0], 4: [1], 6: [0], 8: [1]}
    with pytest.raises(ValueError):
        SyncSpec("diloco", 2, fragments=3)


def test_the_policy_drops_local_steps_and_redoes_only_an_outer_step() -> None:
    p = group_recovery_policy("drop-local")
    assert isinstance(p, DropLocal)
    inner = p.decide(GroupFailure((1,), 3, "inner"))
    outer = p.decide(GroupFailure((1,), 3, "outer"))
    assert inner.action is outer.action is RecoveryAction.DROP_LOCAL
    assert inner.reform and not inner.redo_step and outer.redo_step
    assert not inner.rewind and not inner.from_checkpoint
    assert p.decide(GroupFailure((0,), 0, "inner")).action is RecoveryAction.ROLLBACK_ALL


def test_localsgd_every_step_is_synchronous_sgd() -> None:
    """With H = 1 and plain SGD, averaging the replicas after one local step each is one
    step with the averaged gradient: LocalSGD then trains as the synchronous group."""
    sync = _engine("rollback", max_iterations=12)
    sync.run()
    local = _engine("localsgd", max_iterations=12, sync_every=1)
    r = local.run()
    assert r.extras["outer_steps"] == 12 and r.extras["replicas_identical"]
    assert _close(local.params(), sync.params(), 1e-5)
    apart = _engine("localsgd", max_iterations=12, sync_every=4)
    apart.run()
    assert not _close(apart.params(), sync.params(), 1e-5)


def test_diloco_with_outer_sgd_lr_1_is_localsgd_and_momentum_changes_it() -> None:
    a = _engine("localsgd", max_iterations=20, sync_every=5)
    a.run()
    b = _engine("diloco", max_iterations=20, sync_every=5, outer_lr=1.0, outer_momentum=0.0)
    b.run()
    c = _engine("diloco", max_iterations=20, sync_every=5)
    c.run()
    assert _close(a.params(), b.params(), 1e-5)
    assert not _close(b.params(), c.params(), 1e-4)


def test_a_replica_lost_in_inner_steps_takes_only_its_own_steps_along() -> None:
    e = _engine("diloco", max_iterations=30, sync_every=5, replace=False, elastic="keep-local",
                failures=["rank=2@iter=7,phase=inner"])
    r = e.run()
    x = r.extras
    # Struck at its 8th inner step (before applying it): 2 local steps since the outer
    # step after step 5; nobody rolled back, the group kept its logical iteration.
    assert x["local_steps_lost"] == [2] and r.updates_lost == 2
    assert x["logical_iterations"] == 30 and x["outer_steps"] == 6
    assert x["ranks_final"] == 3 and x["replicas_identical"]
    assert r.recoveries[0].action == "drop-local" and r.recoveries[0].perturbation_norm > 0
    # The survivors lost no more than the detection and a re-formation at the outer step
    # (keep-local: their steps stay the same size).
    free = _engine("diloco", max_iterations=30, sync_every=5, elastic="keep-local").run()
    m = CostModel()
    assert r.sim_seconds <= free.sim_seconds + m.detection_seconds + m.reform_seconds


def test_an_outer_step_struck_is_run_again_on_the_survivors() -> None:
    r = _engine("localsgd", max_iterations=20, sync_every=5, replace=False,
                failures=["rank=1@iter=6,phase=outer"]).run()
    assert r.extras["outer_retries"] == 1 and r.extras["outer_steps"] == 4
    assert r.extras["local_steps_lost"] == [5] and r.extras["replicas_identical"]


def test_a_replacement_joins_at_an_outer_boundary_with_the_outer_state() -> None:
    e = _engine("diloco", max_iterations=40, sync_every=5,
                cost=CostModel(replace_seconds=0.0), failures=["rank=1@iter=3,phase=inner"])
    r = e.run()
    assert r.extras["ranks_joined"] == 1 and r.extras["ranks_final"] == 4
    assert r.extras["replicas_identical"]
    reps = [e.g.ranks[s] for s in e.g.live]
    assert all(torch.equal(x.momentum, reps[0].momentum) for x in reps)
    assert reps[0].momentum.abs().sum() > 0


def test_share_state_carries_the_outer_state_to_a_joiner() -> None:
    w = make_workload("mlr")
    x0 = w.init_params(torch.Generator().manual_seed(0))
    sync = SyncSpec("diloco", 4)
    donor = RelaxedReplica(Rank(0, w, w.default_optimizer, x0, 0), sync)
    donor.global_ += 0.25
    donor.momentum += 0.5
    joiner = RelaxedReplica(Rank(1, w, w.default_optimizer, x0, 0), sync)
    group = {0: donor, 1: joiner}
    coll = SimCollective([0, 1])
    quiet = LockStep(on_point=lambda _: None, on_reduce=lambda _b, _n: None)
    quiet.run(coll, {s: share_state(r, coll, [7], holder=s == 0) for s, r in group.items()})
    assert torch.equal(joiner.global_, donor.global_)
    assert torch.equal(joiner.momentum, donor.momentum)


def test_streaming_diloco_moves_one_fragment_per_outer_step() -> None:
    r = _engine("streaming-diloco", max_iterations=20, sync_every=10, sync_fragments=2).run()
    assert r.extras["outer_steps"] == 4 and r.extras["replicas_identical"]
    full = _engine("diloco", max_iterations=20, sync_every=10).run()
    # Same bytes per H steps: each fragment once.
    assert r.extras["outer_bytes"] == full.extras["outer_bytes"]


def test_capability_phase_names_match_the_step_routines() -> None:
    assert set(relaxed.POINTS) - {"boundary"} == RELAXED_STEP_PHASES
    assert set(step.POINTS) - {"boundary"} == SYNC_STEP_PHASES


@pytest.mark.parametrize("cfg, words", [
    (dict(strategy="diloco", failures=["rank=1@iter=3,phase=allreduce:0"]), "inner, outer"),
    (dict(strategy="rollback", failures=["rank=1@iter=3,phase=outer"]), "allreduce:K"),
    (dict(strategy="rollback", sync_every=5), "--sync-every has no effect"),
    (dict(strategy="diloco", sync_fragments=4), "--sync-fragments has no effect"),
    (dict(strategy="localsgd", outer_lr=0.5), "outer optimizer"),
    (dict(strategy="streaming-diloco", sync_every=2, sync_fragments=3), "cannot exceed"),
    (dict(strategy="diloco", failures=["rank=1@iter=3,phase=recovery"], engine="gloo"),
     "phase 'recovery'"),
])
def test_relaxed_settings_are_validated(cfg: dict[str, Any], words: str) -> None:
    with pytest.raises(UserError, match=words):
        validate_run(RunConfig(paradigm="dp", **cfg))


def test_compositions_pair_relaxed_sync_with_drop_local() -> None:
    assert resolve("base=diloco,sync=localsgd").sync == "localsgd"
    for bad in ("base=rollback,sync=diloco", "base=diloco,recovery=lossy-forward",
                "base=diloco,checkpoint=full"):
        with pytest.raises(UserError, match="strategy:"):
            resolve(bad)
    with pytest.raises(UserError, match="data-parallel"):
        resolve("diloco").require("ps")


def test_launch_refuses_sync_every_without_a_relaxed_strategy(tmp_path: Any) -> None:
    from tests.loops.ledger_loop import train
    from trainthrough.loop import launch

    with pytest.raises(UserError, match="sync_every applies to localsgd"):
        launch(train, engine="gloo", strategy="rollback", sync_every=4, out=tmp_path / "o",
               progress=False)
    assert not (tmp_path / "o").exists()


def test_the_diloco_benchmark_strikes_both_systems_at_the_same_steps() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import vs_torchft_diloco as bench

    ours = bench.ours_config("diloco", 300, [60, 120], 10, seed=1)
    assert ours.failures == ["rank=1@iter=60,phase=inner", "rank=1@iter=120,phase=inner"]
    assert ours.sync_every == 10 and ours.elastic == "keep-local"
    sync = bench.ours_config("rollback", 300, [60, 120], 10, seed=1)
    # rollback executes the interrupted step twice: the second trigger moves by one
    assert sync.failures == ["rank=1@iter=60,phase=allreduce:0",
                             "rank=1@iter=121,phase=allreduce:0"]
    assert sync.max_iterations == 302


def test_every_replica_lost_restarts_the_group_from_the_start() -> None:
    """The last survivor struck while the group re-forms: nobody to carry the model."""
    r = _engine("diloco", ranks=2, max_iterations=30, sync_every=5, replace=False,
                failures=["rank=1@iter=7,phase=inner", "rank=0@iter=7,phase=recovery"]).run()
    assert r.failures == 2 and r.extras["ranks_final"] == 2
    assert r.extras["logical_iterations"] < 30 and r.extras["replicas_identical"]
