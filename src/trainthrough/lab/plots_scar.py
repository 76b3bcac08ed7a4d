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


def _bar(est: float | None, lo: float | None, hi: float | None) -> tuple[float, float] | None:
    """Error bar lengths below and above ``est``; None when unbounded or missing."""
    if est is None or lo is None or hi is None:
        return None
    return est - lo, hi - est


def plot_reductions(summary: list[dict[str, Any]], out: Path, baseline: str,
                    headline: float) -> Path:
    """Two rows of panels, one column per workload, x = fraction of shards lost: mean
    rework with its 95% interval per strategy, and the reduction vs ``baseline`` with
    its interval (summary rows of ``report.summarize(..., intervals=True)``).

    An unbounded interval is drawn as the point alone, marked with an open circle.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    workloads = list(dict.fromkeys(r["workload"] for r in summary))
    fractions = list(dict.fromkeys(r["fraction"] for r in summary))
    strategies = list(dict.fromkeys(r["strategy"] for r in summary))
    colors = strategy_colors(strategies)
    fig = Figure(figsize=(4.2 * max(1, len(workloads)), 7.0), dpi=DPI)
    axes = fig.subplots(2, max(1, len(workloads)), squeeze=False)
    width = 0.8 / max(1, len(strategies))
    labelled: set[tuple[int, str]] = set()  # (row of panels, strategy) in the legends
    for col, w in enumerate(workloads):
        top, bottom = axes[0][col], axes[1][col]
        for j, s in enumerate(strategies):
            for i, f in enumerate(fractions):
                row = next((r for r in summary if r["workload"] == w and r["fraction"] == f
                            and r["strategy"] == s), None)
                if row is None:
                    continue
                x = i - 0.4 + width * (j + 0.5)
                for k, (ax, est, lo, hi, scale) in enumerate((
                        (top, row.get("rework_mean"), row.get("rework_lo"),
                         row.get("rework_hi"), 1.0),
                        (bottom, row.get("reduction_vs_baseline"), row.get("reduction_lo"),
                         row.get("reduction_hi"), 100.0))):
                    if est is None or (ax is bottom and s == baseline):
                        continue
                    bar = _bar(est, lo, hi)
                    first = col == 0 and (k, s) not in labelled
                    labelled.add((k, s))
                    ax.errorbar([x], [scale * est],
                                yerr=None if bar is None else [[scale * bar[0]],
                                                               [scale * bar[1]]],
                                fmt="o", ms=5, capsize=3, color=colors[s],
                                mfc=colors[s] if bar is not None else "white",
                                label=s if first else None)
        for ax in (top, bottom):
            ax.set_xticks(range(len(fractions)))
            ax.set_xticklabels([f"{f} lost" for f in fractions])
            ax.grid(axis="y", alpha=0.3)
        bottom.axhline(100 * headline, color="k", ls="--", lw=1,
                       label=f"SCAR's headline, {headline:.0%}" if col == 0 else None)
        bottom.axhline(0, color="0.5", lw=0.8)
        top.axhline(0, color="0.5", lw=0.8)
        top.set_title(w)
        top.set_ylabel("rework iterations (mean, 95% CI)")
        bottom.set_ylabel(f"reduction vs {baseline} % (95% CI)")
        lo_y, hi_y = bottom.get_ylim()
        if lo_y < -100 or hi_y > 150:  # a noisy cell's interval would flatten the rest
            bottom.set_ylim(max(lo_y, -100), min(hi_y, 150))
            bottom.set_title("(axis clipped to -100..150%)", fontsize=8)
    if workloads:
        axes[0][0].legend(fontsize=7, loc="best", framealpha=0.9)
        axes[1][0].legend(fontsize=7, loc="lower left", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(out)
    return out
