"""The perturbation a failure and its recovery cause: ``delta = x_after - x_before``.

SCAR's analysis is about ``||delta||``; every engine reports it through this one
function, so the numbers mean the same on ``sim``, ``ray`` and ``gloo``.
"""

from __future__ import annotations

import torch

Params = dict[str, torch.Tensor]


def perturbation(before: Params | None, after: Params | None,
                 lost_rows: dict[str, torch.Tensor] | None = None) -> tuple[float, float]:
    """``(||delta||, ||delta restricted to lost_rows||)`` in float64.

    Args:
        before: the parameters just before the failure (None: unknown).
        after: the parameters once recovery is done (None: unknown).
        lost_rows: per parameter, a boolean mask over its first dimension marking the
            rows that were lost (partial recovery); None: no split is made.

    Returns:
        ``(nan, nan)`` when either side is unknown, rather than a number that is not one.
    """
    if before is None or after is None:
        return float("nan"), float("nan")
    sq = sq_lost = 0.0
    for name in sorted(after):
        d = (after[name].double() - before[name].double()).reshape(after[name].shape[0], -1)
        rows = (d * d).sum(1)
        sq += float(rows.sum())
        if lost_rows is not None and name in lost_rows:
            sq_lost += float(rows[lost_rows[name]].sum())
    return sq ** 0.5, sq_lost ** 0.5
