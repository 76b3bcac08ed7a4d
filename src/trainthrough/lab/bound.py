"""SCAR's rework-cost bound, and the estimate of the contraction rate it needs.

For an iterative-convergent algorithm that contracts toward ``x*`` at rate ``c < 1``,
``||x_k - x*|| <= c^k ||x_0 - x*||``. Perturbations ``delta_j`` at iterations ``T_j``
(a failure and its recovery) give ``||y_k - x*|| <= c^k (D + sum_j c^-T_j ||delta_j||)``
with ``D = ||x_0 - x*||``, so the extra iterations needed to reach any accuracy are at
most ``log_{1/c}(1 + sum_j c^-T_j ||delta_j|| / D)`` (docs/bound.md has the derivation,
assumptions and where they fail).

``c`` is estimated from a failure-free run: the distance of each evaluated iterate to
the final one (which stands in for ``x*``; baselines run 50% past the target for it),
fitted as ``log d_k = a + k log c`` by least squares over the linear-convergence phase,
taken as the iterates with ``d_0/100 <= d_k <= d_0/2`` (after the initial transient,
before the final iterate's own noise dominates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from trainthrough.engines.callbacks import Callback


class IterateTracker(Callback):
    """Keeps a flat float64 copy of the parameters at every evaluation."""

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.iterates: list[torch.Tensor] = []

    def on_params(self, iteration: int, params: dict[str, Any]) -> None:
        self.iterations.append(iteration)
        self.iterates.append(torch.cat([params[n].detach().reshape(-1).double()
                                        for n in sorted(params)]))


@dataclass(frozen=True)
class Contraction:
    """A fitted contraction: rate ``c``, ``D = ||x_0 - x*||``, and the fit's support."""

    c: float
    distance0: float
    points: int
    r2: float

    def bound(self, perturbations: list[tuple[int, float]]) -> float:
        """Upper bound on rework iterations for ``(iteration, ||delta||)`` pairs.

        Returns ``inf`` when the run did not contract (``c >= 1``) or ``D`` is 0.
        """
        if not perturbations:
            return 0.0
        if not 0 < self.c < 1 or self.distance0 <= 0:
            return math.inf
        # Sum in log space: c^-T overflows for large T.
        log_terms = [math.log(n) - t * math.log(self.c) for t, n in perturbations if n > 0]
        if not log_terms:
            return 0.0
        m = max(log_terms)
        log_s = m + math.log(sum(math.exp(x - m) for x in log_terms)) - math.log(self.distance0)
        log_ratio = log_s if log_s > 30 else math.log1p(math.exp(log_s))  # log(1 + S/D)
        return log_ratio / -math.log(self.c)


def fit_contraction(iterations: list[int], iterates: list[torch.Tensor],
                    lo: float = 0.01, hi: float = 0.5) -> Contraction | None:
    """Fit ``c`` from a failure-free trajectory (see module docstring).

    Returns None when fewer than 3 iterates fall in the fitting window.
    """
    if len(iterates) < 3:
        return None
    final = iterates[-1]
    d = torch.stack([(x - final).norm() for x in iterates]).double()
    d0 = float(d[0])
    if d0 <= 0:
        return None
    ks = torch.tensor(iterations, dtype=torch.float64)
    mask = (d >= lo * d0) & (d <= hi * d0)
    # Only the prefix before the distance first drops below the window: the tail
    # near the final iterate is noise around x*, not contraction.
    below = torch.nonzero(d < lo * d0)
    if below.numel():
        mask[int(below[0]):] = False
    if int(mask.sum()) < 3:
        return None
    x, y = ks[mask], torch.log(d[mask])
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
    resid = y - (ym + slope * (x - xm))
    ss = float(((y - ym) ** 2).sum())
    r2 = 1 - float((resid ** 2).sum()) / ss if ss > 0 else 1.0
    return Contraction(c=math.exp(slope), distance0=d0, points=int(mask.sum()), r2=r2)
