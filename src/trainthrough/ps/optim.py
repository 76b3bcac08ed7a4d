"""Server-side optimizers: what a shard does with an aggregated update.

A shard keeps its optimizer state next to its parameters (it is lost with them),
so the state is a flat dict of tensors that checkpoints can save as they are.
"""

from __future__ import annotations

import math

import torch

from trainthrough.workloads.base import OptimizerSpec

State = dict[str, torch.Tensor]


def init_state(spec: OptimizerSpec, values: dict[str, torch.Tensor]) -> State:
    """Fresh optimizer state for ``values`` (zeros, as a restarted optimizer has)."""
    state: State = {}
    if spec.kind == "momentum":
        state.update({f"{n}.m": torch.zeros_like(v) for n, v in values.items()})
    elif spec.kind == "adam":
        state.update({f"{n}.m": torch.zeros_like(v) for n, v in values.items()})
        state.update({f"{n}.v": torch.zeros_like(v) for n, v in values.items()})
        state["step"] = torch.zeros(1)
    return state


def apply(spec: OptimizerSpec, values: dict[str, torch.Tensor], update: dict[str, torch.Tensor],
          state: State, scale: float = 1.0) -> None:
    """Apply ``update`` to ``values`` in place.

    ``scale`` multiplies the step (the stateless PS shrinks it for a backlog).
    For ``add`` the update is a delta; for the others it is a gradient.
    """
    kind = spec.kind
    if kind == "add":
        for n, u in update.items():
            values[n].add_(u, alpha=scale)
        return
    lr = spec.lr * scale
    if kind == "sgd":
        for n, g in update.items():
            if spec.weight_decay:
                g = g + spec.weight_decay * values[n]
            values[n].add_(g, alpha=-lr)
        return
    if kind == "momentum":
        for n, g in update.items():
            m = state[f"{n}.m"]
            m.mul_(spec.momentum).add_(g)
            values[n].add_(m, alpha=-lr)
        return
    if kind == "adam":
        b1, b2 = spec.betas
        state["step"] += 1
        t = float(state["step"])
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        # The same element-wise operations as one call per operation over all tensors
        # (torch's foreach kernels, bit-identical on CPU): a per-tensor loop pays Python
        # overhead per operation and tensor, and a chain of R replicas applies every
        # update R times (docs/measurements.md).
        gs = list(update.values())
        ms = [state[f"{n}.m"] for n in update]
        vs = [state[f"{n}.v"] for n in update]
        torch._foreach_mul_(ms, b1)
        torch._foreach_add_(ms, gs, alpha=1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, value=1 - b2)
        denom = torch._foreach_div(vs, c2)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, spec.eps)
        torch._foreach_addcdiv_([values[n] for n in update], ms, denom, value=-lr / c1)
        return
    raise ValueError(f"unknown optimizer kind {kind!r}")


def validate(spec: OptimizerSpec) -> None:
    """Raise ValueError on a spec no optimizer can run."""
    if spec.kind not in ("add", "sgd", "momentum", "adam"):
        raise ValueError(f"optimizer must be add, sgd, momentum or adam (got {spec.kind!r})")
    if not (spec.lr > 0 and math.isfinite(spec.lr)):
        raise ValueError(f"learning rate must be a positive number (got {spec.lr})")
