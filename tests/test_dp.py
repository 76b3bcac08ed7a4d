"""Data-parallel training in sim: allreduce, policies, rollback bit-exactness, elasticity."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from trainthrough.config import CostModel, RunConfig
from trainthrough.dp.allreduce import FlatLayout, allreduce, make_buckets, ring_seconds
from trainthrough.dp.batching import Cursor, SampleStream, assign, micro_size, split_micro
from trainthrough.dp.rank import Rank
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.sim.dp_engine import SimDPEngine
from trainthrough.errors import UserError
from trainthrough.ft.decisions import RecoveryAction
from trainthrough.ft.dp_policies import (
    CheckpointRestart,
    ElasticPolicy,
    GroupFailure,
    LossyForward,
    MiniBatchRollback,
    ReplacementPolicy,
    group_recovery_policy,
)
from trainthrough.ft.strategy import resolve
from trainthrough.lab import perf_model as pm
from trainthrough.lab.runner import build_engine, resolve_defaults, run_silent
from trainthrough.lab.validate import validate_run
from trainthrough.workloads import make_workload

from .conftest import read_summary

PHASES = ["forward", "backward", "allreduce:0", "allreduce:2", "allreduce:3", "update"]


class Events(Callback):
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []

    def on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def after_eval(self, record: dict[str, Any]) -> None:
        self.evals.append({k: v for k, v in record.items() if k != "wall_seconds"})


def _engine(cb: Callback | None = None, **kw: Any) -> SimDPEngine:
    kw.setdefault("stop_at_target", False)
    cfg, w = resolve_defaults(RunConfig(paradigm="dp", workload=kw.pop("workload", "mlr"), **kw))
    return build_engine(cfg, w, cb or Callback(),  # type: ignore[return-value]
                        f"memory://test-dp/{id(cfg)}")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def _replicas_equal(e: SimDPEngine) -> bool:
    return all(_same(e.g.ranks[s].params, e.params()) for s in e.g.live)


# -- allreduce ------------------------------------------------------------------
def _contribs(n: int = 6, numel: int = 37) -> list[tuple[int, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(j, torch.randn(numel, generator=g)) for j in range(n)]


@pytest.mark.parametrize("k", range(5))
def test_allreduce_interrupted_after_k_buckets(k: int) -> None:
    contribs = _contribs()
    buckets = make_buckets(37, 4, weights=[1, 2, 3, 4])
    assert [b.numel for b in buckets] == [4, 7, 11, 15]
    red = allreduce(contribs, buckets, stop_after=k)
    assert red.completed == tuple(range(k)) and red.complete == (k == 4)
    full = allreduce(contribs, buckets)
    for b in buckets:
        part = red.flat[b.start:b.stop]
        if b.index < k:
            assert torch.equal(part, full.flat[b.start:b.stop])
        else:
            assert torch.isnan(part).all()
    # Finish the rest with only the first 4 contributions: those buckets average
    # what arrived, the completed ones keep everybody's share.
    done = allreduce(contribs[:4], buckets, into=red)
    assert done.complete and done.counts == [6] * k + [4] * (4 - k)
    expect = torch.stack([c for _, c in contribs[:4]]).sum(0) / 4
    b = buckets[-1]
    if k < 4:
        torch.testing.assert_close(done.flat[b.start:b.stop], expect[b.start:b.stop])


def test_allreduce_sums_in_micro_batch_order_whoever_sends() -> None:
    contribs = _contribs(8)
    buckets = make_buckets(37, 3)
    ref = allreduce(contribs, buckets).flat
    for perm in itertools.islice(itertools.permutations(contribs), 0, 200, 37):
        assert torch.equal(allreduce(list(perm), buckets).flat, ref)
    mean = torch.stack([c for _, c in contribs]).mean(0)
    torch.testing.assert_close(ref, mean)
    with pytest.raises(ValueError, match="share a micro-batch"):
        allreduce(contribs + contribs[:1], buckets)
    with pytest.raises(ValueError):
        make_buckets(3, 4)
    assert ring_seconds(1e6, 1, 1e9, 0.1) == 0.0
    assert ring_seconds(1e6, 4, 1e9, 0.001) == pytest.approx(1.5e-3 + 1e-3)


def test_flat_layout_roundtrip_and_rank_state() -> None:
    w = make_workload("mlr")
    x0 = w.init_params(torch.Generator().manual_seed(0))
    lay = FlatLayout(x0)
    assert _same(lay.unflatten(lay.flatten(x0)), x0)
    r = Rank(0, w, w.default_optimizer, x0, run_seed=0)
    joiner = Rank.joining(5, r)
    assert _same(joiner.params, r.params) and joiner.rank_id == 5
    # A NaN is a value, not a gap: which buckets were reduced is the step's bookkeeping
    # (test_dp_step: InFlight.whole refuses an unreduced bucket).
    r.apply(torch.full((lay.numel,), float("nan")))
    assert all(torch.isnan(v).all() for v in r.params.values())


# -- batching -------------------------------------------------------------------
def test_global_batch_does_not_depend_on_the_split() -> None:
    stream = SampleStream(1438, seed=1)
    rows, nxt = stream.take(Cursor(), 128)
    assert len(rows) == 128 and nxt == Cursor(0, 128)
    micro = split_micro(rows, micro_size(32, 4))
    assert len(micro) == 16 and micro_size(32, 4) == 8 and micro_size(30, 4) == 6 and micro_size(32, 1) == 32
    for n in (1, 3, 4, 5):
        runs = assign(len(micro), n)
        assert [j for r in runs for j in r] == list(range(16))
        assert max(map(len, runs)) - min(map(len, runs)) <= 1
    _, wrap = stream.take(Cursor(0, 1400), 128)  # drop_last: a batch never straddles epochs
    assert wrap == Cursor(1, 128)
    with pytest.raises(UserError, match="exceeds"):
        stream.take(Cursor(), 5000)


def test_micro_batch_gradients_average_to_the_batch_gradient() -> None:
    w = make_workload("mlr")
    x0 = w.init_params(torch.Generator().manual_seed(0))
    rows = torch.arange(64)
    whole = w.compute_update_on(x0, rows, 0)
    parts = [w.compute_update_on(x0, rows[i:i + 16], 0) for i in range(0, 64, 16)]
    for n in whole:
        torch.testing.assert_close(sum(p[n] for p in parts) / 4, whole[n])


# -- policies -------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["boundary", "forward", "backward", "allreduce"])
def test_policy_decisions(phase: str) -> None:
    f = GroupFailure((1,), survivors=3, phase=phase, buckets_done=2,  # type: ignore[arg-type]
                     have_checkpoint=True)
    cr = CheckpointRestart().decide(f)
    assert cr.action is RecoveryAction.ROLLBACK_ALL and cr.rewind and cr.from_checkpoint
    rb = MiniBatchRollback().decide(f)
    assert rb.action is RecoveryAction.MINI_BATCH_ROLLBACK and rb.reform
    assert rb.redo_step == (phase != "boundary")
    assert not rb.complete_step
    lf = LossyForward().decide(f)
    assert lf.action is RecoveryAction.LOSSY_FORWARD and lf.reform and not lf.redo_step
    assert lf.complete_step == (phase != "boundary")
    nobody = GroupFailure((0, 1, 2, 3), survivors=0, phase=phase)  # type: ignore[arg-type]
    for p in (MiniBatchRollback(), LossyForward()):
        d = p.decide(nobody)
        assert d.action is RecoveryAction.ROLLBACK_ALL and not d.from_checkpoint


def test_elastic_and_replacement_policies() -> None:
    g = ElasticPolicy("keep-global", ranks=4, batch_size=32)
    assert g.decide(3).global_batch == 128 and g.decide(3).lr_scale == 1.0
    loc = ElasticPolicy("keep-local", ranks=4, batch_size=32)
    assert loc.decide(3).global_batch == 96 and loc.decide(3).lr_scale == 0.75
    assert loc.decide(4).lr_scale == 1.0
    with pytest.raises(UserError, match="elastic"):
        ElasticPolicy("grow", 4, 32)
    assert ReplacementPolicy(False, 5.0).decide((1,), 10.0) is None
    d = ReplacementPolicy(True, 5.0).decide((2, 1), 10.0)
    assert d is not None and d.slots == (1, 2) and d.at_seconds == 15.0
    with pytest.raises(UserError, match="parameter server"):
        group_recovery_policy("restore-lost")


def test_strategy_paradigms_are_validated() -> None:
    assert resolve("rollback").paradigms == ("dp",)
    assert resolve("checkpoint-restart").paradigms == ("ps", "dp")
    assert resolve("scar").paradigms == ("ps",)
    with pytest.raises(UserError, match="data-parallel"):
        validate_run(RunConfig(strategy="lossy-forward"))
    with pytest.raises(UserError, match="parameter-server.*rollback"):
        validate_run(RunConfig(strategy="scar-partial", paradigm="dp"))
    with pytest.raises(UserError, match="paradigm"):
        validate_run(RunConfig(paradigm="mpi"))
    validate_run(RunConfig(strategy="base=rollback,checkpoint=full", paradigm="dp"))


# -- the engine -----------------------------------------------------------------
def _reference(steps: int, shrink_at: int, ranks: int = 4) -> dict[str, torch.Tensor]:
    """N ranks to step ``shrink_at - 1``, then N-1 ranks with the same global batch.

    Built from the dp/ primitives alone, without the engine or any recovery code.
    """
    w = make_workload("mlr")
    spec = w.default_optimizer
    x0 = w.init_params(torch.Generator().manual_seed(0))
    group = [Rank(i, w, spec, x0, run_seed=0) for i in range(ranks)]
    stream, cursor = SampleStream(w.sample_count(), 0), Cursor()
    buckets = make_buckets(FlatLayout(x0).numel, 4)
    for step in range(steps):
        if step == shrink_at:
            group = [r for r in group if r.rank_id != 1]
        rows, cursor = stream.take(cursor, ranks * w.batch_size)
        micro = split_micro(rows, micro_size(w.batch_size, 1))
        share = assign(len(micro), len(group))
        contribs = []
        for r, s in zip(group, share):
            grads = r.new_grads(separate=True)
            r.gradients(step, [micro[j] for j in s], grads)
            contribs += grads.parts
        red = allreduce(contribs, buckets)
        for r in group:
            r.apply(red.flat)
    return group[0].params


@pytest.mark.parametrize("phase", PHASES)
def test_rollback_is_bit_identical_to_n_minus_1_ranks_from_the_failed_step(phase: str) -> None:
    steps, fail_at = 30, 12
    # The interrupted attempt counts as an executed iteration: one more to reach
    # `steps`, unless it struck after the commit (update): nothing is redone then.
    committed = phase == "update"
    e = _engine(strategy="rollback", max_iterations=steps + (not committed), replace=False,
                allreduce_buckets=4, failures=[f"rank=1@iter={fail_at},phase={phase}"])
    r = e.run()
    assert e.g.live == [0, 2, 3] and r.extras["logical_iterations"] == steps
    assert r.recoveries[0].action == "mini-batch-rollback"
    assert r.recoveries[0].perturbation_norm == 0.0 and r.updates_lost == 0
    assert _replicas_equal(e)
    assert _same(e.params(), _reference(steps, fail_at + committed))
    # The reduction is split-invariant, so this is also the failure-free N-rank run.
    free = _engine(strategy="rollback", max_iterations=steps, allreduce_buckets=4)
    free.run()
    assert _same(e.params(), free.params())


@pytest.mark.parametrize("micro", [1, 4])
def test_rollback_is_bit_exact_with_adam_on_the_cnn(micro: int) -> None:
    free = _engine(workload="cnn", strategy="rollback", max_iterations=6, micro_batches=micro)
    free.run()
    e = _engine(workload="cnn", strategy="rollback", max_iterations=7, replace=False,
                micro_batches=micro, failures=["rank=2@iter=3,phase=backward"])
    e.run()
    assert _same(e.params(), free.params()) and _replicas_equal(e)


def test_same_seed_same_bits() -> None:
    kw: dict[str, Any] = dict(strategy="lossy-forward", max_iterations=60, seed=3,
                              failures=["rank=any@mtbf=0.05s,max=3"],
                              cost=CostModel(detection_seconds=0.01, reform_seconds=0.01,
                                             replace_seconds=0.02))
    runs = []
    for _ in range(2):
        cb = Events()
        e = _engine(cb, **kw)
        e.run()
        runs.append((e.params(), cb.evals, [x for x in cb.events]))
    assert _same(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1] and runs[0][2] == runs[1][2]
    assert sum(x["type"] == "failure" for x in runs[0][2]) == 3


@pytest.mark.parametrize("phase", ["forward", "backward", "allreduce:2", "update", None])
def test_lossy_forward_drops_the_failed_share_and_carries_on(phase: str | None) -> None:
    spec = "rank=2@iter=15" + (f",phase={phase}" if phase else "")
    e = _engine(strategy="lossy-forward", max_iterations=30, replace=False, failures=[spec],
                allreduce_buckets=4)
    r = e.run()
    rec = r.recoveries[0]
    assert rec.action == "lossy-forward" and e.g.live == [0, 1, 3] and _replicas_equal(e)
    assert r.extras["logical_iterations"] == 30  # nothing redone
    dropped = phase in ("forward", "backward", "allreduce:2")
    assert (rec.perturbation_norm > 0) == dropped
    assert r.updates_lost == int(dropped) and r.extras["samples_dropped"] == 32 * dropped


def test_lossy_forward_converges_on_n_minus_1_ranks() -> None:
    s = run_silent(RunConfig(paradigm="dp", strategy="lossy-forward", replace=False,
                             allreduce_buckets=4, failures=["rank=1@iter=50,phase=allreduce:1"]))
    assert s.converged and s.extras["ranks_final"] == 3 and s.failures == 1
    assert s.recoveries[0].perturbation_norm > 0


def test_checkpoint_restart_rolls_back_every_rank() -> None:
    cb = Events()
    e = _engine(cb, strategy="checkpoint-restart", checkpoint_every=50, max_iterations=100,
                failures=["rank=1@iter=70,phase=backward"])
    r = e.run()
    rec = r.recoveries[0]
    assert rec.action == "rollback-all" and rec.restored_from == 50
    assert r.updates_lost == 20 * 4 and e.g.live == [0, 1, 2, 3] and _replicas_equal(e)
    assert r.extras["logical_iterations"] == 100 - 21
    assert rec.recovery_seconds >= 1.0 + 5.0  # detection + restart (+ read)
    assert {"checkpoint", "failure", "detection", "recovery"} <= {x["type"] for x in cb.events}
    # Restored parameters and data cursor: the replay is the failure-free run's.
    free = _engine(strategy="checkpoint-restart", checkpoint_every=50, max_iterations=79)
    free.run()
    assert _same(e.params(), free.params())


def test_a_replacement_rejoins_and_the_group_grows_back() -> None:
    cb = Events()
    e = _engine(cb, strategy="rollback", elastic="keep-local", max_iterations=40,
                cost=CostModel(replace_seconds=0.05), failures=["rank=1@iter=10,phase=update"])
    r = e.run()
    joined = [x for x in cb.events if x["type"] == "rank-joined"]
    assert len(joined) == 1 and joined[0]["slots"] == [1] and joined[0]["bytes"] > 0
    assert e.g.live == [0, 1, 2, 3] and _replicas_equal(e)
    assert r.extras["ranks_min"] == 3 and r.extras["ranks_joined"] == 1
    assert e.g.plan().lr_scale == 1.0 and sum(map(len, e.g.plan().share.values())) == 4


def test_failures_during_recovery_and_of_every_rank() -> None:
    e = _engine(strategy="rollback", max_iterations=30, replace=False,
                failures=["rank=1@iter=10,phase=backward", "rank=2@iter=10,phase=recovery"])
    r = e.run()
    assert e.g.live == [0, 3] and r.failures == 2 and len(r.recoveries) == 1
    assert r.recoveries[0].failed == ["rank1", "rank2"]
    # Nobody left to copy from: rollback falls back to a restart (here from scratch).
    e = _engine(strategy="rollback", max_iterations=30, failures=["ranks=all@iter=10"])
    r = e.run()
    assert r.recoveries[0].action == "rollback-all" and r.recoveries[0].restored_from == 0
    assert e.g.live == [0, 1, 2, 3] and r.extras["logical_iterations"] == 20


def test_hang_is_detected_by_the_collective_timeout() -> None:
    cost = CostModel(timeout_seconds=7.0, reform_seconds=0.25)
    e = _engine(strategy="lossy-forward", max_iterations=20, cost=cost,
                failures=["rank=3@iter=5,phase=allreduce:0,mode=hang"])
    r = e.run()
    assert r.recoveries[0].recovery_seconds == pytest.approx(7.25)


def test_mtbf_failures_with_replacements_converge() -> None:
    cost = CostModel(detection_seconds=0.05, reform_seconds=0.05, replace_seconds=0.2)
    s = run_silent(RunConfig(paradigm="dp", strategy="rollback", seed=1, cost=cost,
                             failures=["rank=any@mtbf=0.4s"]))
    assert s.converged and s.failures >= 3 and s.extras["ranks_joined"] >= 1
    assert s.iterations_to_target >= 678  # the failure-free run needs 678


def test_bad_dp_input_is_a_user_error() -> None:
    with pytest.raises(UserError, match="allreduce:K goes from 0 to 3"):
        _engine(strategy="rollback", allreduce_buckets=4,
                failures=["rank=0@iter=1,phase=allreduce:4"])
    with pytest.raises(UserError, match="has 1 bucket .*from 0 to 0"):
        _engine(strategy="rollback", failures=["rank=0@iter=1,phase=allreduce:1"])
    with pytest.raises(UserError, match="no workers"):
        _engine(strategy="rollback", failures=["worker=0@iter=1"])
    with pytest.raises(UserError, match="persist"):
        _engine(strategy="rollback", failures=["rank=0@iter=1,phase=persist"])
    with pytest.raises(UserError, match="data-parallel"):
        _engine(workload="mf", strategy="rollback")
    with pytest.raises(UserError, match="exceeds"):
        _engine(strategy="rollback", ranks=64)


def test_cli_runs_dp_and_rejects_mismatched_strategies(cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "dp"
    r = cli("run", "--paradigm", "dp", "--ranks", "3", "--strategy", "rollback", "--elastic",
            "keep-local", "--allreduce-buckets", "4", "--micro-batches", "2", "--fail",
            "rank=1@iter=20,phase=allreduce:2", "--max-iterations",
            "60", "--quiet", "--out", str(out))
    assert r.code == 0
    s = read_summary(out)
    assert s["paradigm"] == "dp" and s["ranks"] == 3 and s["failures"] == 1
    assert 'paradigm = "dp"' in (out / "config.toml").read_text()
    assert "allreduce_buckets = 4" in (out / "config.toml").read_text()
    assert "micro_batches = 2" in (out / "config.toml").read_text()
    bad = cli("run", "--paradigm", "dp", "--strategy", "scar", "--quiet",
              "--out", str(tmp_path / "x"))
    assert bad.code == 2 and "--paradigm" in bad.err and len(bad.err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


# -- the performance model ------------------------------------------------------
def test_perf_model_formulas() -> None:
    c = pm.DPCosts(step_seconds=0.1, checkpoint_seconds=2.0, mtbf_seconds=3600.0,
                   detection_seconds=1.0, reform_seconds=0.5, restart_seconds=5.0)
    t = pm.young_daly_interval(2.0, 3600.0)
    assert t == pytest.approx(120.0)
    cr = pm.checkpoint_restart(c)
    assert cr.interval_seconds == pytest.approx(120.0)
    assert cr.per_failure_seconds == pytest.approx(60 + 1 + 5 + 2)
    assert cr.fraction == pytest.approx(2 / 120 + 68 / 3600)
    rb, lf = pm.rollback(c), pm.lossy_forward(c)
    assert rb.per_failure_seconds == pytest.approx(1.55) and lf.per_failure_seconds == 1.5
    assert lf.fraction < rb.fraction < cr.fraction
    assert set(pm.predict(c)) == {"checkpoint-restart", "rollback", "lossy-forward"}
    # Young/Daly minimizes the first-order overhead.
    assert all(pm.checkpoint_restart(c, t * f).fraction > cr.fraction for f in (0.5, 2.0))
    shrunk = pm.DPCosts(0.1, 2.0, 3600.0, ranks=4, replace_seconds=40.0, compute_share=0.5)
    assert pm.shrink_seconds(shrunk) == pytest.approx(5.0)
    assert pm.expected_runtime(100.0, lf, 3600.0) == pytest.approx(100 / (1 - 1.5 / 3600))
    with pytest.raises(ValueError, match="no progress"):
        pm.expected_runtime(100.0, cr, 10.0)


def test_perf_model_predicts_the_simulated_cost_of_one_failure() -> None:
    """keep-local and no replacement: the shrunk group steps as fast, so the model's
    per-failure terms are all there is to the simulated overhead."""
    steps, every = 100, 50
    base = dict(elastic="keep-local", replace=False, checkpoint_every=every)
    free = _engine(strategy="checkpoint-restart", max_iterations=steps, **base).run()
    step = free.sim_seconds / steps
    m = CostModel()
    read = free.checkpoint_blocked_seconds / free.checkpoints
    c = pm.DPCosts(step, read, mtbf_seconds=1e6, detection_seconds=m.detection_seconds,
                   reform_seconds=m.reform_seconds, restart_seconds=m.restart_seconds)
    for strategy, model, extra in (("checkpoint-restart", pm.checkpoint_restart(c, every * step),
                                    every // 2 + 1),
                                   ("rollback", pm.rollback(c), 1),
                                   ("lossy-forward", pm.lossy_forward(c), 0)):
        # Fails mid-interval, halfway through a step; run to the same logical progress.
        e = _engine(strategy=strategy, max_iterations=steps + extra, **base,
                    failures=[f"rank=1@iter={every + every // 2},phase=allreduce:0"])
        r = e.run()
        assert r.extras["logical_iterations"] == steps
        measured = r.sim_seconds - free.sim_seconds
        assert math.isclose(measured, model.per_failure_seconds, rel_tol=0.01), (strategy, measured)
