"""The user's own step (loop.step(loss_fn, update=...)), registered state, non-finite
values and the epoch/eval callbacks, on ModuleReplicas in one process.

A "group" here is what every host runs: the shared step (train_step) on simulated
collectives in lock step, share_state for a joiner and the checkpoint writer for a
restart; only the processes are missing (tests/test_loop.py has those).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from trainthrough.dp.allreduce import make_buckets
from trainthrough.dp.batching import Cursor, SampleStream, micro_size, plan_batch
from trainthrough.dp.hooks import Hooks
from trainthrough.dp.module_replica import ModuleReplica, StepFns
from trainthrough.dp.rank import micro_seed
from trainthrough.dp.repair import share_state
from trainthrough.dp.simulated import LockStep, SimCollective, SimInjector
from trainthrough.dp.step import InFlight, StepSpec, train_step
from trainthrough.dp.user_state import check
from trainthrough.errors import UserError
from trainthrough.ft.checkpoint import CheckpointStore
from trainthrough.ft.dp_checkpoint import ReplicaCheckpoint

SAMPLES, PER_RANK, CLIP = 96, 8, 0.05
X = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(3))
Y = (X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])).tanh() + 0.3


class Counter:
    """A user's own stateful object: a step counter and a running sum (tensor)."""

    def __init__(self) -> None:
        self.n, self.total = 0, torch.zeros(2)

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "total": self.total, "shape": (2,), "by_id": {0: 1.5}}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        assert sd["shape"] == (2,) and sd["by_id"] == {0: 1.5}  # tuples, int keys survive
        self.n, self.total = sd["n"], sd["total"].clone()


class Script:
    """A user's training script as a rank builds it: AdamW, warm-up + cosine (LambdaLR),
    a GradScaler, an EMA model, a counter; its update clips on the global norm."""

    def __init__(self, rank: int, kinds: tuple[str, ...] = ("sched", "scaler", "ema", "counter"),
                 poison: tuple[int, int] | None = None) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.05)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / 3) * 0.5 * (1 + torch.cos(
                torch.tensor(s / 40 * 3.14159)).item()))
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        self.ema = AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        self.counter = Counter()
        self.norms: list[float] = []
        self.poison = poison  # (step, rank): that rank's loss is inf at that step
        every = {"sched": self.sched, "scaler": self.scaler, "ema": self.ema,
                 "counter": self.counter}
        self.kinds = kinds
        self.replica = ModuleReplica(rank, self.model, self.opt, lambda rows: (X[rows], Y[rows]),
                                     run_seed=7, registered={k: every[k] for k in kinds})
        self.step_no = 0
        self.replica.begin_step(StepFns(self.loss, self.update))

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.model(x), y)
        if self.poison == (self.step_no, self.replica.rank_id):
            loss = loss * float("inf")
        return self.scaler.scale(loss) if "scaler" in self.kinds else loss

    def update(self) -> None:
        if "scaler" in self.kinds:
            self.scaler.unscale_(self.opt)
        self.norms.append(float(nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)))
        if "scaler" in self.kinds:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        # Only what the run carries (a joiner's unregistered scheduler would start over).
        if "sched" in self.kinds:
            self.sched.step()
        if "ema" in self.kinds:
            self.ema.update_parameters(self.model)
        if "counter" in self.kinds:
            self.counter.n += 1
            self.counter.total += torch.tensor([1.0, float(self.norms[-1])])

    def states(self) -> dict[str, Any]:
        return copy.deepcopy({"sched": self.sched.state_dict(),
                              "scaler": self.scaler.state_dict(),
                              "ema": self.ema.state_dict(), "counter": self.counter.state_dict(),
                              "model": self.model.state_dict()})


