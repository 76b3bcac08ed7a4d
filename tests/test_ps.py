"""Layout, shards and server-side optimizers, without an engine."""

from __future__ import annotations

import pytest
import torch

from trainthrough.errors import UserError
from trainthrough.ps import optim
from trainthrough.ps.layout import make_layout
from trainthrough.ps.shard import Shard
from trainthrough.workloads.base import OptimizerSpec


def _params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"W": torch.randn(10, 3, generator=g), "b": torch.randn(3, generator=g),
            "E": torch.randn(4, 2, 2, generator=g)}


@pytest.mark.parametrize("k", [1, 2, 3, 5, 17])
def test_split_assemble_round_trip_and_cover_every_row_once(k: int) -> None:
    p = _params()
    layout = make_layout(p, k)
    assert layout.num_shards == k
    back = layout.assemble(layout.split(p))
    assert all(torch.equal(back[n], p[n]) for n in p)
    rows = sorted((b.name, r) for s in layout.shards for b in s for r in range(b.start, b.stop))
    assert rows == sorted((n, r) for n in p for r in range(p[n].shape[0]))
    assert all(len(s) > 0 for s in layout.shards)


def test_layout_balances_elements() -> None:
    p = {"A": torch.zeros(100, 10), "b": torch.zeros(10)}
    sizes = [sum(b.rows * (10 if b.name == "A" else 1) for b in s)
             for s in make_layout(p, 4).shards]
    assert max(sizes) - min(sizes) <= 20


@pytest.mark.parametrize("k", [0, -1, 18])
def test_impossible_shard_counts_are_user_errors(k: int) -> None:
    with pytest.raises(UserError, match="shards"):
        make_layout(_params(), k)


def test_shard_state_round_trip_restores_values_optimizer_and_version() -> None:
    p = _params()
    layout = make_layout(p, 2)
    spec = OptimizerSpec(kind="adam", lr=0.01)
    s = Shard(0, layout.shards[0], spec, layout.split(p)[0])
    for _ in range(3):
        s.apply({n: torch.ones_like(v) for n, v in s.values.items()})
    state = {k: v.clone() for k, v in s.state_dict().items()}
    s.apply({n: torch.ones_like(v) for n, v in s.values.items()})
    s.load_state_dict(state)
    assert s.version == 3
    assert all(torch.equal(s.state_dict()[k], v) for k, v in state.items())


def test_reset_loses_everything() -> None:
    p = _params()
    s = Shard(0, make_layout(p, 1).shards[0], OptimizerSpec(kind="momentum"), p)
    s.apply({"W": torch.ones(10, 3)})
    s.reset(p)
    assert s.version == 0 and float(s.opt_state["W.m"].abs().sum()) == 0.0


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_server_optimizers_match_torch(kind: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, generator=g)
    grads = [torch.randn(5, 3, generator=g) for _ in range(4)]
    spec = OptimizerSpec(kind=kind, lr=0.05, momentum=0.9)  # type: ignore[arg-type]
    values = {"x": x.clone()}
    state = optim.init_state(spec, values)
    ref = x.clone().requires_grad_(True)
    opt = {"sgd": lambda: torch.optim.SGD([ref], lr=0.05),
           "momentum": lambda: torch.optim.SGD([ref], lr=0.05, momentum=0.9),
           "adam": lambda: torch.optim.Adam([ref], lr=0.05)}[kind]()
    for gr in grads:
        optim.apply(spec, values, {"x": gr}, state)
        ref.grad = gr.clone()
        opt.step()
    assert torch.allclose(values["x"], ref.detach(), atol=1e-6)


def test_add_optimizer_adds_scaled_delta() -> None:
    values = {"x": torch.zeros(2)}
    optim.apply(OptimizerSpec(kind="add"), values, {"x": torch.ones(2)}, {}, scale=0.5)
    assert values["x"].tolist() == [0.5, 0.5]
