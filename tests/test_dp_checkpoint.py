"""Data-parallel checkpoints and perturbations, once for both hosts, without processes.

One save/restore module (ft/dp_checkpoint.py) used by sim and by the gloo ranks; one
Checkpointer that counts every save (sim's backend, the gloo controller's backend fed
by rank 0's reports); the checkpoint of a gloo restart chosen once and loaded exactly;
and the failure-free replica a recovery's perturbation is measured against.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from trainthrough.config import CostModel, RunConfig
from trainthrough.dp.allreduce import FlatLayout, make_buckets
from trainthrough.dp.batching import Cursor, SampleStream, micro_size, plan_batch
from trainthrough.dp.collective import run_blocking
from trainthrough.dp.rank import Rank
from trainthrough.dp.reference import failure_free
from trainthrough.dp.simulated import LockStep, SimCollective, SimInjector, Strike
from trainthrough.dp.step import InFlight, StepSpec, train_step
from trainthrough.engines.callbacks import Callback
from trainthrough.engines.gloo.checkpoints import ControllerSaves, RankSaves
from trainthrough.engines.gloo.messages import Before, Saved
from trainthrough.errors import CheckpointCorrupt
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ft.dp_checkpoint import ReplicaCheckpoint
from trainthrough.ft.perturbation import perturbation
from trainthrough.ft.strategy import resolve
from trainthrough.lab.runner import build_engine, resolve_defaults
from trainthrough.workloads import make_workload

from .test_dp_step import Solo  # a blocking collective of one (a gloo group of one)


def _rank(slot: int = 0) -> Rank:
    w = make_workload("mlr")
    return Rank(slot, w, w.default_optimizer, w.init_params(torch.Generator().manual_seed(0)), 0)


def _step(rank: Rank) -> None:
    rank.apply(torch.full((rank.layout.numel,), 0.01))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def _flip(folder: Path) -> None:
    f = sorted(folder.glob("*.safetensors"))[0]
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))


# -- what is saved, and its restore -------------------------------------------------
def test_a_save_holds_the_replica_and_the_cursor_and_loads_exactly_the_step_asked(
        tmp_path: Path) -> None:
    r = _rank()
    saver = ReplicaCheckpoint(CheckpointStore(str(tmp_path)), r)
    kept = {}
    for step in (5, 10):
        _step(r)
        p = saver.plan(r, step, Cursor(1, step * 8), [0, 2])
        assert p.payload_bytes == r.state_bytes + 8  # + the replica's step count
        assert saver.write(p).step == step
        kept[step] = {n: v.clone() for n, v in r.params.items()}
    _step(r)  # the replica moves on; the saves do not
    newest = saver.latest(on_corrupt=pytest.fail)
    assert newest is not None and newest.step == 10 and newest.cursor == Cursor(1, 80)
    assert _same(newest.params, kept[10]) and newest.tensors["meta/steps"].item() == 2
    older = saver.load(5)  # the one asked for, although a newer one is valid
    assert older.step == 5 and older.cursor == Cursor(1, 40) and _same(older.params, kept[5])
    _flip(tmp_path / "ckpt-00000010")
    skipped: list[str] = []
    assert saver.latest(skipped.append).step == 5  # type: ignore[union-attr]
    assert len(skipped) == 1 and "ckpt-00000010" in skipped[0]
    with pytest.raises(CheckpointCorrupt, match="ckpt-00000010"):
        saver.load(10)  # never another one in its place


def test_gloo_rank_0_reports_its_saves_and_the_controller_counts_them(tmp_path: Path) -> None:
    cfg = RunConfig(paradigm="dp", strategy="checkpoint-restart", checkpoint_every=5)
    strategy, url = resolve(cfg.strategy), str(tmp_path)
    posted: list[Saved] = []
    events: list[dict[str, Any]] = []
    rank = RankSaves(cfg, strategy, url, _rank(), 5, posted.append)
    ctl = ControllerSaves(cfg, strategy, url, _rank(), 5,
                          lambda e: events.append(e.to_record()))

    def commit(replica: Rank, logical: int) -> None:
        rank.after_commit(replica, logical, Cursor(0, logical), [0, 1])
        while posted:
            ctl.on_saved(posted.pop(0))

    replica = _rank()
    for logical in range(1, 11):
        _step(replica)
        commit(replica, logical)
    saves = [e for e in events if e["type"] == "checkpoint"]
    assert [e["iteration"] for e in saves] == [5, 10] and ctl.checkpointer.count == 2
    assert saves[0]["names"] == ["ckpt-00000005"] and saves[0]["fraction"] == 1.0
    assert ctl.checkpointer.bytes == sum(e["bytes"] for e in saves) > 2 * replica.state_bytes
    # A report the policy did not ask for is not a checkpoint; a failed write is reported.
    ctl.on_saved(Saved(iteration=12, payload=1, blocked_seconds=0.0, bytes=9, name="x"))
    ctl.on_saved(Saved(iteration=15, payload=1, blocked_seconds=0.0, error="disk full"))
    assert ctl.checkpointer.count == 2 and events[-1]["type"] == "checkpoint-failed"
    assert ctl.checkpointer.failed == 1
    # Rank 0's own write refused by the storage: posted as a failed save, not raised
    # (the rank trains on), naming the checkpoint and the reason.
    def full(path: str, *_: Any) -> Any:
        raise OSError(28, "No space left on device", path)
    store = rank.saver.store  # type: ignore[union-attr]
    store._open_write = store._write = full  # type: ignore[method-assign]
    rank.after_commit(replica, 20, Cursor(0, 20), [0, 1])
    assert "ckpt-00000020 could not be written" in str(posted[-1].error)
    assert "No space left on device" in str(posted[-1].error)
    posted.clear()
    del store._open_write, store._write
    # A restart: the controller picks one checkpoint (skipping a corrupt one, once) for
    # every rank, and its Checkpointer asks again about the iterations after it.
    _flip(tmp_path / "ckpt-00000010")
    corrupt: list[str] = []
    # The first survivor measures the restart against the checkpoint the controller
    # will choose (its replica never travels), and sends the number.
    survivor = {n: v + 1 for n, v in replica.params.items()}
    measured = rank.restart_perturbation(survivor, x0=None)
    ctl.before = Before(step=measured[0], perturbation=measured[1])
    step, norm = ctl.choose(corrupt.append)
    assert step == 5 and len(corrupt) == 1 and "ckpt-00000010" in corrupt[0]
    tensors, cursor = rank.load(5)
    restarted = _rank()
    restarted.load(tensors)
    assert cursor == Cursor(0, 5) and restarted.steps == 5
    # The restart's perturbation: from the survivor's replica to the checkpoint loaded.
    assert norm == perturbation(survivor, restarted.params)[0] > 0
    step, norm = ctl.choose(corrupt.append)  # no survivor sent its measure: unknown
    assert step == 5 and math.isnan(norm)
    # Measured against another checkpoint than the one chosen: unknown, never wrong.
    ctl.before = Before(step=10, perturbation=1.0)
    assert math.isnan(ctl.choose(corrupt.append)[1])
    for logical in range(6, 11):
        _step(restarted)
        commit(restarted, logical)
    assert [e["iteration"] for e in events if e["type"] == "checkpoint"] == [5, 10, 10]
    # The chosen step is loaded or the rank fails loudly: no fallback to another one.
    _flip(tmp_path / "ckpt-00000005")
    with pytest.raises(RuntimeError, match="checkpoint 5, which the controller chose"):
        rank.load(5)


def test_a_run_without_checkpoints_restarts_from_x0() -> None:
    cfg = RunConfig(paradigm="dp", strategy="rollback")
    template = _rank()
    ctl = ControllerSaves(cfg, resolve(cfg.strategy), "memory://dp-none", template, 5,
                          pytest.fail)
    rank = RankSaves(cfg, resolve(cfg.strategy), "memory://dp-none", template, 5, pytest.fail)
    step, norm = rank.restart_perturbation(template.params, x0=lambda: template.params)
    ctl.before = Before(step=step, perturbation=norm)
    assert ctl.choose(pytest.fail) == (None, 0.0)  # back to x0, from x0
    moved = {n: v + 1 for n, v in template.params.items()}
    assert rank.restart_perturbation(moved, x0=lambda: template.params)[1] > 0
    assert math.isnan(rank.restart_perturbation(moved, x0=None)[1])  # x0 unknown


def test_sim_dp_saves_go_through_the_one_checkpointer() -> None:
    events: list[dict[str, Any]] = []

    class Events(Callback):
        def on_event(self, event: dict[str, Any]) -> None:
            events.append(event)

    cfg, w = resolve_defaults(RunConfig(
        paradigm="dp", workload="mlr", strategy="base=checkpoint-restart,persist=async",
        checkpoint_every=10, max_iterations=60, stop_at_target=False,
        allreduce_buckets=4, cost=CostModel(storage_bandwidth=1e5),
        failures=["rank=0@iter=21,phase=allreduce:1"]))
    e = build_engine(cfg, w, Events(), "memory://test-dp-checkpoint/async")
    r = e.run()
    saves = [x for x in events if x["type"] == "checkpoint"]
    assert r.checkpoints == len(saves) == e.ckpt.checkpointer.count  # type: ignore[attr-defined]
    assert r.checkpoint_bytes == sum(x["bytes"] for x in saves)
    assert all(x["async"] and x["names"] == [f"ckpt-{x['iteration']:08d}"] for x in saves)
    # The writer (rank 0) died with its write in flight: that save never counted.
    assert {"type": "checkpoint-abandoned", "rank": 0} in [
        {k: v for k, v in x.items() if k != "sim_seconds"} for x in events]


# -- the failure-free reference -----------------------------------------------------
def _group(ranks: int) -> tuple[dict[int, Rank], StepSpec, Any]:
    w = make_workload("mlr")
    x0 = w.init_params(torch.Generator().manual_seed(0))
    group = {i: Rank(i, w, w.default_optimizer, x0, run_seed=0) for i in range(ranks)}
    spec = StepSpec(make_buckets(FlatLayout(x0).numel, 4), True)
    batch = plan_batch(SampleStream(w.sample_count() or 0, 0), Cursor(), 4 * w.batch_size, 1.0,
                       list(group), micro_size(w.batch_size, 4))
    return group, spec, batch


def _quiet() -> LockStep:
    return LockStep(on_point=lambda _: None, on_reduce=lambda _b, _n: None)


def _run(group: dict[int, Rank], spec: StepSpec, batch: Any, strike: str | None
         ) -> dict[int, InFlight]:
    coll = SimCollective(list(group))
    fls = {s: InFlight.begin(batch, 0, group[s].new_grads(separate=True)) for s in group}

    def on_point(name: str) -> Strike | None:
        return Strike((3,)) if name == strike else None

    LockStep(on_point, lambda _b, _n: None).run(
        coll, {s: train_step(group[s], fls[s], coll, SimInjector(), spec, 0) for s in group})
    return fls


@pytest.mark.parametrize("point", ["forward", "allreduce:0", "allreduce:2"])
def test_the_survivors_compute_the_failure_free_step_bit_for_bit_in_sim(point: str) -> None:
    free, spec, batch = _group(4)
    _run(free, spec, batch, strike=None)
    group, _, _ = _group(4)
    fls = _run(group, spec, batch, strike=point)
    group.pop(3)
    assert group[0].steps == 0 and not fls[0].committed  # nothing applied yet
    coll = SimCollective([0, 1, 2])
    done = fls[0].buckets_done
    out = _quiet().run(coll, {s: failure_free(group[s], fls[s], coll, spec, done)
                              for s in coll.members})
    # The first member measures (the others make the collectives, not the copy).
    assert _same(out[0], free[0].params) and out[1] is None and out[2] is None
    assert not _same(group[0].params, free[0].params)  # measuring applied nothing


def test_a_blocking_host_computes_the_same_reference_and_none_when_nothing_was_lost() -> None:
    free, spec, batch = _group(2)
    _run(free, spec, batch, strike=None)
    survivor = _group(2)[0][0]
    fl = InFlight.begin(batch, 0, survivor.new_grads(separate=False))
    survivor.gradients(0, batch.share[0][:1], fl.grads)  # rank 1 died in the forward
    ref = run_blocking(failure_free(survivor, fl, Solo(), spec, 0))
    assert ref is not None
    assert max(float((ref[n] - v).abs().max()) for n, v in free[0].params.items()) <= 1e-6
    assert len(fl.grads.indices) == len(batch.share[0])  # its own share is now complete
    # Every bucket reduced before the failure: the completion is the failure-free step.
    assert run_blocking(failure_free(survivor, fl, Solo(), spec, len(spec.buckets))) is None