class Group:
    """Scripts on simulated ranks taking global steps in lock step (2 micro-batches each)."""

    def __init__(self, scripts: dict[int, Script], micro_batches: int = 2) -> None:
        self.scripts = scripts
        self.stream = SampleStream(SAMPLES, seed=1)
        self.cursor, self.logical = Cursor(), 0
        self.micro = micro_size(PER_RANK, micro_batches)
        self.spec = StepSpec(make_buckets(scripts[0].replica.layout.numel, 3), True)

    def step(self, ranks: int = 3) -> None:
        live = sorted(self.scripts)
        batch = plan_batch(self.stream, self.cursor, ranks * PER_RANK, 1.0, live, self.micro)
        for s in self.scripts.values():
            s.step_no = self.logical
        coll = SimCollective(live)
        fls = {r: InFlight.begin(batch, self.logical,
                                 self.scripts[r].replica.new_grads(separate=True))
               for r in live}
        out = LockStep(lambda _: None, lambda _b, _n: None).run(
            coll, {r: train_step(self.scripts[r].replica, fls[r], coll, SimInjector(), self.spec,
                                 self.logical) for r in live})
        for v in out.values():
            if isinstance(v, BaseException):
                raise v
        self.cursor, self.logical = batch.next_cursor, self.logical + 1

    def rows(self, logical: int, ranks: int = 3) -> torch.Tensor:
        """The global batch of step ``logical`` (replayed from the start)."""
        c = Cursor()
        for _ in range(logical + 1):
            rows, c2 = self.stream.take(c, ranks * PER_RANK)
            c = c2
        return rows


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and (torch.equal(a, b) or (
            a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def test_clipping_uses_the_global_norm_equal_on_all_ranks_and_to_one_process() -> None:
    group = Group({r: Script(r, kinds=("sched", "ema", "counter")) for r in range(3)})
    ref = Script(0, kinds=("sched", "ema", "counter"))  # one process, the global batch
    ref_norms = []
    for logical in range(6):
        group.step()
        rows = group.rows(logical)
        ref.opt.zero_grad()
        ref.step_no = logical
        # Two micro-batches per rank, each its own dropout seed: the reference draws
        # the same masks by computing the mean of the same six micro-batch losses.
        parts = []
        for j in range(6):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(micro_seed(7, logical, j))
                parts.append(ref.loss((X[rows[4 * j:4 * j + 4]], Y[rows[4 * j:4 * j + 4]])))
        torch.stack(parts).mean().backward()
        ref_norms.append(float(nn.utils.clip_grad_norm_(ref.model.parameters(), CLIP)))
        ref.opt.step()
        ref.sched.step()
    norms = [s.norms for s in group.scripts.values()]
    assert norms[0] == norms[1] == norms[2]  # bit-equal: the same reduced gradient
    assert min(ref_norms) > CLIP  # clipping did act at every step
    torch.testing.assert_close(torch.tensor(norms[0]), torch.tensor(ref_norms), rtol=1e-5,
                               atol=1e-7)
    for a, b in zip(ref.model.parameters(), group.scripts[1].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


KINDS = ("sched", "scaler", "ema", "counter")


@pytest.mark.parametrize("kind", KINDS)
def test_a_joiner_and_a_restarted_rank_resume_with_their_peers_state(kind: str,
                                                                    tmp_path: Path) -> None:
    group = Group({r: Script(r, kinds=(kind,)) for r in range(3)})
    for _ in range(5):
        group.step()
    peers = group.scripts[0].states()
    assert _equal(peers[kind], group.scripts[2].states()[kind])

    # A joiner (a fresh process, slot 1 replaced) receives a live peer's state.
    joiner = Script(1, kinds=(kind,))
    assert not _equal(joiner.states()[kind], peers[kind]), "the test must start apart"
    group.scripts[1] = joiner
    coll = SimCollective([0, 1, 2])
    out = LockStep(lambda _: None, lambda _b, _n: None).run(
        coll, {r: share_state(group.scripts[r].replica, coll, [group.logical], holder=r != 1)
               for r in range(3)})
    assert out == {0: [5], 1: [5], 2: [5]}
    assert _equal(joiner.states()[kind], peers[kind])

    # A restarted rank loads the checkpoint the first member wrote.
    ckpt = ReplicaCheckpoint(CheckpointStore(str(tmp_path / "ckpt")), None)
    ckpt.write(ckpt.plan(group.scripts[0].replica, group.logical, group.cursor, [0, 1, 2]))
    restarted = Script(2, kinds=(kind,))
    restarted.replica.load(ckpt.load(group.logical).tensors)
    assert _equal(restarted.states()[kind], peers[kind])
    group.scripts[2] = restarted

    # And they go on as one: the same state after more steps, on every rank.
    for _ in range(3):
        group.step()
    after = [{k: s.states()[k] for k in (kind, "model")} for s in group.scripts.values()]
    assert _equal(after[0], after[1]) and _equal(after[0], after[2])
    assert not _equal(after[0][kind], peers[kind])  # it moved with the steps


def test_a_nan_gradient_under_a_scaler_skips_the_step_on_every_rank() -> None:
    group = Group({r: Script(r, poison=(3, 1)) for r in range(3)})
    for _ in range(3):
        group.step()
    before = [s.states() for s in group.scripts.values()]
    group.step()  # rank 1's loss is inf: its gradient, then the average, is not finite
    after = [s.states() for s in group.scripts.values()]
    for b, a in zip(before, after):
        assert _equal(a["model"], b["model"])  # the optimizer step was skipped
        assert a["scaler"]["scale"] == b["scaler"]["scale"] / 2  # the scaler backed off
    assert _equal(after[0], after[1]) and _equal(after[0], after[2])
    group.step()  # and training goes on
    assert not _equal(group.scripts[0].states()["model"], after[0]["model"])


def test_a_diverged_loss_without_a_scaler_stops_in_one_line() -> None:
    group = Group({r: Script(r, kinds=("sched",), poison=(2, 1)) for r in range(3)})
    group.step()
    group.step()
    with pytest.raises(UserError, match=r"^rank 1: the loss is inf at step 2 \(micro-batch 2\)"):
        group.step()


def test_an_infinite_gradient_without_a_scaler_names_the_rank_and_step() -> None:
    s = Script(0, kinds=())
    flat = torch.zeros(s.replica.layout.numel)
    flat[3] = float("inf")
    with pytest.raises(UserError, match=r"^rank 0: the averaged gradient of step 0 holds 1 "):
        s.replica.apply(flat)


def test_a_scaler_needs_the_users_update() -> None:
    s = Script(0, kinds=("scaler",))
    s.replica.begin_step(StepFns(s.loss))  # no update: opt.step()
    with pytest.raises(UserError, match="update="):
        s.replica.apply(torch.zeros(s.replica.layout.numel))


def test_a_nan_is_a_value_and_a_missing_bucket_is_bookkeeping() -> None:
    s = Script(0, kinds=())
    stream = SampleStream(SAMPLES, 0)
    spec = StepSpec(make_buckets(s.replica.layout.numel, 2), True)
    fl = InFlight.begin(plan_batch(stream, Cursor(), 8, 1.0, [0], 4), 0,
                        s.replica.new_grads(separate=False))
    fl.reduce_into(spec.buckets[0], torch.full((spec.buckets[0].numel,), float("nan")), 1, True)
    with pytest.raises(RuntimeError, match=r"unreduced buckets \[1\]"):
        fl.whole(spec)
    fl.reduce_into(spec.buckets[1], torch.zeros(spec.buckets[1].numel), 1, True)
    assert torch.isnan(fl.whole(spec)).sum() == spec.buckets[0].numel


class Opaque:
    def __init__(self, v: Any) -> None:
        self.v = v

    def state_dict(self) -> dict[str, Any]:
        return {"ok": 1, "inner": {"v": self.v}}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.v = sd["inner"]["v"]


@pytest.mark.parametrize(("obj", "words"), [
    (Opaque({1, 2}), r"'bad' \(Opaque\) cannot be saved .*state_dict\(\)\['inner'\]\['v'\] "
                     r"is a set"),
    (Opaque(lambda: 0), r"\['v'\] is a function"),
    (object(), r"'bad' \(object\) has no state_dict\(\) and load_state_dict\(\)"),
])
def test_state_that_needs_pickle_is_refused_in_one_line(obj: Any, words: str) -> None:
    with pytest.raises(UserError, match=words) as e:
        check({"bad": obj})
    assert "\n" not in str(e.value)


def test_non_finite_floats_and_odd_keys_round_trip() -> None:
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # best = inf at first
    src = ModuleReplica(0, model, opt, lambda r: r, 0, registered={"plateau": plateau})
    model2 = nn.Linear(2, 1)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1)
    plateau2 = torch.optim.lr_scheduler.ReduceLROnPlateau(opt2, patience=99)
    dst = ModuleReplica(0, model2, opt2, lambda r: r, 0, registered={"plateau": plateau2})
    dst.load(src.state())
    assert plateau2.best == float("inf") and plateau2.patience == 10
    with pytest.raises(UserError, match="holds no 'other'"):
        ModuleReplica(0, model2, opt2, lambda r: r, 0,
                      registered={"other": plateau2}).load(src.state())


def test_epoch_and_eval_callbacks_run_once_per_committed_epoch_and_step() -> None:
    seen: list[tuple[str, int]] = []
    h = Hooks(lambda e: seen.append(("epoch", e)), lambda s: seen.append(("eval", s)), every=2)
    for committed, epoch in [(0, 0), (1, 0), (2, 0), (2, 0), (3, 1), (4, 1), (5, 2)]:
        h.before(epoch, committed, seed=0)  # (2, 0) twice: a rolled-back step redone
    assert seen == [("eval", 2), ("epoch", 0), ("eval", 4), ("epoch", 1)]
    # A rank restarted from the checkpoint of step 3 replays what ran after it.
    saved = Hooks(every=2)
    for committed, epoch in [(0, 0), (1, 0), (2, 0), (3, 1)]:
        saved.before(epoch, committed, seed=0)
    seen.clear()
    h.load(saved.state())
    h.before(1, 4, seed=0)
    assert seen == [("eval", 4)]  # epoch 0 had ended before the checkpoint: not again


def test_a_scaled_step_gives_the_update_the_scaled_rate_and_keeps_the_schedule() -> None:
    """keep-local scales the rate for one step; a chainable scheduler stepped in the
    update goes on from the unscaled one, an untouched rate comes back as it was."""
    s = Script(0, kinds=())
    lr0 = s.opt.param_groups[0]["lr"]
    sched = torch.optim.lr_scheduler.StepLR(s.opt, step_size=1, gamma=0.5)
    seen: list[float] = []

    def update(step_sched: bool) -> None:
        seen.append(s.opt.param_groups[0]["lr"])
        s.opt.step()
        if step_sched:
            sched.step()

    flat = torch.zeros(s.replica.layout.numel)
    s.replica.begin_step(StepFns(s.loss, lambda: update(False)))
    s.replica.apply(flat, lr_scale=0.25)
    assert seen == [lr0 * 0.25] and s.opt.param_groups[0]["lr"] == lr0
    s.replica.begin_step(StepFns(s.loss, lambda: update(True)))
    s.replica.apply(flat, lr_scale=0.25)
    assert seen[1] == lr0 * 0.25
    assert s.opt.param_groups[0]["lr"] == pytest.approx(lr0 * 0.5, rel=1e-12)
