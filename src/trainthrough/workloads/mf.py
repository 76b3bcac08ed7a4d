"""Matrix factorization by (damped) alternating least squares.

Ratings ``R ~ U V^T`` on the observed entries. Parameters are the user factors
``U`` (one row per user) and item factors ``V`` (one row per item); rows are the
parameter-server keys. Even steps solve for ``U`` with ``V`` fixed, odd steps for
``V`` with ``U`` fixed, using the ALS-WR ridge ``reg * n_ratings(row)`` (Zhou et al.,
2008) so the regularization strength does not depend on how active a row is.

Each worker owns a contiguous range of users and a contiguous range of items and
pushes, for its own rows only, ``eta * (solution - current)``. With ``aggregate=sum``
and the ``add`` optimizer the new rows are ``(1 - eta) * current + eta * solution``:

* the update is recomputed from the *other* factor every step, so a perturbed row is
  pulled back towards the ALS solution; the perturbation decays geometrically
  (self-correcting), it is never frozen into the parameters;
* ``eta`` < 1 (damping) keeps convergence linear. Undamped ALS on this data reaches
  its noise floor in a handful of steps, which would make every recovery look free;
  damping gives a range of iterations over which rework cost can be measured.

Data are synthetic (a fixed rank-``rank`` matrix plus noise, drawn from ``data_seed``
so every run sees the same ratings) or a MovieLens file (``ratings_file``); either
way 10% of the observed ratings, chosen by ``data_seed``, are held out for the
metric, test RMSE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainthrough.errors import UserError
from trainthrough.fields import SEED_MAX, Bounds
from trainthrough.workloads._data import check_cells, split_rows
from trainthrough.workloads.base import Evaluation, OptimizerSpec, Params, Workload
from trainthrough.workloads.loaders import load_ratings


@dataclass
class _Side:
    """A worker's rows of one factor and the training ratings that touch them."""

    rows: slice
    mask: torch.Tensor     # sparse (len(rows) x n_other), 1 where rated
    ratings: torch.Tensor  # sparse, same pattern, centered ratings
    counts: torch.Tensor   # ratings per row


@dataclass
class _Part:
    users: _Side
    items: _Side


def _sparse(r: torch.Tensor, c: torch.Tensor, v: torch.Tensor,
            shape: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.stack([r, c]), v, shape, check_invariants=False).coalesce()


