"""The scale suite's picture: goodput against cluster size, one line per variant, the
crossovers marked; and the time to train beside it. Object API only, like lab/plots.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from trainthrough.lab.plots import DPI, strategy_colors

#: a goodput difference this small (0.1 point) is a tie, not a lead
TIE = 1e-3


@dataclass(frozen=True)
class Crossover:
    """Where ``ahead`` overtakes ``behind`` (goodput), between two sizes of the grid."""

    behind: str
    ahead: str
    size: float  #: the crossing, interpolated on log(size)
    goodput: float


def crossovers(sizes: list[int], a: str, b: str, ga: list[float], gb: list[float]
               ) -> list[Crossover]:
    """Each point where ``b - a`` changes sign between neighbouring sizes, by more than
    :data:`TIE` on one side at least (a smaller difference at both is noise: at 8
    accelerators most runs see no failure): the size and goodput where the lines meet."""
    out = []
    for i in range(len(sizes) - 1):
        d0, d1 = gb[i] - ga[i], gb[i + 1] - ga[i + 1]
        if d0 * d1 >= 0 or max(abs(d0), abs(d1)) <= TIE:
            continue
        t = d0 / (d0 - d1)
        x0, x1 = math.log(sizes[i]), math.log(sizes[i + 1])
        behind, ahead = (a, b) if d1 > 0 else (b, a)
        out.append(Crossover(behind, ahead, math.exp(x0 + t * (x1 - x0)),
                             ga[i] + t * (ga[i + 1] - ga[i])))
    return out


def plot_goodput(sizes: list[int], goodput: dict[str, list[float]],
                 hours: dict[str, list[float]], crossings: list[Crossover], out: Path) -> Path:
    """Write the two panels to ``out`` (PNG) and return it."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.0, 4.8))
    colors = strategy_colors(goodput)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, ys in goodput.items():
        style = "--" if "/" in name else "-"
        left.plot(sizes, [100 * y for y in ys], style, marker="o", ms=3, color=colors[name],
                  label=name)
        right.plot(sizes, hours[name], style, marker="o", ms=3, color=colors[name])
    for c in crossings:
        left.plot([c.size], [100 * c.goodput], marker="X", ms=10, color="black", zorder=5)
        left.annotate(f"{c.ahead} ahead\nof {c.behind}", (c.size, 100 * c.goodput),
                      textcoords="offset points", xytext=(6, -24), fontsize=7)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("accelerators")
        ax.grid(alpha=0.3, which="both")
    left.set_ylabel("goodput: effective training time (%)")
    left.set_title("goodput (X: a crossover)")
    right.set_ylabel("hours to train the steps")
    right.set_title("time to train")
    fig.legend(loc="lower center", ncol=5, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out
