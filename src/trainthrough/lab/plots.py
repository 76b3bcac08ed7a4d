"""Suite plots (PNG): metric curves per failure scenario, and rework bars per strategy.

Figures are built with the object API (``matplotlib.figure.Figure``), never pyplot's
global state, so plotting from a worker thread or a long-lived process leaks nothing.
Colors are keyed by strategy name (:func:`strategy_colors`) so one strategy looks the
same in every plot of every report.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

# Headless by default; but never switch the backend under a session that already
# imported pyplot (switching closes its open figures).
if "matplotlib.pyplot" not in sys.modules:
    matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from trainthrough.lab.recorder import complete, read_jsonl_tolerant  # noqa: E402

FIGSIZE = (8.0, 4.5)
DPI = 110
_X_LABELS = {"iteration": "iteration (executed)", "sim_seconds": "simulated seconds",
             "wall_seconds": "wall-clock seconds"}
# Presets always get the same color, whatever else a suite contains; other names
# (compositions, hybrids) take the extra colors in order of first appearance.
_PRESET_COLORS = {
    "checkpoint-restart": "#1f77b4", "scar-partial": "#ff7f0e", "scar": "#d62728",
    "chain-sync": "#2ca02c", "chain-async": "#bcbd22", "stateless": "#9467bd",
    "rollback": "#8c564b", "lossy-forward": "#e377c2", "none": "#7f7f7f",
}
_EXTRA_COLORS = ("#17becf", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e",
                 "#e6ab02", "#a6761d")
_FAIL_COLOR = "0.1"  # not gray: gray is the "none" strategy
_SUBST = {"@": "at", "%": "pct", "=": "-", ",": "_", "/": "_", ":": "_", " ": "_"}


def strategy_colors(strategies: Iterable[str]) -> dict[str, str]:
    """One color per strategy name, stable across plots (presets fixed, others in order)."""
    colors: dict[str, str] = {}
    extra = 0
    for s in strategies:
        if s not in colors:
            if s in _PRESET_COLORS:
                colors[s] = _PRESET_COLORS[s]
            else:
                colors[s] = _EXTRA_COLORS[extra % len(_EXTRA_COLORS)]
                extra += 1
    return colors


def safe_name(text: str, limit: int = 60) -> str:
    """A file-name-safe form of ``text``; a short hash is added whenever the mapping
    lost information, so two different specs never share a file."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", "".join(_SUBST.get(c, c) for c in text)).strip("._-")
    if s == text and len(s) <= limit:
        return s
    return f"{s[:limit] or 'x'}-{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def curves_filename(workload: str, fail: str | None, x: str = "iteration") -> str:
    """The PNG name :func:`plot_metric_curves` uses for one (workload, fail) group."""
    suffix = "" if x == "iteration" else f"-{x}"
    return f"curves-{safe_name(str(workload))}-{safe_name(fail or 'no-failures')}{suffix}.png"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _pick_run(suite_dir: Path, runs: list[dict[str, Any]]
              ) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The run to draw for one strategy: the median-rework seed among the complete runs
    (a folder without summary.json is half a run), or the lowest seed when none
    reached the target."""
    have = [(r, m) for r in runs
            if complete(folder := suite_dir / "runs" / str(r.get("run_id")))
            and (m := read_jsonl_tolerant(folder / "metrics.jsonl"))]
    reworked = sorted((p for p in have if _num(p[0].get("rework_iterations")) is not None),
                      key=lambda p: (p[0]["rework_iterations"], str(p[0].get("seed"))))
    if reworked:
        return reworked[(len(reworked) - 1) // 2]
    return min(have, key=lambda p: str(p[0].get("seed")), default=None)


def _wrap(text: str, width: int = 70) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def plot_metric_curves(suite_dir: Path, rows: Sequence[dict[str, Any]], out: Path,
                       x: str = "iteration") -> list[Path]:
    """One PNG per (workload, fail): the metric of each strategy against ``x``.

    Failures are dashed vertical lines (gray when every strategy failed at the same
    place, else in the strategy's color), recoveries hollow markers on the curve, the
    target a dotted horizontal line. Runs whose folder or metrics file is missing are
    skipped; a group with nothing to draw writes no file.

    Args:
        suite_dir: the suite folder (holds ``runs/<run_id>/``).
        rows: rows of ``results.csv`` as parsed by ``report.load_results``.
        out: folder to write into (created).
        x: ``iteration``, ``sim_seconds`` or ``wall_seconds``.

    Returns:
        The PNG files written, in order of first appearance of their group.
    """
    if x not in _X_LABELS:
        raise ValueError(f"x must be one of {', '.join(_X_LABELS)}, not {x!r}")
    out.mkdir(parents=True, exist_ok=True)
    colors = strategy_colors(str(r.get("strategy")) for r in rows)
    groups: dict[tuple[Any, Any], dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        groups.setdefault((r.get("workload"), r.get("fail")), {}).setdefault(
            str(r.get("strategy")), []).append(r)
    written: list[Path] = []
    for (workload, fail), by_strategy in groups.items():
        fig = Figure(figsize=FIGSIZE, dpi=DPI)
        ax = fig.add_subplot()
        fail_x: dict[float, set[str]] = {}
        drawn: set[str] = set()
        for strategy, runs in by_strategy.items():
            picked = _pick_run(suite_dir, runs)
            if picked is None:
                continue
            run, metrics = picked
            pts = sorted((float(m[x]), float(m["metric"]), float(m.get("iteration", 0)))
                         for m in metrics if _num(m.get(x)) is not None
                         and _num(m.get("metric")) is not None)
            if not pts:
                continue
            xs, ys, its = (np.array(v) for v in zip(*pts, strict=True))
            c = colors[strategy]
            ax.plot(xs, ys, color=c, lw=1.6, label=f"{strategy} (seed {run.get('seed')})")
            drawn.add(strategy)
            events = read_jsonl_tolerant(suite_dir / "runs" / str(run["run_id"]) / "events.jsonl")
            for ev in events or []:
                ex = _event_x(ev, x, its, xs)
                if ex is None:
                    continue
                if ev.get("type") == "failure":
                    fail_x.setdefault(round(ex, 9), set()).add(strategy)
                elif ev.get("type") == "recovery":
                    ax.plot([ex], [np.interp(ex, xs, ys)], ls="", marker="o", ms=6,
                            mfc="white", mec=c, mew=1.5, zorder=3)
        if not drawn:
            continue
        for fx, who in fail_x.items():
            for s in (["*"] if who >= drawn else sorted(who)):
                ax.axvline(fx, color=_FAIL_COLOR if s == "*" else colors[s], ls="--", lw=0.9,
                           alpha=0.6, zorder=1)
        first = next(iter(by_strategy.values()))[0]
        target = _num(first.get("target"))
        if target is not None:
            ax.axhline(target, color="black", ls=":", lw=1.1, label=f"target {target:g}")
        handles, _ = ax.get_legend_handles_labels()
        handles += [Line2D([], [], color=_FAIL_COLOR, ls="--", lw=0.9, alpha=0.6, label="failure"),
                    Line2D([], [], ls="", marker="o", mfc="white", mec="0.3", label="recovery")]
        metric = str(first.get("metric_name") or "metric")
        better = {"max": " (higher is better)", "min": " (lower is better)"}.get(
            str(first.get("direction")), "")
        lo, hi = ax.dataLim.y0, ax.dataLim.y1
        if first.get("direction") == "min" and lo > 0 and hi / lo > 10:
            ax.set_yscale("log")  # losses fall over decades: the tail near target matters
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(_minor_tick))
        ax.set_xlabel(_X_LABELS[x])
        ax.set_ylabel(metric + better)
        ax.set_title(_wrap(f"{workload} — failures: {fail or 'none'}"), fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(handles=handles, fontsize=8, loc="best", framealpha=0.9)
        fig.tight_layout()
        path = out / curves_filename(str(workload), fail, x)
        fig.savefig(path, format="png")
        written.append(path)
    return written


def _minor_tick(v: float, _pos: int) -> str:
    """Label the 2, 3 and 5 of each decade on a log axis, plainly (0.3, not 3e-01)."""
    return f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 3, 5) else ""


def _event_x(ev: dict[str, Any], x: str, its: np.ndarray, xs: np.ndarray) -> float | None:
    """Where an event sits on the x axis: its own field, else interpolated from its
    iteration through the metric records (events carry no wall time)."""
    if (v := _num(ev.get(x))) is not None:
        return v
    it = _num(ev.get("iteration", ev.get("at_iteration")))
    return None if it is None else float(np.interp(it, its, xs))


def plot_rework_bars(summary_rows: Sequence[dict[str, Any]], out: Path,
                     baseline_strategy: str = "checkpoint-restart") -> Path:
    """Grouped bars of mean rework iterations (± sd): one group per (workload, fail),
    one bar per strategy, labelled with the change in rework vs ``baseline_strategy``.

    Args:
        summary_rows: rows from ``report.summarize``.
        out: the PNG to write, or a folder (then ``rework.png`` in it).
        baseline_strategy: the strategy the labels compare against.

    Returns:
        The PNG written.
    """
    path = out if out.suffix.lower() == ".png" else out / "rework.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = list(dict.fromkeys((r.get("workload"), r.get("fail")) for r in summary_rows))
    # One bar series per value of the group keys other than workload/fail (the keys
    # are the fields summarize() puts before ``n``): usually just the strategy.
    cells: dict[tuple[Any, str], dict[str, Any]] = {}
    for r in summary_rows:
        keys = list(r)[:list(r).index("n")] if "n" in r else ["strategy"]
        label = " ".join(str(r.get(k)) for k in keys if k not in ("workload", "fail"))
        cells[((r.get("workload"), r.get("fail")), label)] = r
    series = list(dict.fromkeys(s for _, s in cells))
    colors = strategy_colors(series)
    fig = Figure(figsize=(max(FIGSIZE[0], 1.3 * len(groups)), FIGSIZE[1]), dpi=DPI)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(series))
    for j, s in enumerate(series):
        for i, g in enumerate(groups):
            row = cells.get((g, s))
            if row is None:
                continue
            xpos = i - 0.4 + width * (j + 0.5)
            # sd is None for a single run: then no error bar rather than a fake 0
            mean, sd = _num(row.get("rework_mean")), _num(row.get("rework_sd"))
            if mean is None:
                ax.text(xpos, 0, "not converged", rotation=90, ha="center", va="bottom",
                        fontsize=7, color=colors[s])
                continue
            ax.bar(xpos, mean, width * 0.9, yerr=sd, color=colors[s], capsize=3,
                   error_kw={"lw": 1, "ecolor": "0.25"})
            red = _num(row.get("reduction_vs_baseline"))
            if row.get("strategy") != baseline_strategy and red is not None:
                arrow = "↓" if red >= 0 else "↑"
                ax.annotate(f"{arrow}{abs(red):.0%}", (xpos, max(mean, 0) + (sd or 0.0)),
                            xytext=(0, 2), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8)
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{w}\n" + "\n".join(textwrap.wrap(str(f or "no failures"), 22))
                        for w, f in groups], fontsize=8)
    ax.set_xlim(-0.6, max(len(groups), 1) - 0.4)
    ax.set_ylabel("rework iterations (mean ± sd)")
    ax.set_title(f"Extra iterations to target vs failure-free; labels: change vs "
                 f"{baseline_strategy}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)
    if series:
        ax.legend(handles=[Patch(color=colors[s], label=s) for s in series],
                  fontsize=8, loc="best", framealpha=0.9)
    else:
        ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
