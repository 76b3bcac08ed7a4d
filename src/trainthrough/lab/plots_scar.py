"""The SCAR suite's scatter: rework vs perturbation norm, with the bound drawn."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from trainthrough.lab.plots import DPI, strategy_colors


def _bound(c: float, d0: float, at: int, norm: float) -> float:
    return math.log1p(norm / (c ** at * d0)) / -math.log(c)


def plot_rework_vs_perturbation(rows: list[dict[str, Any]], out: Path) -> Path:
    """One panel per workload: a point per run, and the bound as a curve of the norm.

    The curve uses the mean fitted contraction and distance over the seeds and the
    failure iteration of the suite, so points sit near it but need not be under it.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    colors = strategy_colors(r["strategy"] for r in rows)
    fig = Figure(figsize=(4.2 * len(workloads), 4.0), dpi=DPI)
    axes = fig.subplots(1, len(workloads), squeeze=False)[0]
    for ax, w in zip(axes, workloads):
        rs = [r for r in rows if r["workload"] == w and r.get("rework_iterations") is not None
              and r.get("perturbation_norm")]
        for s in dict.fromkeys(r["strategy"] for r in rs):
            pts = [r for r in rs if r["strategy"] == s]
            ax.scatter([r["perturbation_norm"] for r in pts],
                       [r["rework_iterations"] for r in pts], s=18, alpha=0.75,
                       color=colors[s], label=s)
        fits = [r for r in rs if r.get("contraction") and r.get("rework_bound") is not None]
        if fits:
            c = sum(r["contraction"] for r in fits) / len(fits)
            # Recover D from one run's bound: bound = log1p(n / (c^T D)) / -log c.
            d0s = []
            for r in fits:
                at = _at(r)
                b = r["rework_bound"]
                if 0 < c < 1 and b and b > 0 and at is not None:
                    d0s.append(r["perturbation_norm"] / (c ** at * math.expm1(b * -math.log(c))))
            at = _at(fits[0])
            if d0s and at is not None:
                d0 = sum(d0s) / len(d0s)
                hi = max(r["perturbation_norm"] for r in rs) * 1.1
                xs = [hi * i / 50 for i in range(1, 51)]
                ax.plot(xs, [_bound(c, d0, at, x) for x in xs], "k--", lw=1,
                        label=f"bound (c={c:.4f})")
        ax.set_title(w)
        ax.set_xlabel("perturbation norm ||delta||")
        ax.set_ylabel("rework iterations")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    return out


def _at(row: dict[str, Any]) -> int | None:
    fail = str(row.get("fail") or "")
    if "@iter=" not in fail:
        return None
    return int(fail.split("@iter=")[1].split(",")[0])
