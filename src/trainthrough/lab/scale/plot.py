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


_MARKERS = "osD^v<>ph*"


def plot_goodput(sizes: list[int], goodput: dict[str, list[float]],
                 hours: dict[str, list[float]], crossings: list[Crossover], out: Path) -> Path:
    """Write the three panels to ``out`` (PNG) and return it: goodput, the time lost on
    a log scale (where lines near 100% goodput come apart) and the time to train."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15.0, 4.8))
    colors = strategy_colors(goodput)
    good, lost, time = (fig.add_subplot(1, 3, i) for i in (1, 2, 3))
    for i, (name, ys) in enumerate(goodput.items()):
        style = dict(ls="--" if "/" in name else "-", marker=_MARKERS[i % len(_MARKERS)], ms=4,
                     color=colors[name], alpha=0.85)
        good.plot(sizes, [100 * y for y in ys], label=name, **style)  # type: ignore[arg-type]
        lost.plot(sizes, [max(1e-4, 100 * (1 - y)) for y in ys], **style)  # type: ignore[arg-type]
        time.plot(sizes, hours[name], **style)  # type: ignore[arg-type]
    for c in crossings:
        good.plot([c.size], [100 * c.goodput], marker="X", ms=11, color="black", zorder=5)
        good.annotate(f"{c.ahead}\novertakes {c.behind}", (c.size, 100 * c.goodput),
                      textcoords="offset points", xytext=(6, -24), fontsize=7)
        lost.axvline(c.size, color="black", ls=":", lw=1)
    for ax in (good, lost, time):
        ax.set_xscale("log")
        ax.set_xlabel("accelerators")
        ax.grid(alpha=0.3, which="both")
    lost.set_yscale("log")
    good.set_ylabel("goodput: effective training time (%)")
    good.set_title("goodput (X: a crossover)")
    lost.set_ylabel("time lost: 100% - goodput (%)")
    lost.set_title("time lost to failures and their cost")
    time.set_ylabel("hours to train the steps")
    time.set_title("time to train")
    fig.legend(loc="lower center", ncol=5, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out
