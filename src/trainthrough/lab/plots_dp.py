"""The data-parallel suite's scatter: accuracy loss against runtime overhead.

One panel per workload; color is the recovery strategy, the marker the elastic
policy, hollow markers one failure and filled ones three. Object API only (no pyplot
state), like lab/plots.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainthrough.lab.plots import DPI, strategy_colors

_MARKERS = {"keep-global": "o", "keep-local": "s"}


def plot_tradeoff(measures: list[dict[str, Any]], out: Path) -> Path:
    """Write the scatter to ``out`` (PNG) and return it."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    workloads = list(dict.fromkeys(m["workload"] for m in measures)) or ["(none)"]
    fig = Figure(figsize=(5.0 * len(workloads), 4.3))
    colors = strategy_colors(["checkpoint-restart", "rollback", "lossy-forward"])
    for i, w in enumerate(workloads):
        ax = fig.add_subplot(1, len(workloads), i + 1)
        for m in (m for m in measures if m["workload"] == w and m["acc_loss"] is not None):
            color = colors.get(m["preset"], "0.3")
            marker = "D" if m["preset"] == "checkpoint-restart" else _MARKERS.get(m["elastic"], "o")
            ax.scatter(m["overhead_pct"], m["acc_loss"], s=26, marker=marker, alpha=0.75,
                       edgecolors=color, linewidths=1.2,
                       facecolors=color if m["failures_planned"] > 1 else "none")
        ax.axhline(0.0, color="0.6", lw=0.8)
        ax.set_title(w)
        ax.set_xlabel("runtime overhead vs failure-free (%)")
        ax.set_ylabel("accuracy loss vs failure-free (points)")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=c, marker="D" if s == "checkpoint-restart" else "o", ls="",
                      label=s) for s, c in colors.items()]
    handles += [Line2D([], [], color="0.3", marker=mk, ls="", mfc="none", label=e)
                for e, mk in _MARKERS.items()]
    handles += [Line2D([], [], color="0.3", marker="o", ls="", mfc="none", label="1 failure"),
                Line2D([], [], color="0.3", marker="o", ls="", label="3 failures")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out