class MF(Workload):
    name = "mf"
    description = "matrix factorization by alternating least squares, synthetic low-rank ratings"
    metric_name = "test_rmse"
    direction = "min"
    default_target = 0.14  # synthetic data; a ratings file sets its own in __init__
    update_kind = "delta"
    aggregate = "sum"
    default_optimizer = OptimizerSpec(kind="add", lr=1.0)
    default_max_iterations = 200
    default_eval_every = 1
    default_checkpoint_every = 5
    step_seconds = 0.005
    option_bounds = {"n_users": Bounds(ge=1), "n_items": Bounds(ge=1), "rank": Bounds(ge=1),
                     "density": Bounds(gt=0, le=1), "noise": Bounds(ge=0), "reg": Bounds(ge=0),
                     "eta": Bounds(gt=0, le=1), "init_scale": Bounds(ge=0),
                     "data_seed": Bounds(ge=0, le=SEED_MAX)}

    def __init__(self, n_users: int = 600, n_items: int = 400, rank: int = 8,
                 density: float = 0.15, noise: float = 0.1, reg: float | None = None,
                 eta: float = 0.5, init_scale: float = 0.1, data_seed: int = 0,
                 ratings_file: str | None = None, target: float | None = None,
                 seed: int = 0) -> None:
        if reg is None:
            # Real ratings are far noisier than the synthetic matrix and need the
            # stronger ridge usual for ALS-WR on MovieLens.
            reg = 0.01 if ratings_file is None else 0.05
        self.rank, self.reg, self.eta, self.init_scale = rank, reg, eta, init_scale
        self.seed, self.data_seed, self.ratings_file = seed, data_seed, ratings_file
        g = torch.Generator().manual_seed(data_seed)
        if ratings_file is None:
            self._check_sizes(n_users, n_items, rank, synthetic=True)
            self.density, self.noise = density, noise
            u, i, v = self._synthetic(n_users, n_items, rank, density, noise, g)
            self.n_users, self.n_items = n_users, n_items
            # Ratings have unit variance (test RMSE ~1 at the small init); test RMSE
            # levels off at ~0.12, and 0.14 is first met after 18-24 damped steps
            # (run seeds 0-4, 4 workers), so rework has a range to show up in.
            self.default_target = 0.14
        else:
            r = load_ratings(ratings_file)
            u, i = torch.from_numpy(r.users), torch.from_numpy(r.items)
            v = torch.from_numpy(r.values)
            self.n_users, self.n_items = r.n_users, r.n_items
            self._check_sizes(r.n_users, r.n_items, rank, synthetic=False)
            # Not calibrated on MovieLens itself; ~0.9 is a typical ALS test RMSE there.
            self.default_target = 0.95
        if target is not None:
            self.default_target = target
        if len(v) < 2:  # one to train on, one to test
            raise UserError(f"{ratings_file}: {len(v)} rating; at least 2 are needed"
                            if ratings_file else f"mf: density {density} leaves {len(v)} "
                            "ratings to draw; raise density, n_users or n_items")
        perm = torch.randperm(len(v), generator=g)
        n_test = max(1, len(v) // 10)
        te, tr = perm[:n_test], perm[n_test:]
        self.mean = float(v[tr].mean())  # ALS fits centered ratings
        self.train = (u[tr], i[tr], v[tr] - self.mean)
        self.test = (u[te], i[te], v[te] - self.mean)

    @staticmethod
    def _check_sizes(n_users: int, n_items: int, rank: int, synthetic: bool) -> None:
        if synthetic:
            check_cells("mf", n_users * n_items, "the synthetic rating matrix n_users x n_items")
        check_cells("mf", (n_users + n_items) * rank, "the factors (n_users + n_items) x rank")

    @staticmethod
    def _synthetic(n_users: int, n_items: int, rank: int, density: float, noise: float,
                   g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        u_true = torch.randn(n_users, rank, generator=g)
        v_true = torch.randn(n_items, rank, generator=g)
        observed = torch.rand(n_users, n_items, generator=g) < density
        u, i = observed.nonzero(as_tuple=True)
        clean = (u_true[u] * v_true[i]).sum(1) / rank ** 0.5  # unit variance
        return u, i, clean + noise * torch.randn(len(u), generator=g)

    def init_params(self, gen: torch.Generator) -> Params:
        return {"U": self.init_scale * torch.randn(self.n_users, self.rank, generator=gen),
                "V": self.init_scale * torch.randn(self.n_items, self.rank, generator=gen)}

    def _side(self, own: torch.Tensor, other: torch.Tensor, rows: slice,
              n_other: int) -> _Side:
        v = self.train[2]
        keep = (own >= rows.start) & (own < rows.stop)
        n = rows.stop - rows.start
        r, c = own[keep] - rows.start, other[keep]
        return _Side(rows, _sparse(r, c, torch.ones(len(r)), (n, n_other)),
                     _sparse(r, c, v[keep], (n, n_other)),
                     torch.bincount(r, minlength=n).float())

    def partition(self, num_workers: int) -> list[Any]:
        if num_workers > min(self.n_users, self.n_items):
            raise UserError(f"mf: {num_workers} workers but only {self.n_users} users "
                            f"and {self.n_items} items; each worker needs rows of both")
        u, i, _ = self.train
        return [_Part(self._side(u, i, su, self.n_items), self._side(i, u, si, self.n_users))
                for su, si in zip(split_rows(self.n_users, num_workers),
                                  split_rows(self.n_items, num_workers))]

    def compute_update(self, params: Params, data: Any, state: Any, step: int,
                       seed: int) -> Params:
        # Even steps solve for U given V; odd steps for V given U.
        name, other, side = ("U", "V", data.users) if step % 2 == 0 else ("V", "U", data.items)
        fixed = params[other]
        r = self.rank
        gram = torch.sparse.mm(side.mask, (fixed[:, :, None] * fixed[:, None, :]).reshape(-1, r * r))
        # Rows with no ratings get ridge 1 * reg instead of 0 so the system stays
        # solvable; their solution is then 0 (the prediction falls back to the mean).
        ridge = self.reg * side.counts.clamp(min=1.0)
        a = gram.reshape(-1, r, r) + ridge[:, None, None] * torch.eye(r)
        b = torch.sparse.mm(side.ratings, fixed)
        solution = torch.linalg.solve(a, b)
        delta = torch.zeros_like(params[name])
        delta[side.rows] = self.eta * (solution - params[name][side.rows])
        return {name: delta}

    def _rmse(self, params: Params, data: tuple[torch.Tensor, ...]) -> float:
        u, i, v = data
        pred = (params["U"][u] * params["V"][i]).sum(1)
        return float(((pred - v) ** 2).mean().sqrt())

    def evaluate(self, params: Params) -> Evaluation:
        # The loss is the training RMSE (what ALS minimizes, up to the ridge term).
        return Evaluation(metric=self._rmse(params, self.test),
                          loss=self._rmse(params, self.train))

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rank": self.rank, "reg": self.reg, "eta": self.eta,
                             "init_scale": self.init_scale, "data_seed": self.data_seed}
        if self.ratings_file is None:
            d.update(n_users=self.n_users, n_items=self.n_items, density=self.density,
                     noise=self.noise)
        else:
            d["ratings_file"] = str(self.ratings_file)
        return d
