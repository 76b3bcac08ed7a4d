"""Ridge regression by full-batch gradient descent, built so SCAR's bound holds exactly.

The design matrix has orthonormal columns scaled by sqrt(n), so the Hessian is
``(1 + lam) I``: gradient descent contracts every direction by exactly
``c = 1 - lr (1 + lam)`` per iteration, ``x_k - x* = c^k (x_0 - x*)``. The metric
is the distance to the closed-form optimum ``x*``. These are precisely the
assumptions of the rework bound (a contraction at a known rate), so tests can
check ``rework <= ceil(bound)`` for arbitrary perturbations here; the other
workloads only approximate them (see docs/bound.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainthrough.errors import UserError
from trainthrough.fields import SEED_MAX, Bounds
from trainthrough.workloads._data import check_cells, split_rows
from trainthrough.workloads.base import Evaluation, OptimizerSpec, Params, Workload


@dataclass
class _Part:
    x: torch.Tensor
    y: torch.Tensor
    n_total: int
    workers: int


class Ridge(Workload):
    name = "ridge"
    description = "ridge regression, full-batch GD, isotropic design (the bound holds exactly)"
    metric_name = "distance_to_optimum"
    direction = "min"
    update_kind = "gradient"
    aggregate = "sum"
    default_max_iterations = 2000
    default_eval_every = 1
    default_checkpoint_every = 20
    step_seconds = 0.001
    option_bounds = {"n": Bounds(ge=1), "d": Bounds(ge=1), "lam": Bounds(ge=0),
                     "lr": Bounds(gt=0), "noise": Bounds(ge=0),
                     "data_seed": Bounds(ge=0, le=SEED_MAX)}

    def __init__(self, n: int = 512, d: int = 64, lam: float = 0.1, lr: float = 0.1,
                 noise: float = 0.1, seed: int = 0, data_seed: int = 0) -> None:
        if d > n:  # the design needs d orthonormal columns of length n
            raise UserError(f"ridge: d={d} features need at least as many rows (n={n})")
        check_cells("ridge", n * d, "the design matrix n x d")
        g = torch.Generator().manual_seed(data_seed)
        q, _ = torch.linalg.qr(torch.randn(n, d, generator=g, dtype=torch.float64))
        self.x = q * n ** 0.5
        w_true = torch.randn(d, 1, generator=g, dtype=torch.float64)
        self.y = self.x @ w_true + noise * torch.randn(n, 1, generator=g, dtype=torch.float64)
        self.lam = lam
        self.n = n
        self.optimum = self.x.T @ self.y / (n * (1 + lam))
        self.contraction = 1 - lr * (1 + lam)
        self.default_optimizer = OptimizerSpec(kind="sgd", lr=lr)
        # Target: distance shrunk 10^4-fold from x_0 = 0.
        self.default_target = float(self.optimum.norm()) * 1e-4

    def init_params(self, gen: torch.Generator) -> Params:
        return {"w": torch.zeros_like(self.optimum)}

    def partition(self, num_workers: int) -> list[Any]:
        return [_Part(self.x[s], self.y[s], self.n, num_workers)
                for s in split_rows(self.n, num_workers)]

    def compute_update(self, params: Params, data: Any, state: Any, step: int,
                       seed: int) -> Params:
        w = params["w"]
        # Summed over workers this is the full gradient: X^T(Xw - y)/n + lam w.
        grad = data.x.T @ (data.x @ w - data.y) / data.n_total + self.lam * w / data.workers
        return {"w": grad}

    def evaluate(self, params: Params) -> Evaluation:
        w = params["w"]
        dist = float((w - self.optimum).norm())
        loss = float(((self.x @ w - self.y) ** 2).mean() / 2 + self.lam / 2 * (w * w).sum())
        return Evaluation(metric=dist, loss=loss)

    def describe(self) -> dict[str, Any]:
        return {"contraction": self.contraction}
