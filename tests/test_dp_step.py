"""The shared data-parallel step, its collectives and repair routines, without processes."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from trainthrough.config import CostModel, RunConfig
from trainthrough.dp.allreduce import Bucket, Contribution, FlatLayout, make_buckets
from trainthrough.dp.batching import Cursor, SampleStream, micro_size, plan_batch
from trainthrough.dp.collective import NoFailures, PeerLost, Sequential, run_blocking
from trainthrough.dp.rank import Rank
from trainthrough.dp.relaxed import POINTS as RELAXED_POINTS
from trainthrough.dp.repair import complete, share_state
from trainthrough.dp.simulated import LockStep, SimCollective, SimInjector, Strike
from trainthrough.dp.step import POINTS, InFlight, StepSpec, check_points, train_step
from trainthrough.engines import gloo, sim
from trainthrough.engines.callbacks import Callback
from trainthrough.errors import UserError
from trainthrough.faults.spec import parse
from trainthrough.lab.runner import build_engine, resolve_defaults
from trainthrough.workloads import make_workload


class Solo(Sequential):
    """A blocking collective of one rank (what a gloo group of one does)."""

    members = [0]

    def __init__(self, lose_at_commit: bool = False) -> None:
        self.lose_at_commit = lose_at_commit

    async def allreduce(self, parts: Sequence[Contribution], bucket: Bucket) -> torch.Tensor:
        out = torch.zeros(bucket.numel)
        for _, g in parts:
            out.add_(g[bucket.start:bucket.stop])
        return out

    async def commit(self, parts: Sequence[Contribution], bucket: Bucket,
                     ballot: float) -> tuple[torch.Tensor, float]:
        if self.lose_at_commit:
            raise PeerLost("connection closed")
        return await self.allreduce(parts, bucket), ballot

    async def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        return None


def _setup(ranks: int) -> tuple[Any, dict[int, Rank], StepSpec, Any]:
    w = make_workload("mlr")
    x0 = w.init_params(torch.Generator().manual_seed(0))
    group = {i: Rank(i, w, w.default_optimizer, x0, run_seed=0) for i in range(ranks)}
    spec = StepSpec(make_buckets(FlatLayout(x0).numel, 4), True)
    stream = SampleStream(w.sample_count() or 0, 0)
    batch = plan_batch(stream, Cursor(), 4 * w.batch_size, 1.0, list(group), micro_size(32, 4))
    return w, group, spec, batch


def _quiet() -> LockStep:
    return LockStep(on_point=lambda _: None, on_reduce=lambda _b, _n: None)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_blocking_and_lock_step_hosts_run_the_same_step_bit_for_bit() -> None:
    _, solo, spec, batch = _setup(1)
    fl = InFlight.begin(batch, 0, solo[0].new_grads(separate=False))
    assert run_blocking(train_step(solo[0], fl, Solo(), NoFailures(), spec, 0, lambda: 2.5)) == 2.5
    assert fl.committed and fl.buckets_done == 4 and solo[0].steps == 1
    # Four simulated ranks share the same global batch: the same bits.
    _, group, spec, batch4 = _setup(4)
    coll = SimCollective(list(group))
    fls = {s: InFlight.begin(batch4, 0, group[s].new_grads(separate=True)) for s in group}
    out = _quiet().run(coll, {s: train_step(group[s], fls[s], coll, SimInjector(), spec, 0)
                              for s in group})
    assert out == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert all(_same(group[s].params, solo[0].params) for s in group)


def test_a_step_lost_at_its_commit_never_touched_the_replica() -> None:
    _, solo, spec, batch = _setup(1)
    before = solo[0].state()
    fl = InFlight.begin(batch, 0, solo[0].new_grads(separate=False))
    with pytest.raises(PeerLost) as e:
        run_blocking(train_step(solo[0], fl, Solo(lose_at_commit=True), NoFailures(), spec, 0))
    assert (e.value.phase, e.value.buckets_done) == ("allreduce", 3) and not fl.committed
    back = pickle.loads(pickle.dumps(e.value))  # crosses processes as plain fields
    assert (back.phase, back.buckets_done, back.t) == ("allreduce", 3, e.value.t)
    assert solo[0].steps == 0 and _same(solo[0].state(), before)  # nothing to undo


@pytest.mark.parametrize("point", ["boundary", "forward", "allreduce:2", "update"])
def test_lock_step_strike_then_lossy_completion(point: str) -> None:
    _, group, spec, batch = _setup(4)
    seen: list[str] = []

    def on_point(name: str) -> Strike | None:
        seen.append(name)
        # At the update the step is committed: the survivors apply it, and learn later.
        return Strike((2,), frozenset({0, 1, 3}) if name == "update" else frozenset()) \
            if name == point else None

    coll = SimCollective(list(group))
    fls = {s: InFlight.begin(batch, 0, group[s].new_grads(separate=True)) for s in group}
    out = LockStep(on_point, lambda _b, _n: None).run(
        coll, {s: train_step(group[s], fls[s], coll, SimInjector(), spec, 0) for s in group})
    order = ["boundary", "forward", "backward", *(f"allreduce:{k}" for k in range(4)), "update"]
    assert seen == order[:order.index(point) + 1]
    assert sorted(out) == [0, 1, 3]
    if point == "update":  # committed: every survivor applied it, none lost anything
        assert out == {0: 0.0, 1: 0.0, 3: 0.0} and all(group[s].steps == 1 for s in out)
    else:
        assert all(isinstance(x, PeerLost) for x in out.values())
        assert {x.phase for x in out.values()} == {point.partition(":")[0]}
        assert all(group[s].steps == 0 for s in out)  # uncommitted: never applied
        done = fls[2].buckets_done
        survivors = SimCollective([0, 1, 3])
        group.pop(2)
        res = _quiet().run(survivors, {s: complete(group[s], fls[s], survivors, spec, done)
                                       for s in (0, 1, 3)})
        assert res == {0: 4, 1: 4, 3: 4}
    assert _same(group[0].params, group[1].params) and _same(group[1].params, group[3].params)


def test_a_joiner_with_the_lowest_slot_receives_it_does_not_send() -> None:
    w, group, _, _ = _setup(3)
    group[1].steps = group[2].steps = 7
    for s in (1, 2):
        group[s].params = {n: v + 1 for n, v in group[s].params.items()}
    coll = SimCollective([0, 1, 2])
    out = _quiet().run(coll, {s: share_state(group[s], coll, [s * 10], holder=s != 0)
                              for s in group})
    assert out == {0: [10], 1: [10], 2: [10]}
    assert group[0].steps == 7 and _same(group[0].params, group[1].params)


def test_phases_are_checked_once_for_both_hosts() -> None:
    for caps in (sim.CAPABILITIES["dp"], gloo.CAPABILITIES["dp"]):
        assert set(caps.phases) <= {"", *POINTS, *RELAXED_POINTS, "recovery"}
    check_points(parse(["rank=0@iter=1,phase=allreduce:3"]), 4, sim.CAPABILITIES["dp"].phases,
                 "sim")
    with pytest.raises(UserError, match="allreduce:K goes from 0 to 3"):
        check_points(parse(["rank=0@iter=1,phase=allreduce:4"]), 4, gloo.CAPABILITIES["dp"].phases,
                     "gloo")
    with pytest.raises(UserError, match="phase recovery .* gloo engine; use forward, backward, "
                                        "allreduce:K, update, inner, outer$"):
        check_points(parse(["rank=0@iter=1,phase=recovery"]), 4, gloo.CAPABILITIES["dp"].phases,
                     "gloo")


def test_sim_rank_zero_rejoins_from_a_live_peer() -> None:
    def engine(**kw: Any) -> Any:
        cfg, w = resolve_defaults(RunConfig(paradigm="dp", workload="mlr", stop_at_target=False,
                                            strategy="rollback", **kw))
        return build_engine(cfg, w, Callback(), f"memory://test-dp-step/{id(cfg)}")

    e = engine(max_iterations=40, cost=CostModel(replace_seconds=0.05),
               failures=["rank=0@iter=10,phase=update"])
    r = e.run()
    assert r.extras["ranks_joined"] == 1 and e.g.live == [0, 1, 2, 3]
    free = engine(max_iterations=40)  # struck after its commit: nothing to redo
    free.run()
    assert all(_same(e.g.ranks[s].params, free.params()) for s in e.g.live)
