"""The perturbation a failure and its recovery cause: ``delta = x_after - x_before``.

SCAR's analysis is about ``||delta||``; every engine reports it through this one
function, so the numbers mean the same on ``sim``, ``ray`` and ``gloo``.
"""

from __future__ import annotations

import torch

Params = dict[str, torch.Tensor]
#: Elements converted to float64 at a time: the norm of a model-sized tensor never
#: needs float64 copies of it (at GPT-2 small, its embedding alone would take 1.2 GB).
CHUNK = 2**20


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
        a, b = after[name], before[name]
        if a is b:  # the same tensor (nothing moved): no need to read it
            continue
        a, b = a.reshape(a.shape[0], -1), b.reshape(a.shape[0], -1)
        step = max(1, CHUNK // max(1, a.shape[1]))
        rows = torch.empty(a.shape[0], dtype=torch.float64, device=a.device)
        for i in range(0, a.shape[0], step):
            d = a[i:i + step].double() - b[i:i + step].double()
            rows[i:i + step] = (d * d).sum(1)
        sq += float(rows.sum())
        if lost_rows is not None and name in lost_rows:
            sq_lost += float(rows[lost_rows[name]].sum())
    return sq ** 0.5, sq_lost ** 0.5
