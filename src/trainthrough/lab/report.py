"""The suite report: ``results.csv`` -> ``report.md``, ``report.html`` and PNG plots.

:func:`write_report` writes, into the suite folder, the summary table (grouped as the
suite says, with the reduction of rework against a baseline), a plot of rework per
strategy, one plot of metric curves per workload and failure spec, the suite's own
sections and a table of every run. ``report.md`` is the source; ``report.html`` is the
same markdown as one self-contained page (:mod:`trainthrough.lab.report_html`). Both
are written atomically: a reader sees the old report or the new one.

The parts live apart: reading and summarizing the results in
:mod:`trainthrough.lab.results` (:func:`load_results`, :func:`summarize`), the tables in
:mod:`trainthrough.lab.tables` (:func:`headline_table`); they are importable from here
too, where the suite runner and the tests import them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainthrough._atomic import atomic_write
from trainthrough.lab.plots import curves_filename, plot_metric_curves, plot_rework_bars
from trainthrough.lab.recorder import complete
from trainthrough.lab.report_html import html_page
from trainthrough.lab.results import load_results, summarize
from trainthrough.lab.tables import Column, headline_table, md_cell, runs_md, summary_md

__all__ = ["headline_table", "load_results", "summarize", "write_report"]


def _auto_notes(suite_dir: Path, rows: list[dict[str, Any]], baseline: str) -> list[str]:
    notes = []
    if not rows:
        notes.append("results.csv holds no runs.")
    missing = [str(r.get("run_id")) for r in rows
               if not complete(suite_dir / "runs" / str(r.get("run_id")))]
    if missing:
        notes.append(f"{len(missing)} run folder(s) missing or incomplete (no summary.json), "
                     f"left out of the curves: {', '.join(missing)}.")
    # A run that reached its target has a rework wherever the suite has failure-free
    # twins (wall-clock suites have none, and no rework at all): count the runs that
    # did not reach it, not the runs without a rework.
    failed = sum(not r.get("converged") for r in rows)
    if failed:
        notes.append(f"{failed} of {len(rows)} runs did not reach the target; rework is "
                     "averaged over the runs that reached it.")
    if rows and not any(r.get("strategy") == baseline for r in rows):
        notes.append(f"no {baseline} runs: the reduction column is empty.")
    return notes


def write_report(suite_dir: Path, title: str, notes: list[str] | None = None,
                 extra_sections: list[tuple[str, str]] | None = None,
                 by: Sequence[str] = ("workload", "fail", "strategy"),
                 baseline_strategy: str = "checkpoint-restart",
                 intervals: bool = False, extra: Sequence[Column] = ()) -> dict[str, Path]:
    """Write ``report.md``, ``report.html`` and the PNG plots (under ``plots/``).

    Args:
        suite_dir: the suite folder (``results.csv``, ``runs/<run_id>/``).
        title: the report's title.
        notes: lines shown under the title (notes on missing runs are added).
        extra_sections: ``(heading, markdown body)`` pairs appended to the report.
        by, baseline_strategy, intervals: grouping, baseline and 95% intervals of the
            summary (see :func:`summarize`).
        extra: columns shown after the reduction (a published figure beside ours).

    Returns:
        ``{"markdown": ..., "html": ..., "rework": ..., "<png stem>": ...}``.

    Raises:
        UserError: ``results.csv`` is missing or unreadable.
    """
    suite_dir = Path(suite_dir)
    baseline = baseline_strategy
    rows = load_results(suite_dir)
    summary = summarize(rows, by=by, baseline_strategy=baseline, intervals=intervals)
    plots = suite_dir / "plots"
    bars = plot_rework_bars(summary, plots / "rework.png", baseline)
    curves = plot_metric_curves(suite_dir, rows, plots)
    md = [f"# {title}", ""]
    md += [f"- {n}" for n in [*(notes or []), *_auto_notes(suite_dir, rows, baseline)]]
    how = (f"mean and 95% t interval over runs that reached it). *Reduction vs {baseline}*: "
           f"1 − mean rework / mean rework of {baseline} under the same failures, over the "
           "seeds both reached the target with, and its 95% Fieller interval paired by seed "
           "(lab/intervals.py says why; *unbounded*: the baseline's own rework is not "
           "clearly above 0)" if intervals else
           f"mean ± sd over runs that reached it). *Reduction vs {baseline}*: "
           f"1 − mean rework / mean rework of {baseline} under the same failures")
    md += ["", "## Summary", "",
           "Rework: extra iterations to reach the target compared with the failure-free run "
           f"of the same seed ({how}.", "",
           summary_md(summary, baseline, extra), "", "## Plots", "",
           f"![rework iterations per strategy]({bars.relative_to(suite_dir).as_posix()})", ""]
    for workload, fail in dict.fromkeys((r.get("workload"), r.get("fail")) for r in rows):
        png = plots / curves_filename(str(workload), fail)
        if png in curves:
            md += [f"### {workload} — failures: {md_cell(str(fail or 'none'), True)}", "",
                   f"![{workload} {fail or 'none'}]({png.relative_to(suite_dir).as_posix()})", ""]
    for heading, body in extra_sections or []:
        md += [f"## {heading}", "", body.strip(), ""]
    if rows:
        md += ["## Runs", "", runs_md(rows), ""]
    text = "\n".join(md)
    written = {"markdown": suite_dir / "report.md", "html": suite_dir / "report.html"}
    atomic_write(written["markdown"], text, encoding="utf-8")
    atomic_write(written["html"], html_page(title, text, suite_dir), encoding="utf-8")
    written.update({p.stem: p for p in [bars, *curves]})
    return written
