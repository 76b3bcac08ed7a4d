"""A suite's ``results.csv``: its rows, read back, and their summary per group.

:func:`load_results` reads the table :mod:`trainthrough.lab.suite` writes, one row per
run; :func:`summarize` aggregates the rows per group (by default per workload, failure
spec and strategy): run counts, mean rework and its spread, the reduction of rework
against a baseline strategy, and the means of the costs. Both are pure (no plotting, no
formatting): :mod:`trainthrough.lab.tables` formats a summary, and
:mod:`trainthrough.lab.report` writes the report.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainthrough.errors import UserError
from trainthrough.lab.intervals import add_intervals

_TEXT = frozenset({"run_id", "workload", "strategy", "fail", "metric_name", "direction",
                   "engine", "spec"})
#: Columns whose mean over a group's runs the summary holds, as ``<column>_mean``.
MEANS = ("checkpoint_bytes", "checkpoint_blocked_seconds", "recovery_seconds",
         "perturbation_norm", "rework_bound", "updates_lost", "sim_seconds", "wall_seconds")
#: The fields :func:`summarize` computes (the others in a summary row are its group keys).
STAT_FIELDS = frozenset({"n", "converged", "rework_n", "rework_mean", "rework_sd",
                         "reduction_vs_baseline", "rework_lo", "rework_hi", "reduction_lo",
                         "reduction_hi", "reduction_pairs", *(f"{c}_mean" for c in MEANS)})


def _parse(key: str, cell: str | None) -> Any:
    s = (cell or "").strip()
    if not s:
        return None
    if key in _TEXT:  # "none" is a strategy name and "0001" a run id: keep text as is
        return s
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    if s.lower() in ("none", "null", "nan"):
        return None
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def load_results(suite_dir: Path) -> list[dict[str, Any]]:
    """Rows of ``suite_dir/results.csv``, numbers and booleans parsed, empty cells None.

    Raises:
        UserError: the file is missing or unreadable.
    """
    path = Path(suite_dir) / "results.csv"
    try:
        with open(path, newline="") as f:
            return [{k: _parse(k, v) for k, v in row.items() if k} for row in csv.DictReader(f)]
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} ({e}); point at a suite folder written by "
                        "`trainthrough compare`") from e


def finite(v: Any) -> float | None:
    """``v`` as a float if it is a finite number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def summarize(rows: Sequence[dict[str, Any]], by: Sequence[str] = ("workload", "fail", "strategy"),
              baseline_strategy: str = "checkpoint-restart",
              intervals: bool = False) -> list[dict[str, Any]]:
    """Aggregate runs per group (groups in order of first appearance).

    Each result holds the ``by`` keys, ``n``, ``converged`` (count), ``rework_n``,
    ``rework_mean`` and ``rework_sd`` (sample sd, None under two values; over runs
    whose rework is defined), ``reduction_vs_baseline`` (``1 - rework_mean /
    rework_mean`` of ``baseline_strategy`` in the group with the same other keys;
    None if absent, undefined or its mean <= 0) and ``<column>_mean`` for
    checkpoint bytes/blocking, recovery seconds, perturbation norm, rework bound,
    updates lost, sim and wall seconds (None where no run has a value).

    With ``intervals``, 95% intervals of the mean rework and of the reduction (paired
    by seed; the reduction is then computed over the paired seeds): see
    :func:`trainthrough.lab.intervals.add_intervals`.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    out: list[dict[str, Any]] = []
    for key, members in groups.items():
        rework = [v for r in members if (v := finite(r.get("rework_iterations"))) is not None]
        s: dict[str, Any] = dict(zip(by, key, strict=True))
        s.update(n=len(members), converged=sum(r.get("converged") is True for r in members),
                 rework_n=len(rework), rework_mean=_mean(rework),
                 rework_sd=statistics.stdev(rework) if len(rework) > 1 else None,
                 reduction_vs_baseline=None)
        for c in MEANS:
            s[f"{c}_mean"] = _mean([v for r in members if (v := finite(r.get(c))) is not None])
        out.append(s)
    if "strategy" in by:
        i = list(by).index("strategy")
        base = {k[:i] + k[i + 1:]: s["rework_mean"] for k, s in zip(groups, out, strict=True)
                if k[i] == baseline_strategy}
        for k, s in zip(groups, out, strict=True):
            b, m = base.get(k[:i] + k[i + 1:]), s["rework_mean"]
            if b is not None and b > 0 and m is not None:
                s["reduction_vs_baseline"] = 1.0 - m / b
    if intervals:
        add_intervals(out, list(groups.values()), by, baseline_strategy)
    return out
