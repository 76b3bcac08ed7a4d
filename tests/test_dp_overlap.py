"""Buckets started from the backward, gradients summed in place, state shared in place:
the shared step on a host that overlaps, without processes (tests/test_loop.py runs
it on gloo)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainthrough.dp.allreduce import (
    BUCKET_BYTES,
    FIRST_BUCKET_BYTES,
    Bucket,
    Contribution,
    make_buckets,
    plan_buckets,
)
from trainthrough.dp.batching import Cursor, SampleStream, micro_size, plan_batch
from trainthrough.dp.collective import NoFailures, PeerLost, run_blocking
from trainthrough.dp.module_replica import ModuleReplica, StepFns
from trainthrough.dp.repair import complete, share_state
from trainthrough.dp.simulated import LockStep, SimCollective
from trainthrough.dp.step import InFlight, StepSpec, check_points, train_step
from trainthrough.engines import gloo
from trainthrough.errors import UserError
from trainthrough.faults.spec import parse

from .test_dp_step import Solo

X = torch.randn(64, 12, generator=torch.Generator().manual_seed(3))
Y = (X[:, 0] > X[:, 1]).long()


def _replica(seed: int = 0) -> ModuleReplica:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 16),
                          nn.Tanh(), nn.Linear(16, 3))
    r = ModuleReplica(0, model, torch.optim.AdamW(model.parameters(), lr=0.01),
                      lambda rows: (X[rows], Y[rows]), run_seed=5)
    r.begin_step(StepFns(lambda b: F.cross_entropy(model(b[0]), b[1])))
    return r


class Overlapping(Solo):
    """A group of one whose buckets start at once and finish when waited for; it
    records, per start, whether the first layer's gradient (the backward's last) was
    whole, and loses its peer when waiting for bucket ``lose_at``."""

    overlaps = True

    def __init__(self, replica: ModuleReplica, lose_at: int | None = None) -> None:
        super().__init__()
        self.lose_at, self.started = lose_at, []
        self.first_done = False
        first = next(replica.model.parameters())
        first.register_post_accumulate_grad_hook(lambda _p: setattr(self, "first_done", True))

    async def start(self, parts: Sequence[Contribution], bucket: Bucket) -> Any:
        self.started.append((bucket.index, self.first_done))
        return bucket.index, await self.allreduce(parts, bucket)

    async def wait(self, handle: Any) -> torch.Tensor:
        index, total = handle
        if index == self.lose_at:
            raise PeerLost("connection closed")
        return total  # type: ignore[no-any-return]


class Points:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def at(self, point: str, step: int) -> None:
        self.seen.append(point)


def _steps(r: ModuleReplica, coll: Any, buckets: int, steps: int = 3) -> list[float]:
    """``steps`` steps of one micro-batch each (the one under way is the only one)."""
    spec = StepSpec(make_buckets(r.layout.numel, buckets), True)
    stream, cursor = SampleStream(64, 0), Cursor()
    for step in range(steps):
        batch = plan_batch(stream, cursor, 16, 1.0, [0], micro_size(16, 1))
        fl = InFlight.begin(batch, step, r.new_grads(separate=False))
        run_blocking(train_step(r, fl, coll, NoFailures(), spec, step))
        cursor = batch.next_cursor
    return [float(v) for p in r.model.parameters() for v in p.detach().reshape(-1)]


def test_buckets_start_in_the_backward_in_order_and_take_the_same_step() -> None:
    r = _replica()
    coll = Overlapping(r)
    after = _steps(r, coll, buckets=4)
    # Buckets 0-2 start from the backward (the first layer's gradient not yet whole),
    # in order; the last, with the vote, after it.
    assert coll.started[:1] == [(0, False)] and [i for i, _ in coll.started[:3]] == [0, 1, 2]
    assert after == _steps(_replica(), Solo(), buckets=4) == _steps(_replica(), Solo(), 1)


def test_points_keep_their_order_when_buckets_start_in_the_backward() -> None:
    r = _replica()
    spec = StepSpec(make_buckets(r.layout.numel, 3), True)
    batch = plan_batch(SampleStream(64, 0), Cursor(), 16, 1.0, [0], micro_size(16, 1))
    fl = InFlight.begin(batch, 0, r.new_grads(separate=False))
    inj = Points()
    run_blocking(train_step(r, fl, Overlapping(r), inj, spec, 0))
    assert inj.seen == ["boundary", "forward", "backward", "allreduce:0", "allreduce:1",
                        "allreduce:2", "update"]


@pytest.mark.parametrize("lose_at", [0, 1])
def test_a_loss_found_inside_the_backward_completes_to_the_same_step(lose_at: int) -> None:
    """Bucket ``lose_at`` fails while the backward still runs (bucket ``lose_at + 1``
    was starting): the gradient is partly summed, and lossy forward on the one
    survivor must still give the step the uninterrupted one gives."""
    free = _replica()
    expect = _steps(free, Solo(), buckets=4, steps=1)
    r = _replica()
    spec = StepSpec(make_buckets(r.layout.numel, 4), True)
    batch = plan_batch(SampleStream(64, 0), Cursor(), 16, 1.0, [0], micro_size(16, 1))
    fl = InFlight.begin(batch, 0, r.new_grads(separate=False))
    with pytest.raises(PeerLost) as e:
        run_blocking(train_step(r, fl, Overlapping(r, lose_at=lose_at), NoFailures(), spec, 0))
    assert (e.value.phase, e.value.buckets_done) == ("allreduce", lose_at)
    assert fl.grads.indices == [] and r.steps == 0  # its backward was cut short
    assert run_blocking(complete(r, fl, Solo(), spec, lose_at)) == 0
    assert [float(v) for p in r.model.parameters() for v in p.detach().reshape(-1)] == expect


def test_rewind_keeps_this_ranks_share_of_a_bucket_a_peer_did_not_finish() -> None:
    r = _replica()
    spec = StepSpec(make_buckets(r.layout.numel, 3), True)
    batch = plan_batch(SampleStream(64, 0), Cursor(), 16, 1.0, [0], micro_size(16, 1))
    fl = InFlight.begin(batch, 0, r.new_grads(separate=False))
    r.gradients(0, batch.share[0], fl.grads)
    mine = fl.grads.contributions()[0][1].clone()
    b0, b1 = spec.buckets[:2]
    fl.reduce_into(b0, torch.full((b0.numel,), 6.0), 2, True)
    fl.reduce_into(b1, torch.full((b1.numel,), 8.0), 2, True)  # held until the next one
    fl.rewind(1)  # a peer finished bucket 0 only: bucket 1 is this rank's share again
    assert fl.done == [True] and torch.equal(fl.reduced[b1.start:b1.stop], mine[b1.start:b1.stop])
    assert bool((fl.reduced[:b0.stop] == 3.0).all())
    fl.reduce_into(b1, torch.full((b1.numel,), 8.0), 2, True)
    fl.rewind(2)  # every survivor finished bucket 1: its result stays
    assert bool((fl.reduced[b1.start:b1.stop] == 4.0).all())


def test_buckets_are_sized_by_bytes_as_ddps_unless_counted() -> None:
    assert plan_buckets(1_000_000, None) == make_buckets(1_000_000, 1)  # a small model: one
    numel = 30_000_000  # 120 MB of float32
    b = plan_buckets(numel, None)
    assert b[0].numel * 4 == FIRST_BUCKET_BYTES and b[-1].stop == numel
    assert all(x.numel * 4 == BUCKET_BYTES for x in b[1:-1])
    assert BUCKET_BYTES <= b[-1].numel * 4 < 2 * BUCKET_BYTES
    assert plan_buckets(numel, 3) == make_buckets(numel, 3)


def test_a_user_loop_strikes_past_bucket_0_only_with_a_bucket_count() -> None:
    phases = gloo.CAPABILITIES["dp"].phases
    check_points(parse(["rank=0@iter=1,phase=allreduce:0"]), None, phases, "gloo")
    with pytest.raises(UserError, match=r"sized by bytes .* \(--allreduce-buckets\)"):
        check_points(parse(["rank=0@iter=1,phase=allreduce:1"]), None, phases, "gloo")


def test_a_joiner_receives_into_its_own_parameters_and_the_donor_copies_nothing() -> None:
    donor, joiner = _replica(0), _replica(1)
    donor.rank_id, joiner.rank_id = 0, 1
    _steps(donor, Solo(), buckets=2, steps=1)  # the donor's optimizer holds state
    where = [p.data_ptr() for p in joiner.model.parameters()]
    def big(state: dict[str, torch.Tensor]) -> list[int]:  # the model-sized entries
        return [v.data_ptr() for k, v in state.items() if k.startswith(("params/", "optim/state"))
                and v.numel() > 1]

    live = big(donor.state(copy=False))
    coll = SimCollective([0, 1])
    out = LockStep(lambda _: None, lambda _b, _n: None).run(
        coll, {0: share_state(donor, coll, [4, 2]), 1: share_state(joiner, coll, [0, 0], False)})
    assert out == {0: [4, 2], 1: [4, 2]}
    assert [p.data_ptr() for p in joiner.model.parameters()] == where  # received in place
    a, b = donor.state(), joiner.state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The donor's state() hands out its live tensors: no copy of the model to send.
    assert live == big(donor.state(copy=False)) and len(live) == 3 * 6


class Odd(nn.Module):
    """A model with a frozen layer, an unused parameter and a float64 one."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(12, 12).requires_grad_(False)
        self.body = nn.Linear(12, 3)
        self.unused = nn.Parameter(torch.ones(5))
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.frozen(x)) * self.scale.float()


def test_a_stale_vector_is_written_whole_by_the_first_micro_batch() -> None:
    """The replica's vector is not zeroed between steps: the first micro-batch copies
    its gradients in, and what has none (frozen, unused) becomes zeros; the sum is the
    same bits as the micro-batches kept apart and added."""
    torch.manual_seed(0)
    model = Odd()
    r = ModuleReplica(0, model, torch.optim.SGD(model.parameters(), lr=0.1),
                      lambda rows: (X[rows], Y[rows]), run_seed=5)
    r.begin_step(StepFns(lambda b: F.cross_entropy(model(b[0]), b[1])))
    micro = plan_batch(SampleStream(64, 0), Cursor(), 16, 1.0, [0], 8).share[0]
    summed = r.new_grads(separate=False)
    assert summed.flat is not None and summed.fresh
    summed.flat.fill_(float("nan"))  # what a last step could have left
    r.gradients(0, micro, summed)
    apart = r.new_grads(separate=True)
    r.gradients(0, micro, apart)
    assert torch.equal(summed.flat, apart.parts[0][1] + apart.parts[1][1])
    # Nothing stale is left: the frozen layer and the unused parameter are zeros.
    assert bool(torch.isfinite(summed.flat).all())
    assert int((summed.flat == 0).sum()) >= 12 * 12 + 12 + 5
    assert model.scale.grad is None  # float64: moved in by its hook, no view
